"""Small LangGraph graphs for the adapter's tests. ``graph``: an agent node
that asks for a tool on the first pass (a message it builds itself, no
model) and on the second streams its answer from LangChain's fake chat model;
a ToolNode in between runs a real tool. ``asking``: a node that says
something, then one that asks the client a question with ``interrupt()``."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt


@tool
def lookup(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny and 21C in {city}"


def build() -> Any:
    def agent(state: MessagesState) -> dict[str, Any]:
        messages = state["messages"]
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results or messages[-1].type != "tool":
            city = str(messages[-1].content).split()[-1].strip("?.!")
            call = {"id": f"call_{len(messages)}", "name": "lookup", "args": {"city": city}}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        model = GenericFakeChatModel(
            messages=iter([AIMessage(content=f"Forecast: {results[-1].content}.")])
        )
        return {"messages": [model.invoke(messages)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


graph = build()


CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def build_asking() -> Any:
    def greet(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="Let me plan your trip.")]}

    def ask(state: MessagesState) -> dict[str, Any]:
        # Runs again from the top on resume: the answer comes back from interrupt().
        answer = interrupt(
            {"message": "Which city?", "reason": "question"}, response_schema=CITY_SCHEMA
        )
        city = answer.get("city") if isinstance(answer, dict) else answer
        told = sum(1 for m in state["messages"] if m.type == "human")
        return {"messages": [AIMessage(content=f"Booked {city} ({told} messages from you).")]}

    graph = StateGraph(MessagesState)
    graph.add_node("greet", greet)
    graph.add_node("ask", ask)
    graph.add_edge(START, "greet")
    graph.add_edge("greet", "ask")
    return graph.compile()


asking = build_asking()
