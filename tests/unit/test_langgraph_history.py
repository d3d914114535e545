"""The LangGraph adapter's history: what a caller seeded reaches the graph
as LangChain messages, whatever a call's arguments hold."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from turnmesh.agent.langgraph import _to_langchain


def _assistant(arguments: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": arguments}}],
    }


@pytest.mark.parametrize(
    ("arguments", "args"),
    [
        ('{"city": "Rome"}', {"city": "Rome"}),
        ("", {}),
        ("[1, 2]", {"input": [1, 2]}),  # JSON, not an object
        ("not json", {"input": "not json"}),
        ("[" * 100_000, {"input": "[" * 100_000}),  # deeper than the parser goes
    ],
)
def test_a_calls_arguments_become_an_object(arguments: str, args: dict[str, Any]) -> None:
    messages = _to_langchain([_assistant(arguments)], "next")
    assistant, human = messages
    assert isinstance(assistant, AIMessage) and isinstance(human, HumanMessage)
    assert assistant.tool_calls[0]["args"] == args
    assert human.content == "next"
