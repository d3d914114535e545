"""How a turn's end says it waits for the client (worker.pause): pending
calls of the caller's tools, the agent's interrupts, and what is refused."""

from __future__ import annotations

import pytest

from turnmesh.agent import MAX_CHECKPOINT_BYTES, AgentResponse, Interrupt
from turnmesh.worker.pause import MAX_INTERRUPTS, BadPause, check_checkpoint, outcome


def test_a_turn_that_leaves_nothing_waiting_has_no_outcome() -> None:
    # A call of the agent's own tool left without a result is not the client's.
    assert outcome(AgentResponse(text="hi"), {"c1": "calculator"}, {"get_weather"}) is None


def test_unanswered_calls_of_the_callers_tools_are_pending() -> None:
    unanswered = {"c1": "get_weather", "c2": "calculator"}
    done = outcome(AgentResponse(), unanswered, {"get_weather"})
    assert done is not None
    assert (done.type, list(done.pending_tool_call_ids)) == ("success", ["c1"])


def test_interrupts_get_ids_and_reasons() -> None:
    asked = [
        Interrupt(message="which color?", response_schema={"type": "object"}),
        Interrupt(message="run it?", tool_call_id="c2", id="mine", metadata={"k": 1}),
    ]
    done = outcome(AgentResponse(interrupts=asked), {"c2": "calculator"}, set())
    assert done is not None and done.type == "interrupt"
    first, second = done.interrupts
    assert first.id.startswith("int_") and first.reason == "question"
    assert first.response_schema["type"] == "object"
    assert (second.id, second.reason, second.tool_call_id) == ("mine", "tool_approval", "c2")
    assert second.metadata["k"] == 1


def test_an_approved_call_is_the_agents_even_if_a_client_tool_has_its_name() -> None:
    """The agent's own tool wins a name clash: the call it gates waits for
    the approval, and is not one the client must run."""
    unanswered = {"c1": "calculator", "c2": "calculator"}
    done = outcome(
        AgentResponse(interrupts=[Interrupt(tool_call_id="c1")]), unanswered, {"calculator"}
    )
    assert done is not None and done.type == "interrupt"
    assert list(done.pending_tool_call_ids) == ["c2"]  # the ungated one is the client's
    assert done.interrupts[0].tool_call_id == "c1"


@pytest.mark.parametrize(
    ("interrupts", "unanswered", "client_tools"),
    [
        ([Interrupt()] * (MAX_INTERRUPTS + 1), {}, set()),
        ([Interrupt(id="x"), Interrupt(id="x")], {}, set()),
        ([Interrupt(id="x" * 129)], {}, set()),
        ([Interrupt(reason="r" * 65)], {}, set()),
        # An approval must gate a call of this turn left without a result.
        ([Interrupt(tool_call_id="nope")], {}, set()),
        ([Interrupt(response_schema=["not", "an", "object"])], {}, set()),  # type: ignore[arg-type]
        ([Interrupt(metadata={"big": "x" * 70_000})], {}, set()),
    ],
)
def test_interrupts_that_cannot_be_asked_are_refused(
    interrupts: list[Interrupt], unanswered: dict[str, str], client_tools: set[str]
) -> None:
    with pytest.raises(BadPause):
        outcome(AgentResponse(interrupts=interrupts), unanswered, client_tools)


def test_a_checkpoint_is_bytes_within_the_bound() -> None:
    check_checkpoint(b"x" * MAX_CHECKPOINT_BYTES)
    with pytest.raises(BadPause, match="at most"):
        check_checkpoint(b"x" * (MAX_CHECKPOINT_BYTES + 1))
    with pytest.raises(BadPause, match="must be bytes"):
        check_checkpoint("text")
