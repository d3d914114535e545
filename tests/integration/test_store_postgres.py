"""What only the PostgreSQL store does (the contract itself runs in
test_stores.py): versioned migrations applied once however many servers
start together, checked without applying (``turnmesh store migrate``); one
server per database; the database failing a call is the store being
unavailable, never a driver's error."""

from __future__ import annotations

import asyncio
import signal
import uuid

import psycopg
import pytest

from tests.support.mesh import Mesh, eventually
from tests.support.postgres import PostgresServer
from turnmesh.cli.main import main
from turnmesh.client import AsyncClient, UnavailableError
from turnmesh.runtime.errors import InvalidArgument, Unavailable
from turnmesh.server.stores import open_store, pg_schema
from turnmesh.server.stores.base import SessionRecord, TurnAbandoned
from turnmesh.server.stores.postgres import PostgresStore
from turnmesh.server.webhooks.outbox import Delivery
from turnmesh.v1 import event_pb2, message_pb2


@pytest.fixture
def fresh_url(postgres_server: PostgresServer) -> str:
    """A database of its own, empty (no schema yet)."""
    return postgres_server.database(f"fresh_{uuid.uuid4().hex[:12]}")


def _store(url: str) -> PostgresStore:
    store = open_store(url, 600)
    assert isinstance(store, PostgresStore)
    return store


