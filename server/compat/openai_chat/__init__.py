"""OpenAI chat completions (``POST /v1/chat/completions``), byte for byte what
the official SDK expects, streaming or not.

By concept: ``request`` (the request, its messages and tools), ``turn``
(the turn as it grows), ``conversation`` (the session a request continues or
seeds, and its turn's events), ``output`` (the completion, whole or
streamed).

Client tools: the request's function ``tools`` are the caller's tools for the
turn. A turn that ends waiting for their results answers with the calls as
``tool_calls`` and ``finish_reason: "tool_calls"``; the next request's
trailing ``tool`` messages are the results. With ``X-Session-Id`` they answer
the session's pause; without it the conversation before them (ending in the
assistant's ``tool_calls``) seeds a session that waits for those calls.

Approvals and questions (interrupts) have no shape in this API. The answer
says what is asked as its text (the agent's, else the interrupts' messages)
and lists them in ``message.interrupts`` (an extension beside
``tool_calls``) and again as ``message.function_call`` (``interrupts_call``:
where langchain and litellm keep them); a request's ``resume`` (an extension:
``[{"interrupt_id", "status", "payload"}]``, TurnRequest's names) with the
session's ``X-Session-Id`` answers them. A session left waiting on one is kept
even without ``X-Session-Id`` (its id is in the ``X-Session-Id`` response
header), and any other request on it is 409 ``awaiting_client``.
"""

from turnmesh.server.compat.openai_chat.conversation import open_turn
from turnmesh.server.compat.openai_chat.output import complete, error_payload, stream
from turnmesh.server.compat.openai_chat.request import ChatCompletionRequest, parse, to_history

__all__ = [
    "ChatCompletionRequest",
    "complete",
    "error_payload",
    "open_turn",
    "parse",
    "stream",
    "to_history",
]
