"""Approval requests as a caller sends them back: an ``mcp_approval_request``
item resent whole (openai-agents, langchain), an item reference to one (the
Vercel AI SDK), an ``mcp_approval_response`` naming one.

An approval item's id names its session, turn and place among the turn's
interrupts (``ids.approval_item_id``), so each resolves from the stored
history, the caller's own only, on any server. What the agent runs once it
is approved is what it asked then: the call's name and arguments come from
that history, never from the caller's copy of the item (a caller could
otherwise have the agent run any call of its own tools)."""

from __future__ import annotations

from dataclasses import dataclass

from turnmesh.runtime.errors import InvalidArgument, ItemNotFound, NotFound
from turnmesh.server.compat._common import Mesh, invalid
from turnmesh.server.compat.openai_responses.ids import approval_item_id, parse_approval_item_id
from turnmesh.v1 import event_pb2, message_pb2

# The sessions one request's approval items may read (each a history read).
MAX_SESSIONS = 8


@dataclass(frozen=True)
class Asked:
    """An approval request as its turn asked it: the interrupt and the call it gates."""

    item_id: str
    interrupt: event_pb2.Interrupt
    call: message_pb2.ToolCall


class Approvals:
    """Approval item ids resolved against their sessions' histories, each read once."""

    def __init__(self, mesh: Mesh) -> None:
        self._mesh = mesh
        self._histories: dict[str, list[message_pb2.Message]] = {}

    async def find(self, item_id: str, where: str) -> Asked:
        """The approval request ``item_id`` names; ItemNotFound (``where``) if none."""
        not_found = ItemNotFound(f"item {item_id[:128]!r} not found", metadata={"param": where})
        named = parse_approval_item_id(item_id)
        if named is None:
            raise not_found
        session_id, turn_id, index = named
        if session_id not in self._histories:
            if len(self._histories) == MAX_SESSIONS:
                raise invalid(where, f"items of at most {MAX_SESSIONS} conversations per request")
            try:
                self._histories[session_id] = await self._mesh.history(session_id)
            except (NotFound, InvalidArgument):
                raise not_found from None
        turn = [m for m in self._histories[session_id] if m.turn_id == turn_id]
        interrupts = [i for m in turn for i in m.interrupts]
        if index >= len(interrupts) or not interrupts[index].tool_call_id:
            raise not_found
        interrupt = interrupts[index]
        call = next((c for m in turn for c in m.tool_calls if c.id == interrupt.tool_call_id), None)
        if call is None:
            raise not_found
        return Asked(item_id, interrupt, call)

    async def interrupt_ids(self, item_ids: list[str]) -> dict[str, str]:
        """The interrupt each approval item id names, for those that name one."""
        found: dict[str, str] = {}
        for item_id in item_ids:
            if parse_approval_item_id(item_id) is None:
                continue
            try:
                found[item_id] = (await self.find(item_id, "input")).interrupt.id
            except (ItemNotFound, InvalidArgument):
                continue  # unknown: refused by the answers' check, by its id
        return found


def shown_ids(session_id: str, pause: message_pb2.Pause) -> dict[str, str]:
    """A pause's interrupt ids as the response that asked them showed them
    (approval item ids; a seeded pause's have no turn to name)."""
    if not pause.turn_id:
        return {}
    return {
        interrupt.id: approval_item_id(session_id, pause.turn_id, index)
        for index, interrupt in enumerate(pause.interrupts)
    }


def renamed(error: InvalidArgument, ids: dict[str, str]) -> InvalidArgument:
    """The error with each interrupt id as the caller knows it."""
    if not ids:
        return error
    violations = []
    for violation in error.violations:
        description = violation.description
        for native, shown in ids.items():
            description = description.replace(native, shown)
        violations.append(type(violation)(violation.field, description))
    return InvalidArgument(violations)
