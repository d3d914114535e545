"""The AReaL gateway's frames (server/compat/areal_ws/frames.py): what a
``req`` is read as, what each refusal says, and the frames written back."""

from __future__ import annotations

import json
import re

import pytest

from turnmesh.server.compat.areal_ws import frames


def req(**fields: object) -> str:
    return json.dumps({"type": "req", "id": "r1", "method": "agent", **fields})


def test_a_request_is_read_with_its_defaults() -> None:
    parsed = frames.parse(req(params={"message": "hi", "sessionKey": "s-1"}))
    assert parsed == frames.AgentRequest("r1", "hi", "s-1", "", followup=False)


@pytest.mark.parametrize(
    ("mode", "followup"), [("followup", True), ("collect", False), ("x", False), (None, False)]
)
def test_queue_mode_followup_enqueues_anything_else_collects(mode: object, followup: bool) -> None:
    params = {"message": "hi", "sessionKey": "s", "queueMode": mode}
    assert frames.parse(req(params=params)).followup is followup


def test_an_integer_id_is_answered_as_text() -> None:
    text = json.dumps(
        {"type": "req", "id": 7, "method": "agent", "params": {"message": "m", "sessionKey": "s"}}
    )
    assert frames.parse(text).id == "7"


@pytest.mark.parametrize(
    ("text", "request_id", "reason"),
    [
        ("{", "unknown", "frame is not JSON"),
        ('"req"', "unknown", "frame is not a JSON object"),
        (json.dumps({"type": "res", "id": "a"}), "a", "frame type must be 'req'"),
        (
            json.dumps({"type": "req", "id": True, "method": "agent"}),
            "unknown",
            "sessionKey is required",
        ),
        (json.dumps({"type": "req", "id": "x" * 257, "method": "agent"}), "unknown", "sessionKey"),
        (req(method="tools"), "r1", "unknown method 'tools'"),
        (req(method={"a": 1}), "r1", "unknown method"),
        (req(params={"message": "hi"}), "r1", "sessionKey is required"),
        (req(params={"message": "hi", "sessionKey": 5}), "r1", "sessionKey must be"),
        (req(params={"message": "hi", "sessionKey": "a b"}), "r1", "sessionKey must be"),
        (req(params={"sessionKey": "s"}), "r1", "message: required"),
        (req(params={"sessionKey": "s", "message": ["x"]}), "r1", "message must be a string"),
        (
            req(params={"sessionKey": "s", "message": "m", "idempotencyKey": 3}),
            "r1",
            "idempotencyKey",
        ),
        (
            req(params={"sessionKey": "s", "message": "m", "idempotencyKey": "k" * 257}),
            "r1",
            "idempotencyKey",
        ),
        (req(params="x"), "r1", "params must be an object"),
        ('{"type": "req", "id": "\\udc00", "method": "x"}', "unknown", "unknown method"),
        ("[" * 33 + "]" * 33, "unknown", "nested deeper than 32 levels"),
    ],
)
def test_bad_frames_name_their_reason(text: str, request_id: str, reason: str) -> None:
    with pytest.raises(frames.FrameError) as refused:
        frames.parse(text)
    assert refused.value.request_id == request_id
    assert reason in refused.value.reason


def test_depth_counts_brackets_outside_strings_only() -> None:
    deep_text = "[" * 40 + "]" * 40
    message = json.dumps(deep_text)
    assert frames.parse(req(params={"message": message, "sessionKey": "s"})).message == message
    # At the limit: read, and refused only for what it is (not an object).
    with pytest.raises(frames.FrameError, match="not a JSON object"):
        frames.parse("[" * 32 + "]" * 32)


def test_run_ids_have_the_seeds_form_and_follow_the_turn() -> None:
    run = frames.run_id("turn-1")
    assert re.fullmatch(r"run-[0-9a-f]{12}", run)
    assert run == frames.run_id("turn-1") != frames.run_id("turn-2")


def test_answers_have_the_seeds_shapes() -> None:
    assert json.loads(frames.accepted("r1", "run-1")) == {
        "type": "res",
        "id": "r1",
        "ok": True,
        "payload": {"runId": "run-1", "status": "accepted"},
    }
    assert json.loads(frames.complete("r1", "run-1", ""))["payload"] == {
        "runId": "run-1",
        "status": "complete",
    }
    assert json.loads(frames.complete("r1", "run-1", "42"))["payload"]["summary"] == "42"
    assert json.loads(frames.failed("r1", "no", code="SESSION_BUSY")) == {
        "type": "res",
        "id": "r1",
        "ok": False,
        "payload": {"status": "failed", "error": "no", "code": "SESSION_BUSY"},
    }
    assert json.loads(frames.delta("run-1", "te")) == {
        "type": "event",
        "event": "agent",
        "payload": {"runId": "run-1", "delta": "te"},
    }
    assert json.loads(frames.tool_call("run-1", "calc", '{"a":1}'))["payload"]["toolCall"] == {
        "name": "calc",
        "args": '{"a":1}',
    }
