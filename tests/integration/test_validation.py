"""Every request validation rule, against the real mesh over raw gRPC.

A bad request is INVALID_ARGUMENT with one ``google.rpc.BadRequest`` field
violation per bad field, its message names no internals, and it changes
nothing. Each bad request goes to both servers: the session's owner and a
server that would forward it (validation happens before forwarding). Raw stubs
let requests carry values the typed client never builds (policy=99, ...).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2

from tests.conftest import SharedMesh
from turnmesh.client import AsyncClient, InvalidArgumentError
from turnmesh.runtime.serving import CHANNEL_OPTIONS
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

if TYPE_CHECKING:
    from turnmesh.v1.router_service_pb2_grpc import RouterServiceAsyncStub
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub

MB = 1024 * 1024
MAX_FILE = 50 * MB
MAX_MESSAGE = 10_000
MAX_METADATA = 64 * 1024
TIMEOUT = 30.0
# What a status message must never carry: tracebacks, exception class names.
LEAKS = re.compile(
    r"Traceback|File \"|\b[A-Za-z_]*(?:Error|Exception)\b|\bInvalidArgument\b|\bNotFound\b"
    r"|\bAlreadyExists\b|\bturnmesh\.\w|\bgrpc\.\w"
)
BAD_SESSION_IDS = [
    pytest.param("", id="empty"),
    pytest.param("a b", id="space"),
    pytest.param("a/b", id="slash"),
    pytest.param("ü", id="non-ascii"),
    pytest.param("x" * 129, id="129-chars"),
]

File = message_pb2.File
FileFactory = Callable[[], list[message_pb2.File]]


# Plumbing --------------------------------------------------------------------


@dataclass
class Api:
    """Raw stubs on both servers and on the router."""

    stubs: list[SessionServiceAsyncStub]
    member_ids: list[str]
    router: RouterServiceAsyncStub

    async def owner_first(self, session_id: str) -> list[SessionServiceAsyncStub]:
        """Both servers, the session's owner first: the other one forwards."""
        route = await self.router.Route(
            rpb.RouteRequest(session_id=session_id, lookup_only=True), timeout=TIMEOUT
        )
        owner = self.member_ids.index(route.owner.member_id)
        return [self.stubs[owner], self.stubs[1 - owner]]

    async def has_owner(self, session_id: str) -> bool:
        try:
            await self.router.Route(
                rpb.RouteRequest(session_id=session_id, lookup_only=True), timeout=TIMEOUT
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise
        return True

    async def create(self, agent: str = "echo", via: int = 0) -> str:
        response = await self.stubs[via].CreateSession(
            spb.CreateSessionRequest(agent_name=agent), timeout=TIMEOUT
        )
        return response.session.session_id

    async def snapshot(self, session_id: str) -> tuple[list[message_pb2.Message], int]:
        history = await self.stubs[0].GetHistory(
            spb.GetHistoryRequest(session_id=session_id), timeout=TIMEOUT
        )
        session = await self.stubs[1].GetSession(
            spb.GetSessionRequest(session_id=session_id), timeout=TIMEOUT
        )
        return list(history.messages), session.session.message_count

    async def active_sessions(self) -> int:
        total = 0
        for stub in self.stubs:
            total += (await stub.GetHealth(spb.GetHealthRequest(), timeout=TIMEOUT)).active_sessions
        return total


@dataclass(frozen=True)
class Seeded:
    """An echo session with one finished turn (so its history is not empty)."""

    session_id: str
    turn_id: str


async def turn(stub: SessionServiceAsyncStub, request: spb.TurnRequest) -> list[event_pb2.Event]:
    return [event async for event in stub.Turn(request, timeout=TIMEOUT)]


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def assert_invalid(
    exc: grpc.aio.AioRpcError, fields: tuple[str, ...] | list[str]
) -> dict[str, list[str]]:
    """INVALID_ARGUMENT naming exactly ``fields`` (with repeats); returns the
    descriptions by field."""
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
    message = exc.details() or ""
    assert not LEAKS.search(message), message
    blobs = [v for k, v in exc.trailing_metadata() or () if k == "grpc-status-details-bin"]
    assert len(blobs) == 1, exc.trailing_metadata()
    status = status_pb2.Status.FromString(blobs[0])
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert status.message == message
    requests = [d for d in status.details if d.Is(error_details_pb2.BadRequest.DESCRIPTOR)]
    assert len(requests) == 1, status
    bad = error_details_pb2.BadRequest()
    requests[0].Unpack(bad)
    got = sorted(v.field for v in bad.field_violations)
    assert got == sorted(fields), message
    descriptions: dict[str, list[str]] = {}
    for violation in bad.field_violations:
        assert violation.description, violation
        assert not LEAKS.search(violation.description), violation.description
        assert violation.field in message  # the summary names every bad field
        descriptions.setdefault(violation.field, []).append(violation.description)
    return descriptions


def metadata_of_size(size: int) -> struct_pb2.Struct:
    """A Struct whose wire size is exactly ``size`` bytes."""
    for key_len in range(1, 4):
        for n in range(size - 16, size):
            meta = struct_pb2.Struct()
            meta.update({"k" * key_len: "x" * n})
            if meta.ByteSize() == size:
                return meta
    raise AssertionError(f"no Struct of exactly {size} bytes")


def sized(*sizes: int, mime: str = "text/plain") -> FileFactory:
    """Files of the given sizes; each distinct size's bytes are built once."""

    def build() -> list[message_pb2.File]:
        blobs: dict[int, bytes] = {}
        for n in sizes:
            if n not in blobs:
                blobs[n] = b"a" * n
        return [
            File(content=blobs[n], mime_type=mime, filename=f"f{i}.txt")
            for i, n in enumerate(sizes)
        ]

    return build


def files(*specs: tuple[bytes, str, str]) -> FileFactory:
    """Small files from (content, mime_type, filename)."""
    return lambda: [File(content=c, mime_type=m, filename=f) for c, m, f in specs]


@pytest.fixture(scope="module")
async def api(shared_mesh: SharedMesh) -> AsyncIterator[Api]:
    channels = [
        grpc.aio.insecure_channel(s.address, options=CHANNEL_OPTIONS) for s in shared_mesh.servers
    ]
    router_channel = grpc.aio.insecure_channel(shared_mesh.router.address, options=CHANNEL_OPTIONS)
    try:
        yield Api(
            stubs=[SessionServiceStub(c) for c in channels],
            member_ids=[s.member_id for s in shared_mesh.servers],
            router=RouterServiceStub(router_channel),
        )
    finally:
        for channel in [*channels, router_channel]:
            await channel.close()


@pytest.fixture(scope="module")
async def seeded(api: Api) -> AsyncIterator[Seeded]:
    sid = await api.create("echo")
    events = await turn(api.stubs[1], spb.TurnRequest(session_id=sid, message="seed turn"))
    assert events[-1].type == event_pb2.RUN_FINISHED
    owner, other = await api.owner_first(sid)
    assert owner is not other  # one server owns it, the other forwards
    yield Seeded(sid, events[0].run_id)
    await api.stubs[0].DeleteSession(spb.DeleteSessionRequest(session_id=sid), timeout=TIMEOUT)


# Turn ------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnCase:
    fields: tuple[str, ...]
    message: str = "hello"
    session_id: str | None = None  # None: the seeded session
    files: FileFactory | None = None
    policy: int = spb.TURN_POLICY_UNSPECIFIED
    on_disconnect: int = spb.DISCONNECT_POLICY_UNSPECIFIED
    idempotency_key: str = ""
    metadata: Callable[[], struct_pb2.Struct] | None = None
    # Text a violation's description must contain: {field: text}.
    mentions: dict[str, str] = field(default_factory=dict)

    def request(self, seeded_id: str) -> spb.TurnRequest:
        request = spb.TurnRequest(
            session_id=seeded_id if self.session_id is None else self.session_id,
            message=self.message,
            files=self.files() if self.files else [],
            policy=self.policy,  # type: ignore[arg-type]
            on_disconnect=self.on_disconnect,  # type: ignore[arg-type]
            idempotency_key=self.idempotency_key,
        )
        if self.metadata:
            request.metadata.CopyFrom(self.metadata())
        return request


TEXT = "text/plain"
ZIP = "application/zip"
TURN_CASES = [
    # message
    pytest.param(TurnCase(("message",), message=""), id="message-empty"),
    pytest.param(TurnCase(("message",), message="   \n\t"), id="message-blank"),
    pytest.param(TurnCase(("message",), message="a" * 10_001), id="message-10001"),
    pytest.param(TurnCase(("message",), message="ü" * 10_001), id="message-10001-non-ascii"),
    # session_id
    pytest.param(TurnCase(("session_id",), session_id=""), id="session_id-empty"),
    pytest.param(TurnCase(("session_id",), session_id="a b"), id="session_id-space"),
    pytest.param(TurnCase(("session_id",), session_id="a/b"), id="session_id-slash"),
    pytest.param(TurnCase(("session_id",), session_id="ü"), id="session_id-non-ascii"),
    pytest.param(TurnCase(("session_id",), session_id="x" * 129), id="session_id-129"),
    # files
    pytest.param(TurnCase(("files",), files=sized(*[1] * 11)), id="files-11"),
    pytest.param(
        TurnCase(
            ("files[0].mime_type",),
            files=files((b"PK", ZIP, "report.zip")),
            mentions={"files[0].mime_type": "report.zip"},
        ),
        id="mime-not-allowed-named",
    ),
    pytest.param(
        TurnCase(
            ("files[0].mime_type",),
            files=files((b"PK", ZIP, "")),
            mentions={"files[0].mime_type": ZIP},
        ),
        id="mime-not-allowed-unnamed",
    ),
    pytest.param(
        TurnCase(
            ("files[1].mime_type",),
            files=files((b"a", TEXT, "a.txt"), (b"b", "", "notes")),
            mentions={"files[1].mime_type": "notes"},
        ),
        id="mime-missing",
    ),
    pytest.param(
        TurnCase(("files[0].content",), files=files((b"", TEXT, "empty.txt"))),
        id="content-empty",
    ),
    pytest.param(
        TurnCase(
            ("files[1].content",),
            files=files((b"a", TEXT, "a.txt"), (b"", TEXT, "empty.txt")),
            mentions={"files[1].content": "empty.txt"},
        ),
        id="content-empty-second",
    ),
    pytest.param(TurnCase(("files[0].content",), files=sized(MAX_FILE + 1)), id="file-50MB-plus-1"),
    pytest.param(TurnCase(("files",), files=sized(MAX_FILE, MAX_FILE, 1)), id="files-100MB-plus-1"),
    pytest.param(
        TurnCase(("files[0].filename",), files=files((b"a", TEXT, "n" * 256))),
        id="filename-256",
    ),
    # enums, idempotency key, metadata
    pytest.param(TurnCase(("policy",), policy=99), id="policy-99"),
    pytest.param(TurnCase(("policy",), policy=-1), id="policy-negative"),
    pytest.param(TurnCase(("on_disconnect",), on_disconnect=7), id="on_disconnect-7"),
    pytest.param(TurnCase(("idempotency_key",), idempotency_key="k" * 257), id="key-257"),
    pytest.param(
        TurnCase(("metadata",), metadata=lambda: metadata_of_size(MAX_METADATA + 1)),
        id="metadata-64KiB-plus-1",
    ),
    # several at once: all reported in one error
    pytest.param(
        TurnCase(
            ("message", "policy", "files[0].mime_type"),
            message="",
            policy=99,
            files=files((b"PK", ZIP, "a.zip")),
        ),
        id="several-message-policy-mime",
    ),
    pytest.param(
        TurnCase(
            (
                "session_id",
                "message",
                "files",
                "files[3].mime_type",
                "files[10].content",
                "files[10].filename",
                "policy",
                "on_disconnect",
                "idempotency_key",
                "metadata",
            ),
            session_id="a/b",
            message=" ",
            files=lambda: [
                *sized(*[1] * 3)(),
                File(content=b"x", mime_type="text/html"),
                *sized(*[1] * 6)(),
                File(content=b"", mime_type=TEXT, filename="n" * 300),
            ],
            policy=5,
            on_disconnect=3,
            idempotency_key="k" * 300,
            metadata=lambda: metadata_of_size(MAX_METADATA + 100),
        ),
        id="several-everything",
    ),
]


@pytest.mark.parametrize("case", TURN_CASES)
async def test_bad_turn_is_rejected_and_changes_nothing(
    api: Api, seeded: Seeded, case: TurnCase
) -> None:
    before = await api.snapshot(seeded.session_id)
    request = case.request(seeded.session_id)
    for stub in await api.owner_first(seeded.session_id):
        descriptions = assert_invalid(await rpc_error(turn(stub, request)), case.fields)
        for name, text in case.mentions.items():
            assert any(text in d for d in descriptions[name]), descriptions
    del request
    assert await api.snapshot(seeded.session_id) == before


@pytest.mark.parametrize(
    ("message", "via"),
    [
        pytest.param("a" * MAX_MESSAGE, 0, id="ascii-server-1"),
        pytest.param("ü" * MAX_MESSAGE, 1, id="non-ascii-server-2"),
    ],
)
async def test_message_of_exactly_10000_characters_passes(api: Api, message: str, via: int) -> None:
    sid = await api.create("echo")
    assert await api.snapshot(sid) == ([], 0)
    events = await turn(api.stubs[via], spb.TurnRequest(session_id=sid, message=message))
    assert events[0].type == event_pb2.RUN_STARTED
    assert events[-1].type == event_pb2.RUN_FINISHED, events[-1]
    deltas = [e.delta for e in events if e.type == event_pb2.TEXT_MESSAGE_CONTENT]
    assert deltas == [message]  # one word: one delta
    history, count = await api.snapshot(sid)
    assert count == 2
    assert [(m.role, m.content) for m in history] == [("user", message), ("assistant", message)]
    await api.stubs[via].DeleteSession(spb.DeleteSessionRequest(session_id=sid), timeout=TIMEOUT)


async def test_file_of_exactly_50_MB_passes_through_a_forwarding_server(api: Api) -> None:
    sid = await api.create("echo")
    _, forwarder = await api.owner_first(sid)
    request = spb.TurnRequest(session_id=sid, message="one big file", files=sized(MAX_FILE)())
    events = await turn(forwarder, request)
    del request
    assert events[-1].type == event_pb2.RUN_FINISHED, events[-1]
    history, count = await api.snapshot(sid)
    assert count == 2
    assert [(f.mime_type, f.filename, f.size_bytes) for f in history[0].files] == [
        (TEXT, "f0.txt", MAX_FILE)
    ]
    await api.stubs[0].DeleteSession(spb.DeleteSessionRequest(session_id=sid), timeout=TIMEOUT)


async def test_every_other_limit_at_its_boundary_passes(api: Api) -> None:
    """10 files, 100 MB in all, a 255-character filename, a 256-character key,
    64 KiB of metadata, and every named policy."""
    sid = await api.create("echo")
    owner, forwarder = await api.owner_first(sid)
    boundary = sized(MAX_FILE, MAX_FILE - 8, *[1] * 8)()
    boundary[1].filename = "n" * 255
    boundary[2].mime_type = "text/markdown"
    request = spb.TurnRequest(
        session_id=sid,
        message="limits",
        files=boundary,
        policy=spb.TURN_POLICY_ENQUEUE,
        on_disconnect=spb.DISCONNECT_POLICY_CONTINUE,
        idempotency_key="k" * 256,
    )
    request.metadata.CopyFrom(metadata_of_size(MAX_METADATA))
    del boundary
    assert sum(len(f.content) for f in request.files) == 100 * MB
    events = await turn(owner, request)
    del request
    assert events[-1].type == event_pb2.RUN_FINISHED, events[-1]
    for n, policy in enumerate(spb.TurnPolicy.values()):
        for on_disconnect in spb.DisconnectPolicy.values():
            stub = (owner, forwarder)[(n + on_disconnect) % 2]
            small = spb.TurnRequest(
                session_id=sid, message=f"p{policy}", policy=policy, on_disconnect=on_disconnect
            )
            done = await turn(stub, small)
            assert done[-1].type == event_pb2.RUN_FINISHED, (policy, on_disconnect, done[-1])
    history, count = await api.snapshot(sid)
    turns = 1 + len(spb.TurnPolicy.values()) * len(spb.DisconnectPolicy.values())
    assert count == len(history) == 2 * turns
    assert len(history[0].files) == 10
    assert history[0].metadata == metadata_of_size(MAX_METADATA)
    await api.stubs[0].DeleteSession(spb.DeleteSessionRequest(session_id=sid), timeout=TIMEOUT)


async def test_turn_on_a_missing_session_is_not_found(api: Api) -> None:
    sid = f"missing-{uuid.uuid4().hex}"
    for stub in api.stubs:
        exc = await rpc_error(turn(stub, spb.TurnRequest(session_id=sid, message="hi")))
        assert exc.code() == grpc.StatusCode.NOT_FOUND, (exc.code(), exc.details())
        assert sid in (exc.details() or "")
        assert not LEAKS.search(exc.details() or "")
        # A bad request is refused before the session is looked up.
        bad = spb.TurnRequest(session_id=sid, message="", policy=99)  # type: ignore[arg-type]
        assert_invalid(await rpc_error(turn(stub, bad)), ("message", "policy"))
    assert not await api.has_owner(sid)  # no route was assigned along the way


# CreateSession ---------------------------------------------------------------


def _create(session_id: str = "", agent: str = "", meta_size: int = 0) -> spb.CreateSessionRequest:
    request = spb.CreateSessionRequest(session_id=session_id, agent_name=agent)
    if meta_size:
        request.metadata.CopyFrom(metadata_of_size(meta_size))
    return request


CREATE_CASES = [
    pytest.param(_create("a b"), ("session_id",), id="session_id-space"),
    pytest.param(_create("a/b"), ("session_id",), id="session_id-slash"),
    pytest.param(_create("ü"), ("session_id",), id="session_id-non-ascii"),
    pytest.param(_create("x" * 129), ("session_id",), id="session_id-129"),
    pytest.param(_create("fresh", agent="e" * 129), ("agent_name",), id="agent_name-129"),
    pytest.param(
        _create("fresh", meta_size=MAX_METADATA + 1), ("metadata",), id="metadata-64KiB-plus-1"
    ),
    pytest.param(
        _create("a:b c", agent="e" * 200, meta_size=MAX_METADATA + 1),
        ("session_id", "agent_name", "metadata"),
        id="several",
    ),
]


@pytest.mark.parametrize(("request_", "fields"), CREATE_CASES)
async def test_bad_create_session_is_rejected_and_creates_nothing(
    api: Api, request_: spb.CreateSessionRequest, fields: tuple[str, ...]
) -> None:
    request = spb.CreateSessionRequest()
    request.CopyFrom(request_)
    if request.session_id == "fresh":
        request.session_id = f"fresh-{uuid.uuid4().hex}"
    before = await api.active_sessions()
    for stub in api.stubs:
        assert_invalid(await rpc_error(stub.CreateSession(request, timeout=TIMEOUT)), fields)
    assert await api.active_sessions() == before
    if request.session_id.startswith("fresh-"):
        assert not await api.has_owner(request.session_id)
        exc = await rpc_error(
            api.stubs[0].GetSession(
                spb.GetSessionRequest(session_id=request.session_id), timeout=TIMEOUT
            )
        )
        assert exc.code() == grpc.StatusCode.NOT_FOUND


async def test_session_id_of_128_allowed_characters_is_accepted(api: Api) -> None:
    prefix = uuid.uuid4().hex + "-"
    sid = (prefix + "AZaz09._:-" * 13)[:128]
    assert len(sid) == 128
    created = await api.stubs[1].CreateSession(
        spb.CreateSessionRequest(session_id=sid, agent_name="echo"), timeout=TIMEOUT
    )
    assert created.session.session_id == sid
    got = await api.stubs[0].GetSession(spb.GetSessionRequest(session_id=sid), timeout=TIMEOUT)
    assert got.session.session_id == sid
    deleted = await api.stubs[0].DeleteSession(
        spb.DeleteSessionRequest(session_id=sid), timeout=TIMEOUT
    )
    assert deleted.deleted
    exc = await rpc_error(
        api.stubs[1].GetSession(spb.GetSessionRequest(session_id=sid), timeout=TIMEOUT)
    )
    assert exc.code() == grpc.StatusCode.NOT_FOUND


async def test_client_supplied_id_is_accepted_and_a_duplicate_already_exists(api: Api) -> None:
    sid = f"thread-1.a:B_c-{uuid.uuid4().hex}"
    created = await api.stubs[0].CreateSession(
        spb.CreateSessionRequest(session_id=sid, agent_name="echo"), timeout=TIMEOUT
    )
    assert created.session.session_id == sid
    assert created.session.agent_name == "echo"
    events = await turn(api.stubs[1], spb.TurnRequest(session_id=sid, message="first"))
    assert events[-1].type == event_pb2.RUN_FINISHED
    before = await api.snapshot(sid)
    sessions = await api.active_sessions()
    for stub in api.stubs:
        exc = await rpc_error(
            stub.CreateSession(
                spb.CreateSessionRequest(session_id=sid, agent_name="demo"), timeout=TIMEOUT
            )
        )
        assert exc.code() == grpc.StatusCode.ALREADY_EXISTS, (exc.code(), exc.details())
        assert sid in (exc.details() or "")
        assert not LEAKS.search(exc.details() or "")
    assert await api.snapshot(sid) == before
    assert await api.active_sessions() == sessions
    got = await api.stubs[1].GetSession(spb.GetSessionRequest(session_id=sid), timeout=TIMEOUT)
    assert got.session.agent_name == "echo"  # the original session, untouched
    await api.stubs[1].DeleteSession(spb.DeleteSessionRequest(session_id=sid), timeout=TIMEOUT)


# Session and turn references -------------------------------------------------

UNARY_BY_SESSION_ID: dict[str, Callable[[SessionServiceAsyncStub, str], Awaitable[Any]]] = {
    "GetSession": lambda s, sid: s.GetSession(
        spb.GetSessionRequest(session_id=sid), timeout=TIMEOUT
    ),
    "GetHistory": lambda s, sid: s.GetHistory(
        spb.GetHistoryRequest(session_id=sid), timeout=TIMEOUT
    ),
    "DeleteSession": lambda s, sid: s.DeleteSession(
        spb.DeleteSessionRequest(session_id=sid), timeout=TIMEOUT
    ),
}


@pytest.mark.parametrize("rpc", list(UNARY_BY_SESSION_ID))
@pytest.mark.parametrize("session_id", BAD_SESSION_IDS)
async def test_bad_session_id_is_rejected(
    api: Api, seeded: Seeded, rpc: str, session_id: str
) -> None:
    before = await api.snapshot(seeded.session_id)
    sessions = await api.active_sessions()
    for stub in api.stubs:
        exc = await rpc_error(UNARY_BY_SESSION_ID[rpc](stub, session_id))
        assert_invalid(exc, ("session_id",))
    assert await api.snapshot(seeded.session_id) == before
    assert await api.active_sessions() == sessions


SEEDED = "<seeded>"  # stands for the seeded session, or its turn
REF_CASES = [
    pytest.param("SubscribeTurn", SEEDED, SEEDED, -1, ("after_seq",), id="subscribe-after_seq"),
    pytest.param("SubscribeTurn", SEEDED, "", 0, ("turn_id",), id="subscribe-turn_id-empty"),
    pytest.param("SubscribeTurn", "a b", SEEDED, 0, ("session_id",), id="subscribe-session_id"),
    pytest.param("SubscribeTurn", SEEDED, "t" * 129, 0, ("turn_id",), id="subscribe-turn_id-129"),
    pytest.param(
        "SubscribeTurn",
        "a b",
        "",
        -5,
        ("session_id", "turn_id", "after_seq"),
        id="subscribe-several",
    ),
    pytest.param("CancelTurn", SEEDED, "", 0, ("turn_id",), id="cancel-turn_id-empty"),
    pytest.param("CancelTurn", SEEDED, "t" * 129, 0, ("turn_id",), id="cancel-turn_id-129"),
    pytest.param("CancelTurn", "a b", SEEDED, 0, ("session_id",), id="cancel-session_id"),
    pytest.param("CancelTurn", "", "", 0, ("session_id", "turn_id"), id="cancel-several"),
]


@pytest.mark.parametrize(("rpc", "session_id", "turn_id", "after_seq", "fields"), REF_CASES)
async def test_bad_turn_reference_is_rejected(
    api: Api,
    seeded: Seeded,
    rpc: str,
    session_id: str,
    turn_id: str,
    after_seq: int,
    fields: tuple[str, ...],
) -> None:
    sid = seeded.session_id if session_id == SEEDED else session_id
    tid = seeded.turn_id if turn_id == SEEDED else turn_id
    before = await api.snapshot(seeded.session_id)
    for stub in await api.owner_first(seeded.session_id):
        if rpc == "SubscribeTurn":
            request = spb.SubscribeTurnRequest(session_id=sid, turn_id=tid, after_seq=after_seq)
            call = stub.SubscribeTurn(request, timeout=TIMEOUT)
            exc = await rpc_error(_drain(call))
        else:
            exc = await rpc_error(
                stub.CancelTurn(spb.CancelTurnRequest(session_id=sid, turn_id=tid), timeout=TIMEOUT)
            )
        assert_invalid(exc, fields)
    assert await api.snapshot(seeded.session_id) == before


async def _drain(call: AsyncIterable[event_pb2.Event]) -> list[event_pb2.Event]:
    return [event async for event in call]


# The typed client ------------------------------------------------------------


async def test_client_reports_violations_by_field(
    api: Api, seeded: Seeded, client: AsyncClient, client2: AsyncClient
) -> None:
    before = await api.snapshot(seeded.session_id)
    with pytest.raises(InvalidArgumentError) as info:
        await client.send(seeded.session_id, "", policy=99)  # type: ignore[arg-type]  # bad on purpose
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(info.value.violations) == {"message", "policy"}
    zipped = File(content=b"PK", mime_type=ZIP, filename="report.zip")
    with pytest.raises(InvalidArgumentError) as info:
        await client2.send(seeded.session_id, "see attached", files=[zipped])
    assert list(info.value.violations) == ["files[0].mime_type"]
    assert "report.zip" in info.value.violations["files[0].mime_type"]
    assert await api.snapshot(seeded.session_id) == before


async def test_create_session_for_an_unknown_agent_leaves_no_route(api: Api) -> None:
    session_id = f"unknown-agent-{uuid.uuid4().hex}"
    for stub in api.stubs:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CreateSession(
                spb.CreateSessionRequest(session_id=session_id, agent_name="nope"),
                timeout=TIMEOUT,
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert not await api.has_owner(session_id)
