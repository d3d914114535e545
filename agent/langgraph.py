"""Run a compiled LangGraph graph as a turnmesh agent (``pip install
'turnmesh[langgraph]'``; ``kind: langgraph`` in an agent file).

The graph gets ``{"messages": [...]}``: the session's history and the new
message as LangChain messages (with the text of attached files). Its
``messages`` stream becomes turnmesh events: model tokens as deltas, the tool
calls an AI message makes, and tool messages as tool results.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from turnmesh.agent._contract import AgentRequest, AgentResponse, EventEmitter
from turnmesh.agent.builtin.llm import _file_context

__all__ = ["LangGraphAgent"]


def _load_graph(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"graph {spec!r}: expected 'package.module:graph'")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if callable(target) and not hasattr(target, "astream"):
        target = target()  # a factory that builds the graph
    if not hasattr(target, "astream"):
        raise ValueError(f"graph {spec!r} is not a compiled LangGraph graph")
    return target


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        return "".join(
            b if isinstance(b, str) else str(b.get("text", ""))
            for b in content
            if isinstance(b, str) or b.get("type") == "text"
        )
    return ""


def _to_langchain(history: list[dict[str, Any]], message: str) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    messages: list[Any] = []
    for m in history:
        role, content = m.get("role"), m.get("content") or ""
        if role == "user":
            messages.append(HumanMessage(content))
        elif role == "system":
            messages.append(SystemMessage(content))
        elif role == "tool":
            messages.append(ToolMessage(content, tool_call_id=m.get("tool_call_id", "")))
        elif role == "assistant":
            calls = [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "args": json.loads(c["function"]["arguments"] or "{}"),
                }
                for c in m.get("tool_calls", ())
            ]
            messages.append(AIMessage(content, tool_calls=calls))
    messages.append(HumanMessage(message))
    return messages


class LangGraphAgent:
    def __init__(self, graph: Any, *, name: str = "langgraph", instructions: str = "") -> None:
        self.graph = _load_graph(graph) if isinstance(graph, str) else graph
        self.name = name
        self.instructions = instructions

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        from langchain_core.messages import AIMessage, AIMessageChunk, SystemMessage, ToolMessage

        message = request.message
        if request.files:
            message = f"{message}\n\n{_file_context(request.files)}"
        messages = _to_langchain(request.history, message)
        if self.instructions:
            messages.insert(0, SystemMessage(self.instructions))
        announced: set[str] = set()
        pending: dict[str, Any] = {}  # streamed AI message id -> its chunks so far
        answer: list[str] = []

        async def announce(calls: list[dict[str, Any]]) -> None:
            for call in calls:
                if call.get("id") and call["id"] not in announced:
                    announced.add(call["id"])
                    await emitter.emit_tool_call(
                        call["name"], call.get("args") or {}, call_id=call["id"]
                    )

        async def flush() -> None:
            # A streamed message's tool calls are whole only once it ends.
            for chunk in pending.values():
                await announce(chunk.tool_calls)
            pending.clear()

        async for item, _metadata in self.graph.astream(
            {"messages": messages}, stream_mode="messages"
        ):
            if isinstance(item, AIMessageChunk):
                if item.id in pending:
                    pending[item.id] = pending[item.id] + item
                else:
                    await flush()
                    pending[item.id or ""] = item
                text = _text(item.content)
                if text:
                    answer.append(text)
                    await emitter.emit_delta(text)
                continue
            await flush()
            if isinstance(item, AIMessage):
                text = _text(item.content)
                if text:
                    answer = [text]
                    await emitter.emit_delta(text)
                await announce([dict(call) for call in item.tool_calls])
            elif isinstance(item, ToolMessage):
                if item.tool_call_id not in announced:
                    await announce([{"id": item.tool_call_id, "name": item.name or "tool"}])
                await emitter.emit_tool_result(item.tool_call_id, _text(item.content))
                answer = []  # the answer is what follows the last tool result
        await flush()
        return AgentResponse(text="".join(answer), metadata={"graph": type(self.graph).__name__})
