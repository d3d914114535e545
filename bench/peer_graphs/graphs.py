"""The peer benchmark's graphs (bench/peers.py), served by LangGraph's Agent
Server from its own venv: the same two agents as turnmesh's echo agent.

``echo`` replies with the user's words as one message. ``paced`` says the
user's words one at a time, ``delay_ms`` apart (the run's configurable, as
turnmesh's echo agent takes it from the turn's metadata), through a chat
model, so the server streams each word as a token (stream mode "messages").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph


def _said(state: MessagesState) -> str:
    content = state["messages"][-1].content
    return content if isinstance(content, str) else ""


def _reply(state: MessagesState) -> dict[str, list[BaseMessage]]:
    return {"messages": [AIMessage(content=_said(state))]}


class PacedEcho(BaseChatModel):
    """A chat model that streams the last message back, a word per token."""

    delay_s: float = 0.04

    @property
    def _llm_type(self) -> str:
        return "paced-echo"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(messages[-1].content))])

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        raise NotImplementedError("the benchmark streams asynchronously")

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        text = messages[-1].content
        for index, word in enumerate(str(text).split(" ")):
            if index:
                await asyncio.sleep(self.delay_s)
            piece = word if index == 0 else f" {word}"
            # The base class tells the callbacks (the server's message stream).
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))


async def _paced(state: MessagesState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
    delay_ms = float(config.get("configurable", {}).get("delay_ms", 40))
    model = PacedEcho(delay_s=delay_ms / 1000)
    return {"messages": [await model.ainvoke(state["messages"], config)]}


def _graph(name: str, node: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node(name, node)
    builder.add_edge(START, name)
    builder.add_edge(name, END)
    return builder.compile()


echo = _graph("echo", _reply)
paced = _graph("paced", _paced)
