"""The one error table: complete, invertible, and the only source of the
edge's problem types, titles and OpenAI error types."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import grpc
import pytest

import turnmesh.client as client_api
from turnmesh.client.errors import CLIENT_CLASSES, TurnmeshClientError, client_class
from turnmesh.envoy import EdgeConfig, edge_rows
from turnmesh.envoy.config import lua_error_table, render
from turnmesh.runtime import error_decoding, errors, turn_errors

ROOT = Path(__file__).resolve().parents[2]
# The folders of the turnmesh package (hand-written code).
PACKAGE_FOLDERS = (
    "server",
    "cli",
    "envoy",
    "agent",
    "worker",
    "runtime",
    "router",
    "client",
    "files",
)


def _error(kind: type[errors.TurnmeshError]) -> errors.TurnmeshError:
    if issubclass(kind, errors.InvalidArgument):
        return kind([errors.FieldViolation("a", "b")])
    if issubclass(kind, errors.HistoryMiss):
        return errors.HistoryMiss("s")
    return kind("detail", metadata={"param": "model"})


COMPAT_OR_MESH_ROWS = (
    errors.TurnCancelled,
    errors.TurnFailed,
    errors.ModelNotFound,
    errors.ItemNotFound,
    errors.PreviousResponseNotFound,
    errors.UnknownMember,
    errors.OwnerAway,
    errors.HeldElsewhere,
    # A2A's own errors: only its surface answers them.
    errors.InvalidParams,
    errors.ContentTypeNotSupported,
    errors.TaskNotFound,
    errors.TaskNotCancelable,
    errors.UnsupportedOperation,
    errors.PushNotificationNotSupported,
    errors.ExtendedAgentCardNotConfigured,
    errors.InvalidRequest,
    errors.MethodNotFound,
)


def test_every_status_code_has_a_row() -> None:
    codes = {row.code for row in errors.rows()}
    assert codes == set(grpc.StatusCode) - {grpc.StatusCode.OK}
    # One row per code, plus one per reason of its own; reasons are unique.
    reasons = [row.reason for row in errors.rows()]
    assert len(reasons) == len(set(reasons))
    assert {row.name for row in errors.rows()} >= {
        "RateLimited",
        "SessionBusy",
        "HistoryMiss",
        "IdempotencyKeyReused",
    }


@pytest.mark.parametrize("row", errors.rows(), ids=lambda r: r.name)
def test_a_status_turns_back_into_the_error_it_was(row: errors.Row) -> None:
    error = _error(errors.kind_for(row.code, row.reason))
    status = error.to_status()
    assert status.code == row.code
    back = error_decoding.from_status(status.code, status.details, status.trailing_metadata)
    assert type(back) is type(error)
    assert back.reason == row.reason
    assert back.detail == error.detail
    assert back.retry_after == error.retry_after
    if isinstance(error, errors.InvalidArgument):
        assert isinstance(back, errors.InvalidArgument)
        assert back.violations == error.violations
    assert back.metadata == error.metadata


def test_a_reason_without_a_row_keeps_its_code_row() -> None:
    # A newer server's reason, which this table does not know.
    error = errors.NotFound("no gadget", reason="GADGET_NOT_FOUND")
    status = error.to_status()
    back = error_decoding.from_status(status.code, status.details, status.trailing_metadata)
    assert type(back) is errors.NotFound
    assert back.reason == "GADGET_NOT_FOUND"
    # A reason of another code's row does not change the row.
    assert errors.kind_for(grpc.StatusCode.UNAVAILABLE, "SESSION_BUSY") is errors.Unavailable


def test_a_status_with_unreadable_details_keeps_its_code() -> None:
    back = error_decoding.from_status(
        grpc.StatusCode.ABORTED, "x", (("grpc-status-details-bin", b"\xff\xfe"),)
    )
    assert type(back) is errors.Aborted


def test_every_row_has_a_client_class_named_after_it() -> None:
    for row in errors.rows():
        kind = errors.kind_for(row.code, row.reason)
        cls = client_class(kind)
        if kind in CLIENT_CLASSES:
            # asyncio owns the name CancelledError.
            expected = {"Cancelled": "RequestCancelledError"}.get(
                kind.__name__, f"{kind.__name__}Error"
            )
            assert cls.__name__ == expected
        elif kind in COMPAT_OR_MESH_ROWS:
            # Only the compatibility surfaces answer these, or only members of
            # the mesh get them; a typed client that met one would see its
            # parent row's class.
            ancestor = next(k for k in kind.__mro__[1:] if k in CLIENT_CLASSES)
            assert cls is CLIENT_CLASSES[ancestor]
        else:  # INTERNAL, UNKNOWN, DATA_LOSS, and the worker's HISTORY_MISS
            assert cls in (TurnmeshClientError, CLIENT_CLASSES[errors.FailedPrecondition])
        assert cls.__name__ in client_api.__all__


def test_the_edge_renders_the_table_and_writes_no_slug_of_its_own() -> None:
    lua = (ROOT / "envoy" / "problem.lua").read_text()
    # problem.lua holds no problem type or title: they come from the table.
    assert "turnmesh.dev/problems" not in lua
    for row in errors.rows():
        assert f'"{row.slug}"' not in lua
    rendered = lua_error_table()
    for row in errors.rows():
        shown = (
            f'"{row.slug}", "{row.title}", "{row.openai_type}", {row.code.value[0]}, '
            f"{row.jsonrpc_code}"
        )
        assert f"{{{shown}}}" in rendered
    config = json.dumps(render(EdgeConfig(upstreams=["127.0.0.1:1"])))
    assert "__ERROR_TABLE__" not in config


def test_envoys_own_replies_use_the_table() -> None:
    config = render(EdgeConfig(upstreams=["127.0.0.1:1"]))
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    mappers = manager["typed_config"]["local_reply_config"]["mappers"]
    problems = {}
    for mapper in mappers:
        body = mapper["body_format_override"]["json_format"]
        if "type" in body:
            comparison = str(mapper["filter"]["and_filter"]["filters"][1])
            match = re.search(r"'op': 'EQ', 'value': \{'default_value': (\d+)", comparison)
            if match is not None:
                problems[int(match.group(1))] = (body["type"], body["title"])
    edge = edge_rows.edge_problems()
    for status, (slug, title, _) in edge.items():
        assert problems[status] == (errors.PROBLEM_BASE + slug, title)
    # Statuses a server can also send have the same type and title as the row.
    for row in errors.rows():
        if row.http_status in edge and errors.kind_for(row.code).__name__ == row.name:
            slug, title, _ = edge[row.http_status]
            if row.http_status not in (400, 409, 500):  # several rows share these
                assert (slug, title) == (row.slug, row.title)


def test_in_band_errors_are_problems_of_the_same_base() -> None:
    event = turn_errors.TurnError.WORKER_FAILED.event("it broke")
    assert event.code == "worker_failed"
    assert event.problem.type == errors.PROBLEM_BASE + "worker-failed"
    assert event.problem.status == 502
    assert event.message == "it broke"


def _error_classes() -> set[str]:
    return {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.TurnmeshError)
    }


def test_every_reason_raised_is_a_row() -> None:
    """A reason is a row of the table (a class), never a string passed to
    another row: so the edge, the docs and the client all know it."""
    classes = _error_classes()
    passed: list[str] = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "runtime" / "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name in classes and any(k.arg == "reason" for k in node.keywords):
                    passed.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}(reason=…)")
    assert not passed, passed
    # And the reasons the table's docstring names are its rows.
    documented = set(re.findall(r"reason ([A-Z_]+)", errors.__doc__ or ""))
    assert documented == {row.reason for row in errors.reason_rows()}
