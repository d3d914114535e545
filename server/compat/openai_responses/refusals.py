"""A turn refused before it started, in this API's words and names."""

from __future__ import annotations

from turnmesh.runtime.errors import (
    AwaitingClient,
    InvalidArgument,
    NotFound,
    NotWaiting,
    TurnmeshError,
)
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.openai_responses.approvals import renamed, shown_ids
from turnmesh.server.compat.openai_responses.ids import parse_response_id, response_id
from turnmesh.server.compat.openai_responses.response import Response, is_approval


async def refused(mesh: Mesh, response: Response, exc: TurnmeshError) -> TurnmeshError:
    """A turn refused before it started, in this API's words and names; a
    session the request made for it goes again."""
    if isinstance(exc, AwaitingClient):
        exc = await awaiting(mesh, response, exc)
    elif isinstance(exc, NotWaiting):
        exc = _not_waiting(response, exc)
    elif isinstance(exc, InvalidArgument) and response.answers is not None:
        exc = renamed(response.answers.names().rename(exc), await _shown(mesh, response))
    if response.made:
        await mesh.drop_session(response.session_id, exc, response.seeded)
    return exc


async def awaiting(mesh: Mesh, response: Response, exc: AwaitingClient) -> AwaitingClient:
    """What the conversation waits for, as this API sends it."""
    try:
        pause = (await mesh.get_session(response.session_id)).pause
    except (NotFound, InvalidArgument):
        return AwaitingClient(exc.detail, metadata={**exc.metadata, "param": "input"})
    # A fork at an earlier response waits since its seeded history.
    since = (
        response_id(response.session_id, pause.turn_id)
        if pause.turn_id
        else response.request.previous_response_id
    )
    wanted = []
    if pause.tool_calls:
        ids = ", ".join(c.id for c in pause.tool_calls)
        wanted.append(f"a function_call_output item for each call ({ids})")
    shown = shown_ids(_asked_in(response), pause)
    approvals = [shown.get(i.id, i.id) for i in pause.interrupts if is_approval(i)]
    if approvals:
        wanted.append(
            f"an mcp_approval_response item for each approval request ({', '.join(approvals)})"
        )
    others = [i.id for i in pause.interrupts if not is_approval(i)]
    if others:
        wanted.append(
            'a "resume" entry ({"interrupt_id", "status", "payload"}) for each interrupt'
            f" ({', '.join(others)})"
        )
    if not wanted or not since:
        return AwaitingClient(exc.detail, metadata={**exc.metadata, "param": "input"})
    detail = (
        f"response {since!r} waits for the client: send "
        + " and ".join(wanted)
        + f", with previous_response_id {since!r}"
    )
    return AwaitingClient(detail, metadata={**exc.metadata, "param": "input"})


def _asked_in(response: Response) -> str:
    """The session whose response showed the approval requests answered:
    the previous response's (a branch of it waits for the same ones)."""
    previous = response.request.previous_response_id
    return (
        parse_response_id(previous, "previous_response_id")[0] if previous else response.session_id
    )


async def _shown(mesh: Mesh, response: Response) -> dict[str, str]:
    """The interrupt ids the session waits for, as the caller was shown them."""
    try:
        session = await mesh.get_session(response.session_id)
    except TurnmeshError:
        return {}
    return shown_ids(_asked_in(response), session.pause) if session.HasField("pause") else {}


def _not_waiting(response: Response, exc: NotWaiting) -> NotWaiting:
    why = exc.metadata.get("why")
    if why:
        what = "its wait was cancelled" if why == "cancelled" else "its wait expired"
        detail = f"the previous response waits for no answers any more ({what}): send a message"
    else:
        detail = (
            "the previous response waits for no function_call_output, mcp_approval_response"
            " or resume answers (it made no such call or request, or it was answered already)"
        )
    return NotWaiting(detail, metadata={**exc.metadata, "param": "input"})
