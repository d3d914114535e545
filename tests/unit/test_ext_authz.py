"""The servers' answer to Envoy's key check: the interceptor's decision, the
server's 401, and the principal for the access log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.rpc import code_pb2

from turnmesh.runtime import ext_authz
from turnmesh.runtime.auth import ApiKeys
from turnmesh.runtime.errors import Unauthenticated

KEY = "tm-check-key-0123456789"


def _check(keys: ApiKeys, **headers: str) -> Any:
    request = ext_authz.CheckRequest()
    request.attributes.request.http.headers.update(headers)
    # What Envoy sends is what this decodes.
    return ext_authz.decide(keys, ext_authz.CheckRequest.FromString(request.SerializeToString()))


def test_a_good_key_is_allowed_with_its_principal(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text(f"acme\t{KEY}\n")
    response = _check(ApiKeys(file=str(file)), authorization=f"Bearer {KEY}")
    assert response.status.code == code_pb2.OK
    assert response.WhichOneof("http_response") == "ok_response"
    assert dict(response.dynamic_metadata) == {"principal": "acme"}
    assert not response.ok_response.headers  # nothing for the server to trust


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "an API key is required"),
        ({"authorization": "Bearer wrong"}, "a valid API key is required"),
        ({"authorization": KEY}, "an API key is required"),  # not a Bearer
        ({"x-api-key": KEY}, "an API key is required"),
    ],
)
def test_a_missing_or_wrong_key_gets_the_servers_401(headers: dict[str, str], detail: str) -> None:
    response = _check(ApiKeys([KEY]), **headers)
    assert response.status.code == code_pb2.UNAUTHENTICATED
    denied = response.denied_response
    assert denied.status.code == Unauthenticated.http_status == 401
    assert denied.body == detail
    assert [(h.header.key, h.header.value) for h in denied.headers] == list(
        Unauthenticated.trailers
    )
    assert not response.dynamic_metadata


def test_without_keys_everyone_is_anonymous() -> None:
    response = _check(ApiKeys(), authorization="Bearer anything")
    assert response.status.code == code_pb2.OK
    assert dict(response.dynamic_metadata) == {"principal": "anonymous"}


def test_the_descriptor_set_ships_in_the_package() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert (
        ext_authz.DESCRIPTOR_SET.name
        in project["tool"]["setuptools"]["package-data"]["turnmesh.v1"]
    )
    assert ext_authz.DESCRIPTOR_SET.parent == root / "gen" / "turnmesh" / "v1"
