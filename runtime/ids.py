"""Identifiers: ULIDs for sessions, turns and members."""

from __future__ import annotations

import re

from ulid import ULID

# Client-supplied session ids (for clients that bring their own thread ids).
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def new_id() -> str:
    return str(ULID())


def new_member_id(role: str) -> str:
    return f"{role}-{ULID()}"
