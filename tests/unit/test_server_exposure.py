"""A session server names what leaves it open: the mesh's key (or mutual
TLS), the callers' API keys, or both."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from turnmesh.server import ServerConfig, SessionServer

ROUTER = "127.0.0.1:1"  # never called: only the start-up checks run


@pytest.mark.parametrize(
    ("settings", "named", "not_named"),
    [
        ({"mesh_key": "k" * 32}, "without API keys", "mesh key"),
        ({"api_keys": ["a" * 32]}, "without a mesh key or mutual TLS:", "API keys:"),
        ({}, "without a mesh key or mutual TLS and API keys", None),
    ],
)
def test_an_open_bind_is_refused_naming_what_is_missing(
    settings: dict[str, Any], named: str, not_named: str | None
) -> None:
    server = SessionServer(ServerConfig(router_address=ROUTER, host="0.0.0.0", **settings))
    with pytest.raises(SystemExit) as refused:
        server._secured()
    text = str(refused.value)
    assert named in text
    if not_named is not None:
        assert not_named not in text.split(":")[0]


def test_a_loopback_server_with_a_mesh_key_warns_of_its_missing_api_keys(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = SessionServer(ServerConfig(router_address=ROUTER, host="127.0.0.1", mesh_key="k" * 32))
    with caplog.at_level(logging.WARNING):
        server._secured()
    assert "API keys not configured" in caplog.text
    assert "mesh key" not in caplog.text
