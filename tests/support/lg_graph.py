"""A small LangGraph graph for the adapter's tests: an agent node that asks
for a tool on the first pass (a message it builds itself, no model) and on
the second streams its answer from LangChain's fake chat model; a ToolNode in
between runs a real tool."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


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
