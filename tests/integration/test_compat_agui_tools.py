"""Runs that wait for the client on /v1/agui, with the real AG-UI client
(@ag-ui/client 1.0.0 on Node.js): a frontend tool's call and its result, an
approval granted and one denied, a question, a stateless client that seeds
a new thread, and the wrong answers refused in the surface's error shape."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SharedMesh
from turnmesh.client import AsyncClient

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "agui"
QUESTION_SCHEMA = {
    "type": "object",
    "properties": {"color": {"type": "string"}},
    "required": ["color"],
}


def _node(script: str, *args: str, stdin: Any = None) -> tuple[dict[str, Any], str]:
    node = shutil.which("node")
    assert node, "node is installed by `make install` (system-deps)"
    result = subprocess.run(
        [node, script, *args],
        cwd=CLIENT_DIR,
        input=None if stdin is None else json.dumps(stdin),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def _url(mesh: SharedMesh) -> str:
    return f"http://{mesh.edge}/v1/agui"


def _one_run(mesh: SharedMesh, **run_input: Any) -> dict[str, Any]:
    """One run from a fresh client; its single run's record, or its error."""
    output, stderr = _node("run-input.mjs", _url(mesh), stdin={"runId": "r", **run_input})
    if "error" in output:
        return {"error": output["error"]}
    # The client validated every event without stripping anything.
    assert "warn" not in stderr.lower(), stderr
    run: dict[str, Any] = output["runs"][0]
    return run


