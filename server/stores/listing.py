"""Listing a principal's sessions: keyset pages, newest first.

A session's place in a listing is its ``Position``: (creation time in Unix
nanoseconds, public id), compared descending. A page token is the position of
the last session a page covered; the next page holds only positions below
it, so sessions created or deleted between calls never make a page skip or
repeat one (new sessions sort before the first page and are not listed).

Sources (one server's store, a Redis shard, another server) each return a
``Page``: sessions in order, and the position down to which they looked
(``frontier``, ``None`` when they have nothing further). ``merge`` joins pages
of several sources into one page that is correct for all of them: it keeps
only what every unfinished source has looked at.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from turnmesh.runtime.errors import FieldViolation, InvalidArgument
from turnmesh.runtime.principals import public_id
from turnmesh.v1 import session_service_pb2 as spb

Position = tuple[int, str]
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
# Sessions looked at per call beyond a full page when filters skip most.
SCAN_BUDGET = 1_000
FILTER_BATCH = 250
MAX_METADATA_FILTERS = 16
T = TypeVar("T")


def position(created_at: float, scoped_id: str) -> Position:
    # The same nanoseconds the Session's created_at timestamp carries.
    return (int(created_at * 1e9), public_id(scoped_id))


def session_position(session: spb.Session) -> Position:
    """A listed session's position (its id is the public one already)."""
    return (session.created_at.ToNanoseconds(), session.session_id)


@dataclass
class Page(Generic[T]):
    items: list[tuple[Position, T]]
    frontier: Position | None


def merge(pages: Sequence[Page[T]], limit: int) -> Page[T]:
    """One page of the union: the ``limit`` newest items that no unfinished
    source could still have something newer than."""
    open_frontiers = [p.frontier for p in pages if p.frontier is not None]
    floor = max(open_frontiers) if open_frontiers else None
    candidates = sorted(
        (item for page in pages for item in page.items if floor is None or item[0] >= floor),
        key=lambda item: item[0],
        reverse=True,
    )
    taken = candidates[:limit]
    if len(candidates) > limit:
        return Page(taken, taken[-1][0])
    return Page(taken, floor)


# The longest token encode_token makes is about 200 characters (a 64-bit
# position and a session id of at most 128).
MAX_TOKEN_CHARS = 512


def encode_token(frontier: Position | None) -> str:
    if frontier is None:
        return ""
    raw = json.dumps([frontier[0], frontier[1]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> Position | None:
    if not token:
        return None
    # A token this API returns is a few hundred characters: a longer one is
    # refused before it is decoded (deep JSON nesting raised RecursionError).
    if len(token) > MAX_TOKEN_CHARS:
        raise _bad_token()
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        nanos, session = json.loads(raw)
    except (ValueError, binascii.Error, TypeError, UnicodeDecodeError, RecursionError):
        raise _bad_token() from None
    # Bounded as a store's integers are (SQLite's are 64-bit).
    if (
        isinstance(nanos, int)
        and not isinstance(nanos, bool)
        and 0 <= nanos < 2**63
        and isinstance(session, str)
        and len(session) <= 128
    ):
        return (nanos, session)
    raise _bad_token()


def _bad_token() -> InvalidArgument:
    return InvalidArgument([FieldViolation("page_token", "not a token this API returned")])


@dataclass(frozen=True)
class Filters:
    agent_name: str = ""
    metadata: tuple[tuple[str, str], ...] = ()

    def match(self, agent_name: str, metadata: dict[str, Any]) -> bool:
        if self.agent_name and agent_name != self.agent_name:
            return False
        for key, wanted in self.metadata:
            if key not in metadata:
                return False
            value = metadata[key]
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            if text != wanted:
                return False
        return True


def page_size(requested: int) -> int:
    if requested < 0 or requested > MAX_PAGE_SIZE:
        raise InvalidArgument(
            [FieldViolation("page_size", f"must be between 1 and {MAX_PAGE_SIZE}")]
        )
    return requested or DEFAULT_PAGE_SIZE


def filters(agent_name: str, metadata: Sequence[str]) -> Filters:
    violations = []
    if len(agent_name) > 128:
        violations.append(FieldViolation("agent_name", "must be at most 128 characters"))
    if len(metadata) > MAX_METADATA_FILTERS:
        violations.append(
            FieldViolation("metadata", f"at most {MAX_METADATA_FILTERS} key=value filters")
        )
    pairs = []
    for index, entry in enumerate(metadata[:MAX_METADATA_FILTERS]):
        key, equals, value = entry.partition("=")
        if not equals or not key or len(entry) > 1024:
            violations.append(
                FieldViolation(f"metadata[{index}]", "must be key=value (at most 1,024 characters)")
            )
        pairs.append((key, value))
    if violations:
        raise InvalidArgument(violations)
    return Filters(agent_name, tuple(pairs))