async def _until_a_lock_is_waited_for(url: str, what: str) -> None:
    """Until a session of the database waits for a lock (``what`` does)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as seen:

        async def waiting() -> bool:
            cur = await seen.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            row = await cur.fetchone()
            return bool(row and row[0])

        await eventually(waiting, what=what)


def _migrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["store", "migrate", *args])
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def test_migrate_checks_then_applies_the_pending_steps(
    fresh_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _migrate(capsys, "--check", fresh_url)
    assert code == 1
    assert [line.split()[1] for line in out.splitlines()] == [str(v) for v, *_ in pg_schema.STEPS]
    assert "pending" in err and "turnmesh store migrate" in err
    code, out, _ = _migrate(capsys, fresh_url)
    assert code == 0 and out.startswith("applied: 1 ")
    code, out, _ = _migrate(capsys, "--check", fresh_url)
    assert (code, out.strip()) == (0, f"the schema is current (version {pg_schema.LATEST})")
    # Applied again: nothing to do, nothing applied twice.
    code, out, _ = _migrate(capsys, fresh_url)
    assert code == 0 and "applied" not in out
    with psycopg.connect(fresh_url) as conn:
        rows = conn.execute("SELECT version FROM turnmesh_schema ORDER BY version").fetchall()
    assert [row[0] for row in rows] == [v for v, *_ in pg_schema.STEPS]


def test_migrate_refuses_what_is_not_postgresql(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _migrate(capsys, "--check", "redis://127.0.0.1:1/0")
    assert code == 2 and "postgresql://" in err


async def test_servers_starting_together_apply_the_migrations_once(fresh_url: str) -> None:
    conns = [await psycopg.AsyncConnection.connect(fresh_url, autocommit=True) for _ in range(4)]
    try:
        applied = await asyncio.gather(*(pg_schema.migrate(conn) for conn in conns))
        # One applied every step; the others, queued on the lock, found none pending.
        assert sorted(len(steps) for steps in applied) == [0, 0, 0, len(pg_schema.STEPS)]
        assert await pg_schema.pending(conns[0]) == []
    finally:
        for conn in conns:
            await conn.close()


async def test_a_database_of_a_newer_turnmesh_is_refused(fresh_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_url, autocommit=True) as conn:
        await pg_schema.migrate(conn)
        await conn.execute("INSERT INTO turnmesh_schema (version, name) VALUES (999, 'future')")
    store = _store(fresh_url)
    try:
        with pytest.raises(RuntimeError, match="schema version 999, from a newer turnmesh"):
            await store.open()
    finally:
        await store.close()


async def test_servers_share_a_database(fresh_url: str) -> None:
    """Leases, not a lock, decide who owns a session: several stores open one
    database at once, and the schema is migrated once."""
    first, second = _store(fresh_url), _store(fresh_url)
    await first.open()
    await second.open()
    try:
        assert first.shared and second.shared
    finally:
        await second.close()
        await first.close()


async def test_a_statement_past_its_timeout_is_the_store_unavailable(fresh_url: str) -> None:
    """A session row held elsewhere (a stuck transaction): the store's
    statement is cancelled at its timeout, and the caller sees Unavailable."""
    store = _store(fresh_url + "?statement_timeout_ms=100")
    await store.open()
    try:
        await store.create(SessionRecord("s1", "demo", 1.0, 1.0))
        async with await psycopg.AsyncConnection.connect(fresh_url) as holder:
            await holder.execute("SELECT 1 FROM sessions WHERE session_id = 's1' FOR UPDATE")
            with pytest.raises(Unavailable, match="the session store is unavailable"):
                await store.touch("s1", 2.0)
            await holder.rollback()
        await store.touch("s1", 3.0)  # released: served again
        record = await store.get("s1")
        assert record is not None and record.last_activity == 3.0
    finally:
        await store.close()


async def test_an_unreachable_database_is_the_store_unavailable() -> None:
    refused = "postgresql://postgres@127.0.0.1:1/none?pool_min=0&pool_timeout_ms=300"
    store = _store(refused)
    try:
        with pytest.raises(Unavailable) as raised:
            await store.open()
        assert "127.0.0.1" not in str(raised.value)  # the driver's text stays in the log
    finally:
        await store.close()


async def test_a_database_restart_is_unavailable_then_served_again() -> None:
    """The database goes away under an open store: calls are Unavailable
    (a retryable 503), nothing half-written; it comes back: the pool finds
    new connections and every session is there."""
    server = PostgresServer()  # its own: the shared one stays up for the others
    try:
        store = _store(server.database("restart") + "?pool_timeout_ms=500")
        await store.open()
        try:
            await store.create(SessionRecord("s1", "demo", 1.0, 1.0))
            server.halt()
            with pytest.raises(Unavailable):
                await store.append_messages("s1", [message_pb2.Message(content="lost")], 2.0)
            server.start()

            async def served() -> bool:
                try:
                    return await store.get("s1") is not None
                except Unavailable:
                    return False  # the pool is still reconnecting

            await eventually(served, timeout=30, what="the store to serve again")
            assert await store.history("s1") == []
            await store.append_messages("s1", [message_pb2.Message(content="kept")], 3.0)
            assert [m.content for m in await store.history("s1")] == ["kept"]
        finally:
            await store.close()
    finally:
        server.stop()


async def test_owner_tokens_fence_commits_and_member_leases_lapse(fresh_url: str) -> None:
    """What leases need of the store (kept for when it is shared), as
    Redis's test shows it: a commit under a replaced owner token writes
    nothing; a member's lease holds its address until dropped."""
    store = _store(fresh_url)
    await store.open()
    try:
        record = SessionRecord("s1", "demo", 1.0, 1.0, owner="server-a/1")
        await store.create(record)
        assert await store.owner_of("s1") == "server-a/1"

        def final(turn_id: str) -> event_pb2.Event:
            return event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, run_id=turn_id)

        def said(text: str) -> list[message_pb2.Message]:
            return [message_pb2.Message(role="user", content=text)]

        await store.commit_turn("s1", said("a"), final("t1"), 1, "server-a/1")
        assert await store.swap_owner("s1", "server-a/0", "server-b/1") is False
        assert await store.swap_owner("s1", "server-a/1", "server-b/1") is True
        with pytest.raises(TurnAbandoned):
            await store.commit_turn("s1", said("late"), final("t2"), 2, "server-a/1")
        await store.commit_turn("s1", said("b"), final("t3"), 3, "server-b/1")
        assert [m.content for m in await store.history("s1")] == ["a", "b"]
        assert await store.read_events("s1", "t2") is None
        assert await store.owners_of(["s1", "none"]) == ["server-b/1", None]
        assert await store.swap_owner("none", "", "x") is None
        # Member leases, on the database's clock: an address while they last.
        await store.hold_member("m1", "127.0.0.1:5", 60_000)
        lease = await store.member_lease("m1")
        assert lease is not None and lease[0] == "127.0.0.1:5" and 0 < lease[1] <= 60
        assert await store.take_address("m2", "127.0.0.1:5", 60_000) == "m1"
        assert await store.take_address("m3", "127.0.0.1:6", 60_000) is None
        await store.drop_member("m1")
        assert await store.member_lease("m1") is None
        await store.hold_member("m4", "127.0.0.1:7", 0)  # lapsed as it was written
        assert await store.member_lease("m4") is None
        assert await store.take_address("m5", "127.0.0.1:7", 60_000) is None
    finally:
        await store.close()


