"""Run a compiled LangGraph graph as a turnmesh agent (``pip install
'turnmesh[langgraph]'``; ``kind: langgraph`` in an agent file).

The graph gets ``{"messages": [...]}``: the session's history and the new
message as LangChain messages (with the text of attached files). Its
``messages`` stream becomes turnmesh events: model tokens as deltas, the tool
calls an AI message makes, and tool messages as tool results.

``interrupt()`` in the graph ends the turn waiting for the client: each
interrupt becomes a question (its value the message, or ``{"message",
"reason", ...}``; its ``response_schema`` the answer's schema), and the
graph's checkpoint is saved with the pause in the session store, so the
answering turn resumes it with ``Command(resume={id: answer})`` on whichever
worker runs it. A turn whose answers are all "cancelled" (or whose pause
expired) abandons the checkpoint and runs from the history as usual.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from typing import Any

from turnmesh.agent._contract import (
    AgentError,
    AgentRequest,
    AgentResponse,
    EventEmitter,
    Interrupt,
)
from turnmesh.agent._prompt import file_context

__all__ = ["LangGraphAgent"]

# The checkpoint's layout; a checkpoint of another version is not resumed.
_FORMAT = b"turnmesh-langgraph-1"


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


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as LangChain takes them: a JSON object. History a
    caller seeded may hold anything there; what is not an object is kept
    whole under ``input`` rather than failing the turn."""
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return {"input": text}
    return value if isinstance(value, dict) else {"input": value}


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
            if m.get("error"):
                content = f"error: {m['error']}"
            messages.append(ToolMessage(content, tool_call_id=m.get("tool_call_id", "")))
        elif role == "assistant":
            calls = [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "args": _arguments(c["function"]["arguments"]),
                }
                for c in m.get("tool_calls", ())
            ]
            messages.append(AIMessage(content, tool_calls=calls))
    messages.append(HumanMessage(message))
    return messages


def _interrupt(asked: Any) -> Interrupt:
    """A LangGraph interrupt as a question for the client (same id)."""
    value = asked.value
    schema = getattr(asked, "response_schema", None)
    if isinstance(value, dict):
        message = str(value.get("message") or value.get("question") or "")
        reason = str(value.get("reason") or "question")
        metadata = {"value": value}
    else:
        message, reason, metadata = str(value), "question", {}
    return Interrupt(
        reason=reason,
        message=message,
        response_schema=schema if isinstance(schema, dict) else None,
        metadata=metadata,
        id=asked.id,
    )


class _Events:
    """A graph's ``messages`` stream, as turnmesh events."""

    def __init__(self, emitter: EventEmitter) -> None:
        self.emitter = emitter
        self.announced: set[str] = set()
        self.pending: dict[str, Any] = {}  # streamed AI message id -> its chunks so far
        self.answer: list[str] = []

    async def announce(self, calls: Sequence[dict[str, Any]]) -> None:
        for call in calls:
            if call.get("id") and call["id"] not in self.announced:
                self.announced.add(call["id"])
                await self.emitter.emit_tool_call(
                    call["name"], call.get("args") or {}, call_id=call["id"]
                )

    async def flush(self) -> None:
        # A streamed message's tool calls are whole only once it ends.
        for chunk in self.pending.values():
            await self.announce(chunk.tool_calls)
        self.pending.clear()

    async def message(self, item: Any) -> None:
        from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage

        if isinstance(item, AIMessageChunk):
            if item.id in self.pending:
                self.pending[item.id] = self.pending[item.id] + item
            else:
                await self.flush()
                self.pending[item.id or ""] = item
            text = _text(item.content)
            if text:
                self.answer.append(text)
                await self.emitter.emit_delta(text)
            return
        await self.flush()
        if isinstance(item, AIMessage):
            text = _text(item.content)
            if text:
                self.answer = [text]
                await self.emitter.emit_delta(text)
            await self.announce([dict(call) for call in item.tool_calls])
        elif isinstance(item, ToolMessage):
            if item.tool_call_id not in self.announced:
                await self.announce([{"id": item.tool_call_id, "name": item.name or "tool"}])
            await self.emitter.emit_tool_result(item.tool_call_id, _text(item.content))
            self.answer = []  # the answer is what follows the last tool result


