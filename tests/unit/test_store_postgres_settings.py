"""The PostgreSQL store's settings, without a database: its URL parameters,
and the mesh-wide limits it refuses rather than keeping per server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from turnmesh.cli._up_config import UpConfig
from turnmesh.cli.up import _preflight
from turnmesh.server import ServerConfig
from turnmesh.server.stores import open_store
from turnmesh.server.stores.pg_client import MAX_CONNECTIONS, pool, redacted, settings
from turnmesh.server.stores.postgres import PostgresStore


def test_pool_and_timeouts_come_from_the_url_and_libpq_sees_the_rest() -> None:
    found = settings(
        "postgresql://tm@db/turns?sslmode=require&pool_max=20&pool_min=4"
        "&statement_timeout_ms=2500&pool_timeout_ms=750"
    )
    assert found.conninfo == "postgresql://tm@db/turns?sslmode=require"
    assert (found.min_size, found.max_size) == (4, 20)
    assert (found.statement_timeout_ms, found.checkout_seconds) == (2500, 0.75)
    assert settings("postgres://tm@db/turns").max_size == MAX_CONNECTIONS
    for bad in ("pool_max=x", "pool_min=5&pool_max=2", "pool_max=0", "pool_timeout_ms=0"):
        with pytest.raises(ValueError, match="store URL"):
            settings(f"postgresql://tm@db/turns?{bad}")


def test_the_urls_own_options_and_connect_timeout_are_kept() -> None:
    """A `search_path` in libpq's `options` joins the pool's statement timeout
    instead of being replaced by it."""
    found = settings(
        "postgresql://tm@db/turns?options=-csearch_path%3Dtm&connect_timeout=2&pool_max=3"
    )
    assert found.conninfo == "postgresql://tm@db/turns"
    assert (found.options, found.connect_timeout, found.max_size) == ("-csearch_path=tm", 2, 3)
    kwargs = pool(found).kwargs
    assert isinstance(kwargs, dict)
    assert kwargs["options"] == "-csearch_path=tm -c statement_timeout=10000"
    assert kwargs["connect_timeout"] == 2


def test_a_password_never_reaches_a_message() -> None:
    assert redacted("postgresql://tm:hunter2@db:5432/t") == "postgresql://tm:***@db:5432/t"
    assert redacted("postgresql://tm@db/t") == "postgresql://tm@db/t"
    assert redacted("postgresql://:hunter2@db/t") == "postgresql://:***@db/t"
    assert (
        redacted("postgresql://db/t?sslmode=require&password=hunter2")
        == "postgresql://db/t?sslmode=require&password=***"
    )


def test_open_store_picks_postgresql_without_connecting() -> None:
    for url in ("postgresql://tm@127.0.0.1:1/t", "postgres://tm@127.0.0.1:1/t"):
        assert isinstance(open_store(url, 600), PostgresStore)


@pytest.mark.parametrize("limits", [{"rate_limit": 5.0}, {"max_turns_per_principal": 3}])
def test_mesh_wide_limits_are_refused_on_postgresql(limits: dict[str, float]) -> None:
    with pytest.raises(ValidationError, match="kept for the whole mesh in Redis only"):
        ServerConfig.model_validate(
            {"router_address": "127.0.0.1:1", "store": "postgresql://tm@db/t", **limits}
        )
    # Kept by Redis for the whole mesh; by a store of one server, for it.
    for store in ("redis://127.0.0.1:6379/0", "sqlite:/tmp/x.db", "memory"):
        config = ServerConfig.model_validate(
            {"router_address": "127.0.0.1:1", "store": store, **limits}
        )
        assert config.store == store


def test_up_runs_several_servers_on_one_postgresql_database() -> None:
    """Leases share the database between servers (unlike SQLite's one file)."""
    _preflight(UpConfig.model_validate({"servers": 2, "port": 0, "store": "postgresql://tm@db/t"}))