async def test_sessions_on_postgresql_survive_a_server_restart(
    mesh_factory: Mesh, fresh_url: str
) -> None:
    """A real server on a new database: it applies the schema at start,
    commits turns there, and the next server on the database serves them."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("demo", "demo")
    first = mesh.spawn_server("server-a", "--store", fresh_url)
    mesh.wait_ready(worker, first)
    async with AsyncClient(first.address) as client:
        sid = (await client.create_session()).session_id
        done = await client.send(sid, "What is 12*(3+4)?")
    mesh.kill(first, signal.SIGTERM)

    second = mesh.spawn_server("server-b", "--store", fresh_url)
    mesh.wait_ready(second)
    async with AsyncClient(second.address) as client:
        assert [m.role for m in await client.history(sid)] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        replay = [e async for e in client.subscribe(sid, done.turn_id)]
        assert replay == done.events
        again = await client.send(sid, "What did I ask first?")
        assert "What is 12*(3+4)?" in again.text


async def test_a_mesh_whose_database_restarts_mid_turn_fails_it_cleanly_and_recovers(
    mesh_factory: Mesh,
) -> None:
    """Two servers on a database that goes away while a turn runs: the turn
    ends with a clean error and writes nothing, calls meanwhile are retryable
    503s, and once the database is back the same sessions take turns again,
    their histories whole."""
    server = PostgresServer()  # its own: the shared one stays up for the others
    try:
        url = server.database("mesh_restart") + "?pool_timeout_ms=500"
        mesh = mesh_factory
        mesh.start_router()
        worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
        servers = [
            mesh.spawn_server(name, "--store", url, "--lease-seconds", "2") for name in ("a", "b")
        ]
        mesh.wait_ready(worker, *servers)
        gate = f"pg-{uuid.uuid4().hex[:8]}"
        async with AsyncClient(servers[0].address) as client:
            sid = (await client.create_session(agent="probe")).session_id
            first = await client.send(sid, "one", metadata={"deltas": 1, "delay_ms": 1})
            async with client.stream_turn(
                sid, "two", metadata={"deltas": 2, "delay_ms": 1, "gate": gate}
            ) as stream:
                async for event in stream:
                    if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                        break
                server.halt()
                (mesh.probe_dir / f"gate-{gate}").write_text("open")
                rest = [event async for event in stream]
            # The turn could not commit: it ends with an error, not RUN_FINISHED.
            assert rest[-1].type == event_pb2.RUN_ERROR, rest[-1]
            with pytest.raises(UnavailableError) as refused:
                await client.send(sid, "while it is down", metadata={"deltas": 1})
            assert refused.value.retry_after is not None
            server.start()

            async def served() -> bool:
                try:
                    return bool(await client.history(sid))
                except UnavailableError:
                    return False  # pools and leases still coming back

            await eventually(served, timeout=60, what="the mesh to serve the session again")
            assert [m.content for m in await client.history(sid)] == ["one", "part0 "]
            again = await client.send(sid, "three", metadata={"deltas": 1, "delay_ms": 1})
            assert again.text == "part0 "
            history = [m.content for m in await client.history(sid)]
            assert history == ["one", "part0 ", "three", "part0 "]
            assert first.turn_id != again.turn_id
    finally:
        server.stop()


async def test_session_counts_are_kept_and_backfilled_by_the_migration(fresh_url: str) -> None:
    """`--max-sessions` reads a count kept by a trigger, not a scan: it follows
    creates and deletes per principal, and schema step 3 counts the sessions
    a database already held."""
    store = _store(fresh_url)
    await store.open()
    try:
        for sid in ("acme/a", "acme/b", "zed/c"):
            await store.create(SessionRecord(sid, "demo", 1.0, 1.0))
        await store.delete("acme/b")
        assert (await store.count(), await store.count_of("acme")) == (2, 1)
        # A database from before step 3, holding sessions: the step counts them.
        async with await psycopg.AsyncConnection.connect(fresh_url, autocommit=True) as conn:
            await conn.execute(
                b"DROP TRIGGER webhooks_counted ON webhook_outbox;"
                b" DROP FUNCTION turnmesh_count_webhooks(); DROP TABLE webhook_counts;"
                b" DROP TRIGGER sessions_counted ON sessions;"
                b" DROP FUNCTION turnmesh_count_sessions(); DROP TABLE session_counts;"
                b" DROP INDEX a2a_push_configs_by_expiry;"
                b" DELETE FROM turnmesh_schema WHERE version >= 3"
            )
            await store.create(SessionRecord("zed/d", "demo", 1.0, 1.0))  # uncounted
            assert [v for v, _ in await pg_schema.migrate(conn)] == [3, 4, 5]
        assert (await store.count(), await store.count_of("zed")) == (3, 2)
        assert await store.count_of("nobody") == 0
    finally:
        await store.close()


async def test_step_5_shards_the_session_counts_and_counts_the_outbox(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database of step 4, holding sessions and queued webhooks, upgraded:
    each principal's count is spread over the shards and sums to its
    sessions, the outbox's bounds count what was queued before, and both
    follow creates, deletes, adds and deliveries after."""
    monkeypatch.setattr(pg_schema, "STEPS", pg_schema.STEPS[:4])
    monkeypatch.setattr(pg_schema, "LATEST", 4)
    store = _store(fresh_url)
    await store.open()
    try:
        for n in range(40):
            await store.create(SessionRecord(f"acme/s{n}", "demo", 1.0, 1.0))
        await store.create(SessionRecord("zed/only", "demo", 1.0, 1.0))
        async with await psycopg.AsyncConnection.connect(fresh_url, autocommit=True) as conn:
            for n in range(3):  # queued by a server of step 4 (count(*) then)
                await conn.execute(
                    "INSERT INTO webhook_outbox (id, url, body, attempts, due, owner)"
                    " VALUES (%s, 'http://127.0.0.1:9/h', '', 0, 0, %s)",
                    (f"d{n}", "acme" if n else "zed"),
                )
            monkeypatch.undo()
            assert [v for v, _ in await pg_schema.migrate(conn)] == [5]
            cur = await conn.execute(
                "SELECT count(*), sum(sessions) FROM session_counts WHERE principal = 'acme'"
            )
            rows, counted = await cur.fetchone() or (0, 0)
            assert counted == 40 and rows > 4  # 40 sessions over 16 shards
        assert (await store.count(), await store.count_of("acme")) == (41, 40)
        await store.delete("acme/s7")
        await store.create(SessionRecord("zed/two", "demo", 1.0, 1.0))
        assert (await store.count_of("acme"), await store.count_of("zed")) == (39, 2)
        outbox = store.outbox()
        # 3 queued: a bound of 4 takes one more, acme's own bound of 2 none.
        assert not await outbox.add(Delivery("d9", "http://127.0.0.1:9/h", b"", owner="acme"), 9, 2)
        assert await outbox.add(Delivery("d3", "http://127.0.0.1:9/h", b"", owner="zed"), 4)
        assert not await outbox.add(Delivery("d4", "http://127.0.0.1:9/h", b"", owner="zed"), 4)
        await outbox.settle(Delivery("d1", "http://127.0.0.1:9/h", b"", owner="acme"), None)
        assert await outbox.add(Delivery("d4", "http://127.0.0.1:9/h", b"", owner="zed"), 4)
        assert await outbox.add(Delivery("d5", "http://127.0.0.1:9/h", b"", owner="acme"), 9, 2)
    finally:
        await store.close()


