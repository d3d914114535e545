"""OpenAI Responses (``POST /v1/responses``, ``GET /v1/responses/{id}``).

By concept: ``request`` (the request, its input items and tools), ``ids``
(the id codec), ``conversation`` (the session a request continues, forks or
starts, and its turn), ``turns`` (the turn answered whole, streamed or in
the background), ``response`` (the response object), ``stored`` (reading
and cancelling), ``refusals`` (a refused turn in this API's words),
``approvals`` (approval requests sent back, resolved from their turns).

A response id names its session and turn (``resp_<turn>.<session, base64url>``),
so any server can continue or read it without a shared index.

Function tools: the request's ``function`` tools are the caller's tools for
the turn. A turn that ends waiting for their results lists each call as a
``function_call`` output item (after the message item, if the agent said
anything); the next request's trailing ``function_call_output`` items are the
results. With ``previous_response_id`` they answer that response's calls;
without it (a caller that resends the whole input) the input before them,
ending in the ``function_call`` items, seeds a session that waits for those
calls.

Approvals are OpenAI's own shape for a tool call that waits for a person: an
``mcp_approval_request`` output item (``server_label``: the agent), answered
by an ``mcp_approval_response`` input item with ``previous_response_id``, or
after the request item resent (or an item reference to it) with none: its id
names its turn (``approvals``). An ``mcp`` tool naming the agent is how the
agent SDKs say they answer its approvals; no MCP server is ever called.
Other interrupts (questions) have no shape in this API: such a response is
``incomplete`` (``incomplete_details.reason: "interrupt"``), and every
interrupt is listed in ``interrupts`` (an extension: the native
``Interrupt``'s fields); a request's ``resume`` (an extension,
``[{"interrupt_id", "status", "payload"}]``) with ``previous_response_id``
answers them. Any other request on a response that waits is 409
``awaiting_client``, naming what it waits for.
"""

from turnmesh.server.compat.openai_responses.ids import parse_response_id, response_id
from turnmesh.server.compat.openai_responses.request import InputMessage, ResponseRequest, parse
from turnmesh.server.compat.openai_responses.stored import cancel, get
from turnmesh.server.compat.openai_responses.turns import create, stream

__all__ = [
    "InputMessage",
    "ResponseRequest",
    "cancel",
    "create",
    "get",
    "parse",
    "parse_response_id",
    "response_id",
    "stream",
]