def _refused(run: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The status and problem body of a run the server refused (the client
    rejects it with "HTTP <status>: <body>")."""
    assert "error" in run, run
    found = re.fullmatch(r"HTTP (\d+): (.*)", run["error"], re.DOTALL)
    assert found, run["error"]
    return int(found[1]), json.loads(found[2])


def _types(run: dict[str, Any]) -> list[str]:
    return [e["type"] for e in run["events"]]


def _finished(run: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = run["events"][-1]
    assert event["type"] == "RUN_FINISHED"
    return event


def _text(run: dict[str, Any]) -> str:
    return "".join(e["delta"] for e in run["events"] if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_a_frontend_tool_call_ends_the_run_and_its_tool_message_answers_it(
    shared_mesh: SharedMesh,
) -> None:
    output, stderr = _node("tool-loop.mjs", _url(shared_mesh), "agui-tools-1", "booked: table 4")
    assert "error" not in output, output
    assert "warn" not in stderr.lower(), stderr
    first, second = output["runs"]
    assert _types(first)[:4] == [
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
    ]
    start = first["events"][1]
    assert start["toolCallName"] == "confirm_booking"
    call_id = start["toolCallId"]
    assert json.loads(first["events"][2]["delta"]) == {
        "input": "Please confirm_booking: two at 8pm"
    }
    # AG-UI's success outcome naming the call the app must answer.
    assert _finished(first)["outcome"] == {"type": "success", "pendingToolCallIds": [call_id]}
    assert first["finished"] == {
        "outcome": "success",
        "pendingToolCallIds": [call_id],
        "interrupts": None,
    }
    assert first["newMessages"][0]["toolCalls"][0]["id"] == call_id

    assert 'Your confirm_booking returned: "booked: table 4"' in _text(second)
    assert "outcome" not in _finished(second)
    assert second["finished"]["pendingToolCallIds"] == []
    roles = [m["role"] for m in output["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]


async def test_the_thread_records_the_call_and_its_result(
    shared_mesh: SharedMesh, client: AsyncClient
) -> None:
    _node("tool-loop.mjs", _url(shared_mesh), "agui-tools-2", "done")
    history = await client.history("agui-tools-2")
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1].tool_calls[0].function.name == "confirm_booking"
    assert (history[2].tool_call_id, history[2].content) == (history[1].tool_calls[0].id, "done")
    assert not (await client.get_session("agui-tools-2")).HasField("pause")


DENIED = "You did not approve calculator, so I did not run it."


@pytest.mark.parametrize(
    ("thread", "status", "payload", "said", "result"),
    [
        ("agui-approve", "resolved", {"approved": True}, "Approved: calculator returned 42.", "42"),
        ("agui-deny", "resolved", {"approved": False}, DENIED, "error: not approved"),
        # Abandoned: a denial.
        ("agui-cancel", "cancelled", None, DENIED, "error: not approved"),
    ],
)
def test_an_approval_interrupts_the_run_and_resume_answers_it(
    shared_mesh: SharedMesh,
    thread: str,
    status: str,
    payload: dict[str, bool] | None,
    said: str,
    result: str,
) -> None:
    output, stderr = _node(
        "interrupt.mjs",
        _url(shared_mesh),
        thread,
        "what is 6*7 with approval",
        status,
        json.dumps(payload),
    )
    assert "error" not in output, output
    assert "warn" not in stderr.lower(), stderr
    first, second = output["runs"]
    start = next(e for e in first["events"] if e["type"] == "TOOL_CALL_START")
    assert start["toolCallName"] == "calculator"
    outcome = _finished(first)["outcome"]
    assert outcome["type"] == "interrupt"
    assert "pendingToolCallIds" not in outcome
    (interrupt,) = outcome["interrupts"]
    assert set(interrupt) == {"id", "reason", "message", "toolCallId", "expiresAt"}
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["toolCallId"] == start["toolCallId"]
    assert "calculator" in interrupt["message"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", interrupt["expiresAt"])
    expires = datetime.fromisoformat(interrupt["expiresAt"])
    assert expires > datetime.now(UTC)
    assert first["finished"]["outcome"] == "interrupt"
    assert output["pendingInterrupts"] == [interrupt]
    # The client refuses a run that leaves the interrupt unanswered.
    assert output["unresumed"] == (
        f"Thread has 1 pending interrupt(s) not addressed by resume: {interrupt['id']}"
    )

    assert said in _text(second)
    ran = next(e for e in second["events"] if e["type"] == "TOOL_CALL_RESULT")
    assert (ran["toolCallId"], ran["content"]) == (start["toolCallId"], result)
    assert "outcome" not in _finished(second)
    assert output["pendingAfter"] == []


def test_a_question_is_answered_with_a_resume_payload(shared_mesh: SharedMesh) -> None:
    output, stderr = _node(
        "interrupt.mjs", _url(shared_mesh), "agui-ask", "ask me", "resolved", '{"color":"green"}'
    )
    assert "error" not in output, output
    assert "warn" not in stderr.lower(), stderr
    first, second = output["runs"]
    assert "Which color do you like?" in _text(first)
    (interrupt,) = _finished(first)["outcome"]["interrupts"]
    assert interrupt["reason"] == "question"
    assert interrupt["responseSchema"] == QUESTION_SCHEMA
    assert "toolCallId" not in interrupt
    assert 'You answered: "green".' in _text(second)


def test_a_stateless_client_seeds_a_new_thread_with_its_tool_loop(
    shared_mesh: SharedMesh,
) -> None:
    call = {
        "id": "call-7",
        "type": "function",
        "function": {"name": "confirm_booking", "arguments": '{"input":"x"}'},
    }
    history = [
        {"id": "u1", "role": "user", "content": "confirm_booking please"},
        {"id": "a1", "role": "assistant", "toolCalls": [call]},
        {"id": "t1", "role": "tool", "toolCallId": "call-7", "content": "confirmed"},
    ]
    run = _one_run(shared_mesh, threadId="agui-seeded-1", messages=history)
    assert 'Your confirm_booking returned: "confirmed"' in _text(run)
    # A user message after the tool messages goes with them.
    said = {"id": "u2", "role": "user", "content": "thanks"}
    run = _one_run(shared_mesh, threadId="agui-seeded-2", messages=[*history, said])
    text = _text(run)
    assert 'Your confirm_booking returned: "confirmed"' in text
    assert 'You also said: "thanks"' in text


async def test_seeding_keeps_the_calls_with_their_tool_replies(
    shared_mesh: SharedMesh, client: AsyncClient
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    history = [
        {"id": "u1", "role": "user", "content": "look it up"},
        {"id": "a1", "role": "assistant", "toolCalls": [call]},
        {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "found"},
        {"id": "a2", "role": "assistant", "content": "It is found."},
        {"id": "u2", "role": "user", "content": "what did I ask first?"},
    ]
    run = _one_run(shared_mesh, threadId="agui-seeded-3", messages=history)
    assert "look it up" in _text(run)
    stored = await client.history("agui-seeded-3")
    assert [m.role for m in stored] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert stored[1].tool_calls[0].id == "c1"
    assert (stored[2].tool_call_id, stored[2].content) == ("c1", "found")


def test_wrong_answers_are_refused_with_what_is_expected(shared_mesh: SharedMesh) -> None:
    thread = "agui-wrong-1"
    tools = [{"name": "confirm_booking", "description": "confirm"}]
    asked = [{"id": "u1", "role": "user", "content": "confirm_booking now"}]
    first = _one_run(shared_mesh, threadId=thread, messages=asked, tools=tools)
    (call_id,) = _finished(first)["outcome"]["pendingToolCallIds"]
    messages = [*asked, *first["newMessages"]]

    # A plain run on a thread that waits: 409, naming what it waits for.
    plain = [*messages, {"id": "u2", "role": "user", "content": "hello?"}]
    status, problem = _refused(_one_run(shared_mesh, threadId=thread, messages=plain))
    assert status == 409
    assert problem["reason"] == "AWAITING_CLIENT"
    assert call_id in problem["detail"]

    # A tool message for a call it does not wait for: 400 on that message.
    wrong = {"id": "t1", "role": "tool", "toolCallId": "nope", "content": "x"}
    status, problem = _refused(_one_run(shared_mesh, threadId=thread, messages=[*messages, wrong]))
    assert status == 400
    fields = {v["field"]: v["description"] for v in problem["violations"]}
    assert call_id in fields[f"messages[{len(messages)}].toolCallId"]
    assert fields["messages"] == f"no answer for call {call_id}"

    # A resume entry on a thread that waits for tool results, not interrupts.
    right = {"id": "t1", "role": "tool", "toolCallId": call_id, "content": "ok"}
    resume = [{"interruptId": "i-1", "status": "resolved"}]
    status, problem = _refused(
        _one_run(shared_mesh, threadId=thread, messages=[*messages, right], resume=resume)
    )
    assert status == 400
    assert "resume[0].interruptId" in {v["field"] for v in problem["violations"]}

    # Nothing changed: the right answer still goes through (with a message
    # after it), once.
    thanks = {"id": "u3", "role": "user", "content": "thanks"}
    done = _one_run(shared_mesh, threadId=thread, messages=[*messages, right, thanks])
    assert 'Your confirm_booking returned: "ok". You also said: "thanks".' in _text(done)
    status, problem = _refused(_one_run(shared_mesh, threadId=thread, messages=[*messages, right]))
    assert status == 409
    assert problem["reason"] == "NOT_WAITING"


def test_a_reloaded_client_must_resume_the_interrupt_exactly(shared_mesh: SharedMesh) -> None:
    thread = "agui-wrong-2"
    asked = [{"id": "u1", "role": "user", "content": "ask me"}]
    first = _one_run(shared_mesh, threadId=thread, messages=asked)
    (interrupt,) = _finished(first)["outcome"]["interrupts"]
    messages = [*asked, *first["newMessages"]]

    # A fresh client knows no pending interrupts: the server refuses the run.
    again = [*messages, {"id": "u2", "role": "user", "content": "green"}]
    status, problem = _refused(_one_run(shared_mesh, threadId=thread, messages=again))
    assert (status, problem["reason"]) == (409, "AWAITING_CLIENT")
    assert interrupt["id"] in problem["detail"]

    wrong = [{"interruptId": "nope", "status": "resolved", "payload": {"color": "red"}}]
    status, problem = _refused(
        _one_run(shared_mesh, threadId=thread, messages=messages, resume=wrong)
    )
    assert status == 400
    fields = {v["field"] for v in problem["violations"]}
    assert fields == {"resume[0].interruptId", "resume"}

    # The thread holds the history: a resume needs no messages.
    right = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"color": "red"}}]
    done = _one_run(shared_mesh, threadId=thread, messages=[], resume=right)
    assert 'You answered: "red".' in _text(done)


def test_resume_where_nothing_waits_is_409(shared_mesh: SharedMesh) -> None:
    resume = [{"interruptId": "i-1", "status": "cancelled"}]
    asked = [{"id": "u1", "role": "user", "content": "hello"}]
    # A new thread waits for nothing, and is not made.
    status, problem = _refused(
        _one_run(shared_mesh, threadId="agui-not-waiting", messages=asked, resume=resume)
    )
    assert (status, problem["reason"]) == (409, "NOT_WAITING")
    # Nor does a thread whose runs all finished.
    first = _one_run(shared_mesh, threadId="agui-not-waiting", messages=asked)
    assert "outcome" not in _finished(first)
    messages = [*asked, *first["newMessages"]]
    status, problem = _refused(
        _one_run(shared_mesh, threadId="agui-not-waiting", messages=messages, resume=resume)
    )
    assert (status, problem["reason"]) == (409, "NOT_WAITING")
    # Withdrawn beside a message (what a client that still holds an
    # interrupt answered elsewhere sends): the message runs.
    more = [*messages, {"id": "u2", "role": "user", "content": "and now?"}]
    run = _one_run(shared_mesh, threadId="agui-not-waiting", messages=more, resume=resume)
    assert "and now?" in _text(run)


def test_an_interrupt_cancelled_meanwhile_is_withdrawn_and_the_thread_goes_on(
    shared_mesh: SharedMesh,
) -> None:
    """The client holds a pending interrupt whose turn was cancelled (or
    whose pause expired); it will only send a run that withdraws it
    ("cancelled"). That run is taken: the thread goes on with its message."""
    node = shutil.which("node")
    assert node, "node is installed by `make install` (system-deps)"
    thread = f"agui-withdraw-{uuid.uuid4().hex[:8]}"
    script = [node, "withdraw.mjs", _url(shared_mesh), thread, "What is 6*7, with approval?"]
    with subprocess.Popen(
        [*script, "then say hello"],
        cwd=CLIENT_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            paused = json.loads(proc.stdout.readline())
            assert [i["reason"] for i in paused["paused"]] == ["tool_approval"]
            with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as rest:
                turn_id = rest.get(f"/v1/sessions/{thread}").json()["session"]["pause"]["turnId"]
                cancelled = rest.post(f"/v1/sessions/{thread}/turns/{turn_id}:cancel", json={})
                assert cancelled.status_code == 200, cancelled.text
            proc.stdin.write("go\n")
            proc.stdin.close()
            output = json.loads(proc.stdout.readline())
        finally:
            proc.kill()
    assert "error" not in output, output
    second = output["runs"][1]
    assert second["finished"]["outcome"] == "success"
    assert "then say hello" in _text(second)
    assert output["pendingAfter"] == []


@pytest.mark.parametrize(("mode", "said"), [("calls", "result sunny"), ("approval", "resume")])
def test_a_paused_message_that_also_ran_the_agents_own_tool_is_answered(
    shared_mesh: SharedMesh, mode: str, said: str
) -> None:
    """The client resends the agent's own tool result beside its answer
    (it is among its messages): that is history, not an answer."""
    thread = f"agui-mixed-{mode}-{uuid.uuid4().hex[:8]}"
    output, _ = _node("mixed.mjs", _url(shared_mesh), thread, mode)
    assert "error" not in output, output
    # The result of the agent's own call came back among the client's messages.
    assert any(m["role"] == "tool" for m in output["sent"])
    first, second = output["runs"]
    assert first["finished"]["outcome"] == ("interrupt" if mode == "approval" else "success")
    assert second["finished"]["outcome"] == "success"
    assert said in _text(second)


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


USER = {"id": "u1", "role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"messages": [USER, {"id": "a", "role": "assistant", "content": "x"}]},
            "messages[1].role",
        ),
        (
            {"messages": [USER, {"id": "t", "role": "tool", "content": "x"}]},
            "messages[1].toolCallId",
        ),
        (
            {"messages": [USER, {"id": "t", "role": "tool", "toolCallId": "c", "content": "x"}]},
            "messages[1]",
        ),
        (
            {"messages": [USER], "resume": [{"interruptId": "i", "status": "done"}]},
            "resume[0].status",
        ),
        (
            {"messages": [USER], "resume": [{"interruptId": "", "status": "resolved"}]},
            "resume[0].interruptId",
        ),
        (
            {
                "messages": [USER],
                "resume": [{"interruptId": "i", "status": "resolved", "payload": _deep(70)}],
            },
            "body",
        ),
        (
            {
                "messages": [USER],
                "resume": [{"interruptId": "i", "status": "resolved", "payload": _deep(40)}],
            },
            "resume[0].payload",
        ),
        ({"messages": []}, "messages"),
        (
            {"messages": [USER], "tools": [{"name": "t", "parameters": {"d": _deep(40)}}]},
            "tools[0].parameters",
        ),
        (
            {"messages": [USER], "tools": [{"name": "t", "parameters": {"maximum": 10**400}}]},
            "tools[0].parameters",
        ),
        (
            {"messages": [USER], "tools": [{"name": "t", "parameters": {"maximum": float("nan")}}]},
            "tools[0].parameters",
        ),
        # Refused by the turn, after the new thread was made: it is deleted again.
        ({"messages": [{**USER, "content": "x" * 10_001}]}, "messages[0].content"),
        ({"messages": [USER], "tools": [{"name": "t", "parameters": [1]}]}, "tools[0].parameters"),
        ({"messages": [USER], "tools": [{"description": "no name"}]}, "tools[0].name"),
        ({"messages": [USER], "tools": [{"name": "bad name!"}]}, "tools[0].name"),
    ],
)
async def test_bad_tools_answers_and_resume_are_400(
    rest: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    thread = f"agui-bad-{uuid.uuid4().hex}"
    # json.dumps, not httpx's encoder: it writes NaN, as hostile clients do.
    response = await rest.post(
        "/v1/agui",
        content=json.dumps({"threadId": thread, "runId": "r", **body}),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert field in {v["field"] for v in response.json()["violations"]}
    # Refused before the thread was made.
    assert (await rest.get(f"/v1/sessions/{thread}")).status_code == 404