async def _save(saver: Any, thread_id: str) -> bytes:
    """The thread's latest checkpoint of each namespace, with its pending
    writes (the interrupts), through LangGraph's own serializer."""
    entries = []
    seen: set[str] = set()
    async for saved in saver.alist({"configurable": {"thread_id": thread_id}}):
        namespace = saved.config["configurable"]["checkpoint_ns"]
        if namespace in seen:
            continue  # newest first: an older checkpoint of the namespace
        seen.add(namespace)
        entries.append(
            {
                "config": saved.config,
                "parent": saved.parent_config,
                "checkpoint": saved.checkpoint,
                "metadata": saved.metadata,
                "writes": list(saved.pending_writes or ()),
            }
        )
    kind, data = saver.serde.dumps_typed(entries)
    return b"\0".join((_FORMAT, kind.encode(), data))


async def _restore(checkpoint: bytes, thread_id: str) -> Any | None:
    """A saver holding a saved thread, or None if the bytes are not ours."""
    from langgraph.checkpoint.memory import InMemorySaver

    layout, _, rest = checkpoint.partition(b"\0")
    kind, _, data = rest.partition(b"\0")
    if layout != _FORMAT:
        return None
    saver = InMemorySaver()
    for entry in saver.serde.loads_typed((kind.decode(), data)):
        namespace = entry["config"]["configurable"]["checkpoint_ns"]
        parent: Any = entry["parent"] or {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": namespace}
        }
        checkpoint_ = entry["checkpoint"]
        await saver.aput(parent, checkpoint_, entry["metadata"], checkpoint_["channel_versions"])
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in entry["writes"]:
            by_task.setdefault(task_id, []).append((channel, value))
        for task_id, writes in by_task.items():
            await saver.aput_writes(entry["config"], writes, task_id)
    return saver


class LangGraphAgent:
    def __init__(self, graph: Any, *, name: str = "langgraph", instructions: str = "") -> None:
        self.graph = _load_graph(graph) if isinstance(graph, str) else graph
        self.name = name
        self.instructions = instructions

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        from langchain_core.messages import HumanMessage, SystemMessage
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.types import Command

        message = request.message
        if request.files:
            message = f"{message}\n\n{file_context(request.files)}"
        # One thread per session, in a saver of this turn's own: a checkpoint
        # outlives the turn only as the pause's, in the session store.
        config = {"configurable": {"thread_id": request.session_id}}
        events = _Events(emitter)
        answers = {e.interrupt.id: e.payload for e in request.resume if e.status == "resolved"}
        inputs: list[Any] = []
        saver = None
        if answers:
            saver = await _restore(request.checkpoint, request.session_id)
            if saver is None:
                raise AgentError(
                    "Cannot resume the graph",
                    "the paused turn left no checkpoint of this graph to resume from",
                    code="no_checkpoint",
                    status=409,
                )
            inputs.append(Command(resume=answers))
            if request.messages:  # said beside the answers: the graph's next input
                inputs.append({"messages": [HumanMessage(message)]})
        elif request.messages:
            messages = _to_langchain(request.history, message)
            if self.instructions:
                messages.insert(0, SystemMessage(self.instructions))
            inputs.append({"messages": messages})
        graph = self.graph.copy(update={"checkpointer": saver or InMemorySaver()})
        interrupts: list[Any] = []
        for graph_input in inputs:
            # Checkpoints are written once, when the graph stops: a graph that
            # never interrupts pays nothing per step for the saver.
            async for mode, item in graph.astream(
                graph_input, config, stream_mode=["messages", "updates"], durability="exit"
            ):
                if mode == "messages":
                    await events.message(item[0])
                elif isinstance(item, dict) and "__interrupt__" in item:
                    interrupts.extend(item["__interrupt__"])
            await events.flush()
            if interrupts:
                break
        response = AgentResponse(
            text="".join(events.answer), metadata={"graph": type(self.graph).__name__}
        )
        if interrupts:
            response.interrupts = [_interrupt(asked) for asked in interrupts]
            response.checkpoint = await _save(graph.checkpointer, request.session_id)
        return response
