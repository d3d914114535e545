"""What every compatibility surface shares: the public SessionService,
called in this process (so forwarding, policies and validation are the ones
the native API has), error translation, and HTTP body framing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypedDict, TypeVar, Unpack

import grpc
from google.api import httpbody_pb2
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, ValidationError

from turnmesh.runtime import bodies, receipts, wire
from turnmesh.runtime.auth import bearer
from turnmesh.runtime.error_decoding import from_status
from turnmesh.runtime.errors import (
    Cancelled,
    DeadlineExceeded,
    FieldViolation,
    InvalidArgument,
    ModelNotFound,
    NotFound,
    TurnmeshError,
    Unavailable,
)
from turnmesh.server.compat.coalesce import ReadyEvents
from turnmesh.server.sessions import validation
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

if TYPE_CHECKING:
    from turnmesh.server.owner_calls import Context

Response = TypeVar("Response")
# A surface's calls to its own server are quick, but a session's owner may be
# another server: the same bound as the typed client's default.
CALL_TIMEOUT_SECONDS = 60.0


class InProcessCall:
    """A surface's call to this server's SessionService, made in this process
    (``owner_calls.Context``): the service reads the caller's key from it (passed
    on when the session's owner is another server), and its abort raises the
    error the status carries, as the failed gRPC call did when the surfaces
    called their own server over a loopback channel."""

    def __init__(self, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self._metadata = grpc.aio.Metadata(*metadata)

    def invocation_metadata(self) -> grpc.aio.Metadata:
        return self._metadata

    async def send_initial_metadata(
        self, initial_metadata: grpc.aio.Metadata | Sequence[tuple[str, str | bytes]]
    ) -> None:
        """Only a call forwarded by another server sends any; this one never is."""

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: grpc.aio.Metadata | Sequence[tuple[str, str | bytes]] = (),
    ) -> NoReturn:
        raise from_status(code, details, tuple(trailing_metadata))


class SessionCalls(Protocol):
    """The SessionService methods the surfaces call (``server.service.SessionServicer``)."""

    async def GetSession(
        self, request: spb.GetSessionRequest, context: Context
    ) -> spb.GetSessionResponse: ...

    async def CreateSession(
        self, request: spb.CreateSessionRequest, context: Context
    ) -> spb.CreateSessionResponse: ...

    async def DeleteSession(
        self, request: spb.DeleteSessionRequest, context: Context
    ) -> spb.DeleteSessionResponse: ...

    async def GetHistory(
        self, request: spb.GetHistoryRequest, context: Context
    ) -> spb.GetHistoryResponse: ...

    async def ForkSession(
        self, request: spb.ForkSessionRequest, context: Context
    ) -> spb.ForkSessionResponse: ...

    async def GetHealth(
        self, request: spb.GetHealthRequest, context: Context
    ) -> spb.GetHealthResponse: ...

    def Turn(
        self, request: spb.TurnRequest, context: Context
    ) -> AsyncGenerator[event_pb2.Event, None]: ...

    async def turn_batches(
        self, request: spb.TurnRequest, context: Context
    ) -> AsyncGenerator[list[event_pb2.Event], None]: ...

    async def StartTurn(
        self, request: spb.StartTurnRequest, context: Context
    ) -> spb.StartTurnResponse: ...

    async def GetTurn(
        self, request: spb.GetTurnRequest, context: Context
    ) -> spb.GetTurnResponse: ...

    async def CancelTurn(
        self, request: spb.CancelTurnRequest, context: Context
    ) -> spb.CancelTurnResponse: ...

    async def get_task_record(self, session_id: str, task_id: str, context: Context) -> str: ...

    async def put_task_record(
        self, session_id: str, task_id: str, record: str, created_at: float, context: Context
    ) -> bool: ...

    async def list_task_records(
        self, before: list[Any] | None, limit: int, context: Context
    ) -> dict[str, Any]: ...

    def SubscribeTurn(
        self, request: spb.SubscribeTurnRequest, context: Context
    ) -> AsyncGenerator[event_pb2.Event, None]: ...


class Mesh:
    """The public API as the compatibility surfaces see it: this server's own
    SessionService, called in this process for the caller (its principal is
    the call's already; the request was authenticated and counted once). So
    forwarding, policies, limits and validation are the native API's, errors
    are the ``turnmesh.runtime.errors`` the service raised, and a surface's
    turn costs no gRPC hop of its own."""

    def __init__(self) -> None:
        self._service: SessionCalls | None = None
        self._call = InProcessCall()
        # The turn this view reads now: how many of its events are in hand.
        self._reading: ReadyEvents | None = None

    def connect(self, service: SessionCalls) -> None:
        self._service = service

    def for_caller(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Mesh:
        """A view whose calls carry this caller's key: with mutual TLS and no
        mesh key, a call forwarded to another server is opened there by it."""
        key = bearer(metadata)
        view = Mesh()
        view._service = self._service
        view._call = InProcessCall([("authorization", f"Bearer {key}")] if key else [])
        return view

    @property
    def _svc(self) -> SessionCalls:
        if self._service is None:
            raise Unavailable("this server is still starting")
        return self._service

    async def _unary(self, call: Awaitable[Response]) -> Response:
        """A unary call, bounded as the loopback call was (the owner may be
        another server)."""
        try:
            async with asyncio.timeout(CALL_TIMEOUT_SECONDS):
                return await call
        except TimeoutError:
            raise from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None

    async def close(self) -> None:
        self._service = None

    async def get_session(self, session_id: str) -> spb.Session:
        request = spb.GetSessionRequest(session_id=session_id)
        return (await self._unary(self._svc.GetSession(request, self._call))).session

    async def session_exists(self, session_id: str) -> bool:
        try:
            await self.get_session(session_id)
        except (NotFound, InvalidArgument):
            return False  # an invalid id cannot exist either
        return True

    async def create_session(
        self,
        session_id: str | None,
        agent: str | None,
        history: Sequence[message_pb2.Message] = (),
        *,
        param: str = "agent_name",
    ) -> str:
        """A new session; an unknown agent is NotFound naming ``param``."""
        request = spb.CreateSessionRequest(
            session_id=session_id or "", agent_name=agent or "", messages=history
        )
        try:
            response = await self._unary(self._svc.CreateSession(request, self._call))
        except NotFound as exc:
            raise ModelNotFound(exc.detail, metadata={"param": param}) from exc
        return response.session.session_id

    async def delete_session(self, session_id: str) -> None:
        request = spb.DeleteSessionRequest(session_id=session_id)
        await self._unary(self._svc.DeleteSession(request, self._call))

    async def drop_session(
        self, session_id: str, refusal: TurnmeshError, seeded: int | None = None
    ) -> None:
        """Delete a session this request made, whose turn was refused before
        it started: a refused request leaves nothing behind. Kept when the
        refusal may not be one (the owner was unreachable: the turn may run)
        or when another request uses the session now (a turn runs there, or
        it holds more than the ``seeded`` messages it was made with)."""
        if isinstance(refusal, (Unavailable, DeadlineExceeded, Cancelled)):
            return
        with contextlib.suppress(TurnmeshError):  # it would expire anyway
            session = await self.get_session(session_id)
            if session.turn_running or (seeded is not None and session.message_count > seeded):
                return
            await self.delete_session(session_id)

    async def health(self) -> spb.GetHealthResponse:
        return await self._svc.GetHealth(spb.GetHealthRequest(), self._call)

    async def fork_session(self, session_id: str, at_turn_id: str) -> str:
        """A new session with this one's history up to a turn; its id."""
        request = spb.ForkSessionRequest(session_id=session_id, at_turn_id=at_turn_id)
        return (await self._unary(self._svc.ForkSession(request, self._call))).session.session_id

    async def history(self, session_id: str) -> list[message_pb2.Message]:
        request = spb.GetHistoryRequest(session_id=session_id)
        return list((await self._unary(self._svc.GetHistory(request, self._call))).messages)

    @contextlib.asynccontextmanager
    async def turn(
        self,
        session_id: str,
        message: str,
        **options: Unpack[TurnArgs],
    ) -> AsyncIterator[AsyncIterator[event_pb2.Event]]:
        """A turn's events; leaving the block before the end is a disconnect,
        which cancels the turn or lets it go on as ``on_disconnect`` says.
        ``tools``, ``tool_results`` and ``resume``: as TurnRequest's (a turn
        that answers a pause may have no message)."""
        request = await _turn_request(session_id, message, options)
        events = ReadyEvents(await self._svc.turn_batches(request, self._call))
        self._reading = events
        try:
            yield events
        finally:
            self._reading = None
            await events.aclose()

    def events_ready(self) -> int:
        """How many events of the turn being read are in hand already (what
        ``coalesce.coalesced`` holds a surface's frames for)."""
        return self._reading.ready if self._reading is not None else 0

    async def start_turn(
        self, session_id: str, message: str, **options: Unpack[TurnArgs]
    ) -> spb.Turn:
        """A background turn (StartTurn): the turn as it was accepted."""
        request = spb.StartTurnRequest(
            session_id=session_id, turn=await _turn_request(session_id, message, options)
        )
        return (await self._unary(self._svc.StartTurn(request, self._call))).turn

    async def get_turn(self, session_id: str, turn_id: str) -> spb.Turn:
        request = spb.GetTurnRequest(session_id=session_id, turn_id=turn_id)
        return (await self._unary(self._svc.GetTurn(request, self._call))).turn

    @contextlib.asynccontextmanager
    async def subscribe_turn(
        self, session_id: str, turn_id: str, after_seq: int = 0
    ) -> AsyncIterator[AsyncIterator[event_pb2.Event]]:
        """A turn's events after ``after_seq``, then live until it ends
        (SubscribeTurn, from whichever server runs it); leaving the block
        stops following it, never the turn."""
        request = spb.SubscribeTurnRequest(
            session_id=session_id, turn_id=turn_id, after_seq=after_seq
        )
        events = self._svc.SubscribeTurn(request, self._call)
        try:
            yield events
        finally:
            await events.aclose()

    async def task_record(self, session_id: str, task_id: str) -> str:
        """An A2A task's record (JSON; "" if none), from its session's owner."""
        return await self._unary(self._svc.get_task_record(session_id, task_id, self._call))

    async def put_task_record(
        self, session_id: str, task_id: str, record: str, created_at: float
    ) -> bool:
        return await self._unary(
            self._svc.put_task_record(session_id, task_id, record, created_at, self._call)
        )

    async def task_records(
        self, before: tuple[int, str] | None, limit: int
    ) -> tuple[list[tuple[tuple[int, str], str, str]], tuple[int, str] | None]:
        """A keyset page of the caller's A2A task records, newest first, from
        every server: ((nanos, task), session, record) each, and the frontier."""
        page = await self._unary(
            self._svc.list_task_records(list(before) if before else None, limit, self._call)
        )
        items = [((int(n), str(t)), str(s), str(r)) for n, t, s, r in page["items"]]
        frontier = page["frontier"]
        return items, (int(frontier[0]), str(frontier[1])) if frontier else None

    async def cancel_turn(self, session_id: str, turn_id: str) -> spb.TurnState.ValueType:
        """The turn's state after the call: CANCELLED, or how it had ended."""
        request = spb.CancelTurnRequest(session_id=session_id, turn_id=turn_id)
        return (await self._unary(self._svc.CancelTurn(request, self._call))).state


class TurnArgs(TypedDict, total=False):
    """A surface's turn, as TurnRequest's fields."""

    files: Sequence[message_pb2.File]
    metadata: Mapping[str, Any] | None
    policy: spb.TurnPolicy.ValueType
    on_disconnect: spb.DisconnectPolicy.ValueType
    tools: Sequence[message_pb2.ToolDefinition]
    tool_results: Sequence[message_pb2.ToolResult]
    resume: Sequence[message_pb2.ResumeEntry]
    idempotency_key: str


async def _turn_request(session_id: str, message: str, options: TurnArgs) -> spb.TurnRequest:
    request = spb.TurnRequest(
        session_id=session_id,
        message=message,
        policy=options.get("policy", spb.TURN_POLICY_COLLECT),
        on_disconnect=options.get("on_disconnect", spb.DISCONNECT_POLICY_CONTINUE),
        tools=options.get("tools", ()),
        tool_results=options.get("tool_results", ()),
        resume=options.get("resume", ()),
        idempotency_key=options.get("idempotency_key", ""),
    )
    if metadata := options.get("metadata"):
        json_format.ParseDict(dict(metadata), request.metadata)
    for file in options.get("files", ()):
        if file.ByteSize() > _COPY_ON_LOOP_BYTES:
            # Megabytes are copied in a thread: the loop runs between files.
            await asyncio.to_thread(request.files.append, file)
        else:
            request.files.append(file)
    # What the service's budget check reads first: this request's size,
    # not the size of the surface's JSON body it was made from.
    wire.note_received(request.ByteSize())
    return request


# A file bigger than this is copied into a turn's request in a thread.
_COPY_ON_LOOP_BYTES = 2**20


# The turn policies by the short names the other APIs' requests use.
POLICIES: dict[str, spb.TurnPolicy.ValueType] = {
    name: spb.TurnPolicy.Value(f"TURN_POLICY_{name.upper()}")
    for name in ("collect", "enqueue", "interrupt", "reject")
}


ON_DISCONNECT_HEADER = "x-turnmesh-on-disconnect"
_ON_DISCONNECT = {
    "cancel": spb.DISCONNECT_POLICY_CANCEL,
    "continue": spb.DISCONNECT_POLICY_CONTINUE,
}


# A JSON value deeper than this, as a Struct in the worker's request, passes
# protobuf's nesting limit (100 messages: about three a JSON object).
MAX_JSON_DEPTH = 30


def _check_json(field: str, value: Any) -> None:
    """A 400 naming ``field`` for what a Struct cannot carry or return: nesting
    past MAX_JSON_DEPTH, and NaN or an infinity (JSON has neither)."""
    depth, level = 0, [value]
    while level:
        if any(isinstance(v, float) and not math.isfinite(v) for v in level):
            raise invalid(field, "holds NaN or an infinity, which JSON has no number for")
        containers = [v for v in level if isinstance(v, (dict, list))]
        if containers:
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise invalid(field, f"nested deeper than {MAX_JSON_DEPTH} levels")
        level = [c for v in containers for c in (v.values() if isinstance(v, dict) else v)]


def _struct_value(field: str, value: Any, target: Any) -> None:
    """``value`` into the Struct or Value ``target``, or a 400 naming ``field``."""
    _check_json(field, value)
    try:
        json_format.ParseDict(value, target)
    except (json_format.ParseError, ValueError, TypeError, OverflowError):
        # e.g. an integer no double holds
        raise invalid(field, "must be JSON whose numbers fit in a double") from None


def tool_definition(
    name: str,
    description: str | None,
    parameters: Mapping[str, Any] | None,
    field: str = "tools",
) -> message_pb2.ToolDefinition:
    """A caller's function tool, from any surface's JSON (the mesh checks its
    name); ``field`` names its parameters in a 400."""
    tool = message_pb2.ToolDefinition(name=name, description=description or "")
    if parameters:
        _struct_value(field, dict(parameters), tool.parameters)
    return tool


def resume_entry(
    field: str, interrupt_id: str, status: str, payload: Any
) -> message_pb2.ResumeEntry:
    """An answer to an interrupt from any surface's JSON (None: no payload);
    ``field`` names the payload in a 400."""
    entry = message_pb2.ResumeEntry(interrupt_id=interrupt_id, status=status)
    if payload is not None:
        _struct_value(field, payload, entry.payload)
    return entry


def on_disconnect(header: str | None) -> spb.DisconnectPolicy.ValueType:
    """What a client's disconnect does on an OpenAI or AG-UI surface: cancel
    the turn (OpenAI's own behaviour, and an AG-UI ``abortRun()``: the
    default) or, with ``continue``, let it finish and be saved, to resume
    with SubscribeTurn as a native caller would."""
    if header is None:
        return spb.DISCONNECT_POLICY_CANCEL
    policy = _ON_DISCONNECT.get(header.strip().lower())
    if policy is None:
        raise invalid("X-Turnmesh-On-Disconnect", "must be cancel or continue")
    return policy


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str = ""


class ToolCall(BaseModel):
    """An assistant message's tool call, as OpenAI and AG-UI both send it."""

    model_config = ConfigDict(extra="allow")
    id: str
    type: str = "function"
    function: FunctionCall

    def add_to(self, message: message_pb2.Message) -> None:
        message.tool_calls.add(
            id=self.id,
            type="function",
            function=message_pb2.FunctionCall(
                name=self.function.name, arguments=self.function.arguments
            ),
        )


class ContentPart(BaseModel):
    """A part of an OpenAI message's content: text, or a file or image whose
    fields each surface reads from its extras."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


def invalid(field: str, description: str) -> InvalidArgument:
    return InvalidArgument([FieldViolation(field, description)])


async def parse_json_body(body: httpbody_pb2.HttpBody) -> dict[str, Any]:
    """The request's JSON object (parsed off the event loop when large)."""
    # Receiving and decoding the request took a loop step of its own already
    # (tens of milliseconds for 100 MB): copying its data out starts another.
    await asyncio.sleep(0)
    # A copy (protobuf keeps the request's bytes in its arena until the
    # request itself goes: the handlers drop it once this returns).
    data = body.data
    try:
        return await bodies.parse_json(data)
    except bodies.BodyError as exc:
        raise invalid("body", str(exc)) from None
    except BrokenProcessPool:
        raise Unavailable("this server could not decode the body now; retry") from None
    finally:
        del data
        receipts.decoded()  # the call's receipt slot, kept until now


def json_body(payload: Any) -> httpbody_pb2.HttpBody:
    return httpbody_pb2.HttpBody(
        content_type="application/json", data=json.dumps(payload, separators=(",", ":")).encode()
    )


def sse_body(payload: Any, event: str | None = None) -> httpbody_pb2.HttpBody:
    """One SSE frame; the stream's first HttpBody sets the content type."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    prefix = f"event: {event}\n" if event else ""
    return httpbody_pb2.HttpBody(
        content_type="text/event-stream", data=f"{prefix}data: {data}\n\n".encode()
    )


def from_pydantic(exc: ValidationError, data: Any, prefix: str = "") -> InvalidArgument:
    """A request body (``data``) that does not fit the schema, one violation
    per field, named as the caller wrote it (``messages[0].content``: no union
    branch names such as ``str`` or ``list[ChatMessage]``)."""
    found: dict[str, list[str]] = {}
    for error in exc.errors()[:40]:
        parts = _caller_path(error["loc"], data)
        field = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
        field = field.removeprefix(".") or "body"
        messages = found.setdefault(field, [])
        if error["msg"] not in messages:
            messages.append(error["msg"])
    return InvalidArgument(
        [FieldViolation(field, "; or ".join(m[:3])) for field, m in list(found.items())[:20]]
    )


_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "none"})


def _caller_path(loc: tuple[str | int, ...], data: Any) -> list[str | int]:
    """``loc`` without pydantic's union branch names: a part the caller's
    body has at that level is theirs (a metadata key may be ``str``), else a
    part that looks like a branch name is dropped."""
    parts: list[str | int] = []
    current = data
    for part in loc:
        in_dict = isinstance(current, dict) and part in current
        in_list = isinstance(part, int) and isinstance(current, list) and part < len(current)
        if in_dict or in_list:
            parts.append(part)
            current = current[part]
        elif not _is_branch_tag(part):
            parts.append(part)
            current = None
    return parts


def _is_branch_tag(part: str | int) -> bool:
    """Pydantic names the branch of a union it tried (``str``,
    ``list[InputItem]``, ``function-after[...]``); our fields are snake_case."""
    return isinstance(part, str) and (part in _SCALAR_TAGS or "[" in part or part[:1].isupper())


def check_message(message: str, field: str) -> None:
    """The Turn rules for the user's message, under the caller's name for it,
    before any session is made."""
    violations = validation.message_violations(message, field)
    if violations:
        raise InvalidArgument(violations)
