"""The async client for the public SessionService."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc
from google.protobuf import json_format

from turnmesh.client.errors import TurnFailedError, map_rpc_errors
from turnmesh.runtime.events import Answer
from turnmesh.runtime.serving import CLIENT_CHANNEL_OPTIONS
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

POLICIES = {
    "reject": spb.TURN_POLICY_REJECT,
    "enqueue": spb.TURN_POLICY_ENQUEUE,
    "collect": spb.TURN_POLICY_COLLECT,
    "interrupt": spb.TURN_POLICY_INTERRUPT,
}


@dataclass
class TurnResult:
    """A finished turn: its id, the final text, and every event it streamed."""

    turn_id: str
    text: str
    events: list[event_pb2.Event] = field(default_factory=list)
    # Token usage of the whole turn (every model call the agent made).
    usage: event_pb2.TokenUsage = field(default_factory=event_pb2.TokenUsage)

    @property
    def tool_calls(self) -> list[event_pb2.Event]:
        return [e for e in self.events if e.type == event_pb2.TOOL_CALL_START]


def build_turn_request(
    session_id: str,
    message: str,
    *,
    policy: str | int = "collect",
    cancel_on_disconnect: bool = False,
    files: list[message_pb2.File] | None = None,
    metadata: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> spb.TurnRequest:
    request = spb.TurnRequest(
        session_id=session_id,
        message=message,
        policy=POLICIES[policy] if isinstance(policy, str) else policy,
        on_disconnect=(
            spb.DISCONNECT_POLICY_CANCEL if cancel_on_disconnect else spb.DISCONNECT_POLICY_CONTINUE
        ),
        files=files or [],
        idempotency_key=idempotency_key or "",
    )
    if metadata:
        json_format.ParseDict(dict(metadata), request.metadata)
    return request


def collect_result(events: list[event_pb2.Event]) -> TurnResult:
    """The final answer of a turn: the text after its last tool result."""
    turn_id = events[0].run_id if events else ""
    last = events[-1] if events else None
    if last is None or last.type != event_pb2.RUN_FINISHED:
        raise TurnFailedError(last or event_pb2.Event(message="the turn ended without an event"))
    answer = Answer()
    for event in events:
        answer.feed(event)
    return TurnResult(turn_id=turn_id, text=answer.text, events=events, usage=answer.usage)


class EventStream:
    """A server stream of events: async-iterable, and an async context
    manager that closes the stream on exit."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self._call = call

    def __aiter__(self) -> AsyncIterator[event_pb2.Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[event_pb2.Event]:
        with map_rpc_errors():
            async for event in self._call:
                yield event

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._call.cancel()


class AsyncClient:
    """Talks to any session server (or to Envoy's gRPC port).

    ::

        async with AsyncClient("127.0.0.1:7100") as client:
            session = await client.create_session()
            result = await client.send(session.session_id, "What is 2+2?")
            print(result.text)
    """

    def __init__(
        self,
        target: str,
        *,
        channel: grpc.aio.Channel | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        api_key: str | None = None,
        timeout: float | None = 30.0,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        # credentials: TLS to an HTTPS edge, e.g. grpc.ssl_channel_credentials().
        if channel is None and credentials is not None:
            channel = grpc.aio.secure_channel(target, credentials, options=CLIENT_CHANNEL_OPTIONS)
        self._channel = channel or grpc.aio.insecure_channel(target, options=CLIENT_CHANNEL_OPTIONS)
        self._owns_channel = channel is None
        self._stub = SessionServiceStub(self._channel)
        auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._metadata = (*auth, *metadata)
        self._timeout = timeout

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close()

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        agent: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        messages: Sequence[message_pb2.Message] = (),
    ) -> spb.Session:
        """Create a session; ``messages`` is an optional history to start from."""
        request = spb.CreateSessionRequest(
            session_id=session_id or "", agent_name=agent or "", messages=messages
        )
        if metadata:
            json_format.ParseDict(dict(metadata), request.metadata)
        with map_rpc_errors():
            response = await self._stub.CreateSession(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response.session

    async def get_session(self, session_id: str) -> spb.Session:
        with map_rpc_errors():
            response = await self._stub.GetSession(
                spb.GetSessionRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return response.session

    async def delete_session(self, session_id: str) -> bool:
        with map_rpc_errors():
            response = await self._stub.DeleteSession(
                spb.DeleteSessionRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return response.deleted

    async def history(self, session_id: str) -> list[message_pb2.Message]:
        with map_rpc_errors():
            response = await self._stub.GetHistory(
                spb.GetHistoryRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return list(response.messages)

    def stream_turn(self, session_id: str, message: str, **options: Any) -> EventStream:
        """Stream a turn's events as they happen.

        Use it as ``async with client.stream_turn(...) as events: async for e in
        events`` so that leaving the block closes the stream. Closing is a
        disconnect: the turn continues (resume with ``subscribe``) unless
        ``cancel_on_disconnect=True``.
        """
        request = build_turn_request(session_id, message, **options)
        return EventStream(self._stub.Turn(request, metadata=self._metadata))

    async def send(self, session_id: str, message: str, **options: Any) -> TurnResult:
        """Run a turn to its end; raises TurnFailedError if it ends with RUN_ERROR."""
        async with self.stream_turn(session_id, message, **options) as stream:
            events = [e async for e in stream]
        return collect_result(events)

    def subscribe(self, session_id: str, turn_id: str, after_seq: int = 0) -> EventStream:
        """Replay a turn's events after ``after_seq``, then follow it live."""
        return EventStream(
            self._stub.SubscribeTurn(
                spb.SubscribeTurnRequest(
                    session_id=session_id, turn_id=turn_id, after_seq=after_seq
                ),
                metadata=self._metadata,
            )
        )

    async def cancel_turn(self, session_id: str, turn_id: str) -> spb.TurnState.ValueType:
        with map_rpc_errors():
            response = await self._stub.CancelTurn(
                spb.CancelTurnRequest(session_id=session_id, turn_id=turn_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return response.state

    async def health(self) -> spb.GetHealthResponse:
        with map_rpc_errors():
            return await self._stub.GetHealth(
                spb.GetHealthRequest(), metadata=self._metadata, timeout=self._timeout
            )