async def test_step_5_goes_through_while_an_older_server_writes(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling upgrade: an older server's transaction holds the sessions
    table (a write) when step 5 starts, then deletes a session, whose count
    the step holds: a deadlock. The migration is rolled back and tried
    again until it goes through; the counts then hold exactly the sessions
    there are."""
    monkeypatch.setattr(pg_schema, "STEPS", pg_schema.STEPS[:4])
    monkeypatch.setattr(pg_schema, "LATEST", 4)
    store = _store(fresh_url)
    await store.open()
    monkeypatch.undo()
    try:
        for n in range(3):
            await store.create(SessionRecord(f"acme/s{n}", "demo", 1.0, 1.0))
        async with await psycopg.AsyncConnection.connect(fresh_url) as old:
            await old.execute("UPDATE sessions SET last_activity = 2 WHERE session_id = 'acme/s0'")

            async def migrating() -> list[tuple[int, str]]:
                async with await psycopg.AsyncConnection.connect(
                    fresh_url, autocommit=True
                ) as conn:
                    return await pg_schema.migrate(conn)

            migration = asyncio.ensure_future(migrating())
            await _until_a_lock_is_waited_for(fresh_url, "the migration to wait for the write")
            try:
                await old.execute("DELETE FROM sessions WHERE session_id = 'acme/s1'")
                await old.commit()
            except psycopg.errors.DeadlockDetected:
                await old.rollback()  # the older server's write failed instead
            assert [v for v, _ in await migration] == [5]
        async with await psycopg.AsyncConnection.connect(fresh_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT count(*) FROM sessions WHERE principal = 'acme'")
            row = await cur.fetchone()
        assert row is not None and row[0] in (2, 3)
        assert await store.count_of("acme") == row[0]
    finally:
        await store.close()


async def test_a_delete_racing_a_commit_leaves_nothing_of_the_session(fresh_url: str) -> None:
    """A commit holds the session's row and writes its messages and checkpoint
    while a delete waits for the row: once the commit is in, the delete takes
    everything the commit wrote, so the id made again starts empty."""
    store = _store(fresh_url)
    await store.open()
    try:
        await store.create(SessionRecord("acme/s", "demo", 1.0, 1.0))
        async with await psycopg.AsyncConnection.connect(fresh_url) as writer:
            await writer.execute("SELECT 1 FROM sessions WHERE session_id = 'acme/s' FOR UPDATE")
            await writer.execute("INSERT INTO messages VALUES ('acme/s', 0, 'x')")
            await writer.execute("INSERT INTO checkpoints VALUES ('acme/s', 'cp')")
            deleting = asyncio.ensure_future(store.delete("acme/s"))
            await _until_a_lock_is_waited_for(fresh_url, "the delete to wait for the row")
            await writer.commit()
        assert await deleting is True
        async with await psycopg.AsyncConnection.connect(fresh_url, autocommit=True) as conn:
            for table in ("messages", "checkpoints"):
                cur = await conn.execute(
                    f"SELECT count(*) FROM {table} WHERE session_id = 'acme/s'"
                )
                assert await cur.fetchone() == (0,), table
        await store.create(SessionRecord("acme/s", "demo", 2.0, 2.0))
        assert await store.history("acme/s") == []
        assert await store.checkpoint("acme/s") == b""
    finally:
        await store.close()


async def test_a_value_no_column_holds_is_invalid_and_writes_nothing(fresh_url: str) -> None:
    """Past validation (a caller of the store itself), a NUL in text is the
    caller's 400, not a driver's error."""
    store = _store(fresh_url)
    await store.open()
    try:
        await store.create(SessionRecord("acme/s", "demo", 1.0, 1.0))
        with pytest.raises(InvalidArgument):
            await store.get_key("acme/s", "a\x00b")
        assert await store.get_key("acme/s", "ab") is None
    finally:
        await store.close()
