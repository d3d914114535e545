"""The edge's A2A paths (where its own replies take A2A's error shape) are
every HTTP rule of the pinned A2AService, bare and under an agent, and no
path of the mesh's other APIs."""

from __future__ import annotations

import re

from a2a.types import a2a_pb2
from google.api import annotations_pb2

from turnmesh.envoy import a2a_replies, edge_rows
from turnmesh.runtime import errors


def _regexes() -> list[str]:
    filters = a2a_replies.a2a_paths()["or_filter"]["filters"]
    return [f["header_filter"]["header"]["string_match"]["safe_regex"]["regex"] for f in filters]


def _matches(path: str) -> bool:
    return any(re.search(r, path) for r in _regexes())


def _rule_paths() -> list[str]:
    paths = []
    for method in a2a_pb2.DESCRIPTOR.services_by_name["A2AService"].methods:
        rule = method.GetOptions().Extensions[annotations_pb2.http]
        for binding in (rule, *rule.additional_bindings):
            pattern = getattr(binding, binding.WhichOneof("pattern"))
            paths.append(re.sub(r"\{[^}]*\}", "some-value", pattern))
    return paths


def test_every_a2a_rule_is_an_a2a_path() -> None:
    paths = _rule_paths()
    assert len(paths) == 22
    for path in paths:
        assert _matches(path), path
        assert _matches(path + "?historyLength=1"), path
    assert _matches("/demo/.well-known/agent-card.json")


def test_the_other_apis_paths_are_not() -> None:
    for path in (
        "/v1/sessions",
        "/v1/sessions/s/turns",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/agui",
        "/health",
        "/ready",
        "/v1/sessions/s/tasks/x",
        "/demo/message:sendx",
    ):
        assert not _matches(path), path


def test_every_edge_status_has_an_a2a_error() -> None:
    shaped = edge_rows.edge_a2a_errors()
    assert set(shaped) == set(edge_rows.edge_problems())
    assert shaped[404] == ("NOT_FOUND", "METHOD_NOT_FOUND", errors.A2A_DOMAIN)
    assert shaped[413] == ("INVALID_ARGUMENT", "INVALID_REQUEST", errors.A2A_DOMAIN)
    assert shaped[401] == ("UNAUTHENTICATED", "UNAUTHENTICATED", errors.ERROR_DOMAIN)
