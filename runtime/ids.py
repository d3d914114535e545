"""Identifiers: ULIDs for sessions, turns and members."""

from __future__ import annotations

import re

from ulid import ULID

# Client-supplied session ids (for clients that bring their own thread ids).
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")

_last = 0


def new_id() -> str:
    """A ULID strictly greater than every earlier one from this process, so
    ids minted in arrival order sort in arrival order (plain ULIDs minted in
    the same millisecond sort at random)."""
    global _last
    value = max(int(ULID()), _last + 1)
    _last = value
    return str(ULID.from_int(value))


def new_member_id(role: str) -> str:
    return f"{role}-{ULID()}"
