"""``turnmesh store migrate [--check] URL``: the PostgreSQL store's schema.

A server applies pending steps itself when it opens the store (under a lock:
servers starting together apply them once); this applies them ahead of a
rollout, or, with ``--check``, only says whether any are pending (exit 0:
current; 1: steps pending, each on a line; 2: not a PostgreSQL URL or the
database cannot be reached) for a deploy pipeline to gate on.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

POSTGRES = ("postgresql://", "postgres://")


def add_store_command(sub: Any) -> None:
    from turnmesh.cli._flags import env

    store = sub.add_parser("store", help="the session store's schema (PostgreSQL)")
    commands = store.add_subparsers(dest="store_command", required=True)
    migrate = commands.add_parser(
        "migrate", help="apply the PostgreSQL store's pending schema steps"
    )
    migrate.add_argument(
        "url",
        nargs="?",
        default=env("store"),
        help="postgresql://USER@HOST/DB (default: TURNMESH_STORE)",
    )
    migrate.add_argument(
        "--check", action="store_true", help="apply nothing: exit 1 if steps are pending"
    )


def run_store(args: argparse.Namespace) -> int:
    url = args.url or ""
    if not url.startswith(POSTGRES):
        print(
            "turnmesh store migrate: needs a postgresql:// URL (SQLite and Redis"
            " bring their data up to date when a server opens them)",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(_migrate(url, args.check))


async def _migrate(url: str, check: bool) -> int:
    import psycopg

    from turnmesh.server.stores import pg_schema
    from turnmesh.server.stores.pg_client import redacted, settings

    try:
        conn = await psycopg.AsyncConnection.connect(settings(url).conninfo, autocommit=True)
    except psycopg.OperationalError as exc:
        print(f"turnmesh store migrate: cannot reach {redacted(url)}: {exc}", file=sys.stderr)
        return 2
    async with conn:
        try:
            pending = await pg_schema.pending(conn)
            if check:
                for version, name in pending:
                    print(f"pending: {version} {name}")
                if pending:
                    print(
                        f"the schema is behind: {len(pending)} step(s) pending"
                        f" (latest is {pg_schema.LATEST}); run `turnmesh store migrate`",
                        file=sys.stderr,
                    )
                    return 1
                print(f"the schema is current (version {pg_schema.LATEST})")
                return 0
            for version, name in await pg_schema.migrate(conn):
                print(f"applied: {version} {name}")
        except RuntimeError as exc:  # a database of a newer turnmesh
            print(f"turnmesh store migrate: {exc}", file=sys.stderr)
            return 2
    print(f"the schema is current (version {pg_schema.LATEST})")
    return 0
