"""Where sessions live: the store contract and its backends.

``base`` is the contract every store keeps (``SessionStore``, the session
record, the commit's rules); ``memory`` keeps one server's sessions in its
memory; ``sqlite`` in a file, with ``sqlite_schema`` its layout and
migrations and ``sqlite_outbox`` its webhook outbox; ``redis`` shares them
between servers, with ``redis_client`` its connection (shared with the
mesh's limits), ``redis_keys`` its key layout, ``redis_scripts`` its Lua
scripts, ``redis_outbox`` its webhook outbox and ``redis_migrate`` its
layout moves; ``postgres`` keeps them in PostgreSQL, with ``pg_schema`` its
migrations, ``pg_client`` its pool, ``pg_outbox``, ``pg_tasks`` and
``pg_push`` its outbox, task records and push configs; ``listing`` is the
keyset pages every backend lists sessions by. No module imports one that
imports it back, lazily or not (``tests/unit/test_import_graph.py``).

``open_store`` picks a backend from a URL; it imports a durable backend only
when asked for it (Redis's client is a fifth of a server's start).
"""

from __future__ import annotations

from turnmesh.runtime.principals import ANONYMOUS
from turnmesh.server.stores.base import SessionStore
from turnmesh.server.stores.memory import MemoryStore

__all__ = ["open_store"]


def open_store(
    url: str, event_ttl_seconds: float, legacy_principal: str = ANONYMOUS
) -> SessionStore:
    """A store from ``memory``, ``sqlite:PATH``, ``redis://HOST:PORT/DB``,
    ``redis+cluster://HOST:PORT`` (any node of a Redis Cluster) or
    ``postgresql://USER@HOST/DB`` (``postgres://`` too; libpq's URL).

    ``legacy_principal`` owns the sessions a durable store held from before
    sessions had principals (the one principal of a mesh with one; else
    anonymous), given to it once, when ``open`` brings the data up to date."""
    if url in ("", "memory"):
        return MemoryStore()
    if url.startswith("sqlite:"):
        from turnmesh.server.stores.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite:"), event_ttl_seconds, legacy_principal)
    if url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
        from turnmesh.server.stores.redis import RedisStore

        return RedisStore(url, event_ttl_seconds, legacy_principal)
    if url.startswith(("postgresql://", "postgres://")):
        from turnmesh.server.stores.postgres import PostgresStore

        return PostgresStore(url, event_ttl_seconds, legacy_principal)
    raise ValueError(
        f"unknown store {url!r}: use memory, sqlite:PATH, redis://HOST:PORT/DB,"
        " redis+cluster://HOST:PORT or postgresql://USER@HOST/DB"
    )
