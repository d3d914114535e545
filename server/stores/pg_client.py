"""The PostgreSQL store's connections: ``pool`` makes a server's bounded
pool from a URL, and ``unavailable_when_down`` turns the database being
unreachable, restarting or out of time into ``Unavailable`` (a retryable
503) on a class's calls, as the Redis store's does: never a driver's text
to a client.

Pool bounds: ``MIN_CONNECTIONS`` kept open, at most ``MAX_CONNECTIONS`` (a
server's calls beyond that wait for one, at most ``CHECKOUT_SECONDS``);
every connection has ``statement_timeout`` set when it opens, so a stuck
statement fails its call instead of holding a connection. The URL's
``pool_min``, ``pool_max``, ``pool_timeout_ms`` and ``statement_timeout_ms``
parameters override them (taken out before libpq reads the URL).
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import errors

from turnmesh.runtime.errors import FieldViolation, InvalidArgument, Unavailable
from turnmesh.server.stores._guard import translating

MIN_CONNECTIONS = 2
# Turns commit in one short transaction each: ten connections carry a
# server's load; N servers hold N x this (size max_connections for it).
MAX_CONNECTIONS = 10
CHECKOUT_SECONDS = 5.0
CONNECT_SECONDS = 5
STATEMENT_TIMEOUT_MS = 10_000
# A connection idle this long is checked (one empty query) before use: one
# the database dropped meanwhile (a restart) is replaced, not failed on. One
# in steady use is not: a round trip fewer on every call.
IDLE_CHECK_SECONDS = 2.0
# The pool retries a lost connection with a doubling delay (1 s, 2 s, 4 s,
# ...) until this, then starts over at the next call: the delay after a long
# outage stays short, so a database back serves again within seconds.
RECONNECT_SECONDS = 10.0
# What a caller is told to wait when the database cannot be reached (Retry-After).
STORE_RETRY_AFTER = 2
log = logging.getLogger(__name__)

# Failures that say the database is not serving us now (not our mistake):
# connection lost or refused (OperationalError: restarts, admin shutdown,
# cancelled by statement_timeout, too many connections), no connection free
# in time (PoolTimeout), a closed connection (InterfaceError), a standby;
# and a transaction the database chose to abort (a serialization failure,
# a deadlock), which a retry may pass.
DOWN: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg_pool.PoolTimeout,
    errors.ReadOnlySqlTransaction,
    errors.SerializationFailure,
    errors.DeadlockDetected,
)


@dataclass(frozen=True)
class Settings:
    conninfo: str
    min_size: int = MIN_CONNECTIONS
    max_size: int = MAX_CONNECTIONS
    statement_timeout_ms: int = STATEMENT_TIMEOUT_MS
    checkout_seconds: float = CHECKOUT_SECONDS
    # The URL's own libpq `options` (a `search_path`, say), kept beside the
    # statement timeout the pool adds, and its `connect_timeout` if given.
    options: str = ""
    connect_timeout: int = CONNECT_SECONDS


def settings(url: str) -> Settings:
    """The URL without turnmesh's own parameters, and those parameters."""
    parts = urlsplit(url)
    ours = {"pool_min", "pool_max", "pool_timeout_ms", "statement_timeout_ms"}
    merged = {"options", "connect_timeout"}  # given to the pool with its own
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = {k: v for k, v in query if k in ours | merged}
    rest = urlencode([(k, v) for k, v in query if k not in ours | merged])
    conninfo = urlunsplit(parts._replace(query=rest))
    try:
        found = Settings(
            conninfo,
            int(given.get("pool_min", MIN_CONNECTIONS)),
            int(given.get("pool_max", MAX_CONNECTIONS)),
            int(given.get("statement_timeout_ms", STATEMENT_TIMEOUT_MS)),
            int(given.get("pool_timeout_ms", CHECKOUT_SECONDS * 1000)) / 1000,
            given.get("options", ""),
            int(given.get("connect_timeout", CONNECT_SECONDS)),
        )
    except ValueError:
        raise ValueError(f"the store URL's {sorted(given)} must be integers") from None
    if not 0 <= found.min_size <= found.max_size or found.max_size < 1:
        raise ValueError("the store URL needs 0 <= pool_min <= pool_max and pool_max >= 1")
    if found.checkout_seconds <= 0 or found.statement_timeout_ms < 0:
        raise ValueError(
            "the store URL's pool_timeout_ms must be positive, statement_timeout_ms not negative"
        )
    return found


def redacted(url: str) -> str:
    """The URL without its password (in the user part or, as libpq also
    takes it, a ``password`` parameter), for messages."""
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(name == "password" for name, _ in query):
        kept = [(name, "***" if name == "password" else value) for name, value in query]
        parts = parts._replace(query=urlencode(kept, safe="*"))
    return urlunsplit(parts)


def pool(found: Settings) -> psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
    """Opened by the caller (``await pool.open(wait=True)``)."""
    return psycopg_pool.AsyncConnectionPool(
        found.conninfo,
        min_size=found.min_size,
        max_size=found.max_size,
        timeout=found.checkout_seconds,
        reconnect_timeout=RECONNECT_SECONDS,
        check=_check_if_idle,
        reset=_returned,
        kwargs={
            "autocommit": True,
            "connect_timeout": found.connect_timeout,
            "options": f"{found.options} -c statement_timeout={found.statement_timeout_ms}".strip(),
        },
        open=False,
        name="turnmesh-store",
    )


# When each pooled connection was last given back.
_idle_since: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
    weakref.WeakKeyDictionary()
)


async def _returned(conn: psycopg.AsyncConnection[Any]) -> None:
    _idle_since[conn] = time.monotonic()


async def _check_if_idle(conn: psycopg.AsyncConnection[Any]) -> None:
    if time.monotonic() - _idle_since.get(conn, 0.0) > IDLE_CHECK_SECONDS:
        await psycopg_pool.AsyncConnectionPool.check_connection(conn)


def _translated(exc: Exception) -> Exception | None:
    """The database down or refusing us: Unavailable (Retry-After: it is back
    in seconds when restarting); a value no column holds: the caller's 400."""
    if isinstance(exc, psycopg.DataError):
        # A NUL in text, say: refused, and the transaction wrote nothing.
        log.info("the session store refused a value: %s", type(exc).__name__)
        return InvalidArgument(
            [FieldViolation("request", "holds a value the session store cannot keep")]
        )
    if isinstance(exc, DOWN):
        log.warning(
            "the session store failed: %s (%s)",
            type(exc).__name__,
            getattr(exc, "sqlstate", None) or "no sqlstate",
        )
        return Unavailable("the session store is unavailable", retry_after=STORE_RETRY_AFTER)
    return None


# Every public coroutine of a PostgreSQL store class translates so.
unavailable_when_down = translating(_translated)
