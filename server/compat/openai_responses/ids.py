"""Ids that name their session and turn (``resp_<turn>.<session,
base64url>``), so any server can continue or read them without a shared index."""

from __future__ import annotations

import base64
import binascii

from turnmesh.server.compat._common import invalid


def _encoded(session_id: str, turn_id: str) -> str:
    encoded = base64.urlsafe_b64encode(session_id.encode()).decode().rstrip("=")
    return f"{turn_id}.{encoded}"


def decoded(value: str) -> tuple[str, str]:
    """(session, turn) of ``<turn>.<session, base64url>``; ValueError if not."""
    turn_id, encoded = value.split(".", 1)
    try:
        session_id = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(value) from exc
    if not turn_id or not session_id:
        raise ValueError(value)
    return session_id, turn_id


def response_id(session_id: str, turn_id: str) -> str:
    return f"resp_{_encoded(session_id, turn_id)}"


def item_id(session_id: str, turn_id: str) -> str:
    """An output message's id names its session too, so an item reference
    to it resolves on any server, in a request with no previous response."""
    return f"msg_{_encoded(session_id, turn_id)}"


def call_item_id(session_id: str, turn_id: str, index: int) -> str:
    """A function_call item's id: its turn's and its place among the calls
    (the caller's handle on the call is its ``call_id``)."""
    return f"fc_{index}_{_encoded(session_id, turn_id)}"


def approval_item_id(session_id: str, turn_id: str, index: int) -> str:
    """An approval request's item id: its turn's and its place among the
    turn's interrupts, so that the request resolves from its session's
    history on any server (an item reference to it, or the item resent)."""
    return f"mcpr_{index}_{_encoded(session_id, turn_id)}"


def parse_approval_item_id(value: str) -> tuple[str, str, int] | None:
    """(session, turn, index) of an approval request's item id, or None."""
    index, sep, rest = value.removeprefix("mcpr_").partition("_")
    # ASCII digits only: str.isdigit also takes "²", which int() refuses.
    digits = index.isascii() and index.isdigit()
    if not value.startswith("mcpr_") or not sep or not digits or len(index) > 4:
        return None
    try:
        session_id, turn_id = decoded(rest)
    except ValueError:
        return None
    return session_id, turn_id, int(index)


def parse_response_id(value: str, field: str) -> tuple[str, str]:
    if not value.startswith("resp_"):
        raise invalid(field, "not a response id from this service")
    try:
        return decoded(value.removeprefix("resp_"))
    except ValueError:
        raise invalid(field, "not a response id from this service") from None
