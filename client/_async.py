"""The async client for the public SessionService."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack

import grpc

from turnmesh.client._turns import (
    TurnOptions,
    TurnResult,
    build_create_request,
    build_fork_request,
    build_list_request,
    build_turn_request,
    collect_result,
)
from turnmesh.client.errors import map_rpc_errors
from turnmesh.runtime.serving import CLIENT_CHANNEL_OPTIONS
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub


class EventStream:
    """A server stream of events: async-iterable, and an async context
    manager that closes the stream on exit."""

    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, event_pb2.Event]) -> None:
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

    ``channel``: a channel of your own (it stays yours: ``close`` leaves it
    open). ``credentials``: TLS to an HTTPS edge, e.g.
    ``grpc.ssl_channel_credentials()``. ``metadata``: sent with every call.
    ``timeout``: seconds for each unary call (streams have none).
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
        webhook_url: str = "",
    ) -> spb.Session:
        """Create a session; ``messages`` is an optional history to start
        from; ``webhook_url``: where the end of each of its turns is
        notified (a URL your key's allow-list admits: its own, or the
        server's --webhook-allow)."""
        request = build_create_request(session_id, agent, metadata, messages)
        request.webhook_url = webhook_url
        with map_rpc_errors():
            response = await self._stub.CreateSession(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response.session

    async def fork_session(
        self,
        session_id: str,
        at_turn_id: str = "",
        *,
        new_session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> spb.Session:
        """A new session with this one's history up to and including
        ``at_turn_id`` (all of it if empty): a branch of the conversation.
        ``metadata`` unset copies the source's."""
        request = build_fork_request(session_id, at_turn_id, new_session_id, metadata)
        with map_rpc_errors():
            response = await self._stub.ForkSession(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response.session

    async def list_sessions(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        agent: str = "",
        metadata: Mapping[str, str] | None = None,
        principal: str = "",
    ) -> spb.ListSessionsResponse:
        """One page of the caller's sessions, newest first; pass the response's
        ``next_page_token`` for the next (empty: no more). ``metadata``: only
        sessions with every key=value; ``principal``: an admin listing another's."""
        request = build_list_request(page_size, page_token, agent, metadata, principal)
        with map_rpc_errors():
            response = await self._stub.ListSessions(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response

    async def get_session(self, session_id: str, *, principal: str = "") -> spb.Session:
        """A session's summary; ``principal``: an admin reading another's."""
        with map_rpc_errors():
            response = await self._stub.GetSession(
                spb.GetSessionRequest(session_id=session_id, principal=principal),
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

    async def history(self, session_id: str, *, principal: str = "") -> list[message_pb2.Message]:
        """A session's messages; ``principal``: an admin reading another's."""
        with map_rpc_errors():
            response = await self._stub.GetHistory(
                spb.GetHistoryRequest(session_id=session_id, principal=principal),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return list(response.messages)

    def stream_turn(
        self,
        session_id: str,
        message: str,
        **options: Unpack[TurnOptions],
    ) -> EventStream:
        """Stream a turn's events as they happen (``options``: TurnOptions).

        Use it as ``async with client.stream_turn(...) as events: async for e in
        events`` so that leaving the block closes the stream. Closing is a
        disconnect: the turn continues (resume with ``subscribe``) unless
        ``cancel_on_disconnect=True``. A retry with the same
        ``idempotency_key`` follows the original turn instead of running it
        again.
        """
        request = build_turn_request(session_id, message, options)
        return EventStream(self._stub.Turn(request, metadata=self._metadata))

    async def send(
        self,
        session_id: str,
        message: str,
        **options: Unpack[TurnOptions],
    ) -> TurnResult:
        """Run a turn to its end; raises TurnFailedError if it ends with RUN_ERROR."""
        stream = self.stream_turn(session_id, message, **options)
        async with stream:
            events = [e async for e in stream]
        return collect_result(events)

    async def start_turn(
        self,
        session_id: str,
        message: str,
        **options: Unpack[TurnOptions],
    ) -> spb.Turn:
        """Start a background turn and return at once, when it is accepted
        (QUEUED or RUNNING): it runs to its end with nobody connected
        (``cancel_on_disconnect`` does not apply). Follow its events with
        ``subscribe(session_id, turn.turn_id)``, its state with ``get_turn``.
        Refused as ``send`` is (SessionBusyError, AwaitingClientError, ...);
        a retry with the same ``idempotency_key`` returns the same turn."""
        request = spb.StartTurnRequest(
            session_id=session_id, turn=build_turn_request(session_id, message, options)
        )
        with map_rpc_errors():
            response = await self._stub.StartTurn(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response.turn

    async def get_turn(self, session_id: str, turn_id: str) -> spb.Turn:
        """A turn's state, times, usage and how it ended (a background turn's
        for days; another's while its events are kept)."""
        with map_rpc_errors():
            response = await self._stub.GetTurn(
                spb.GetTurnRequest(session_id=session_id, turn_id=turn_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return response.turn

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
            response: spb.GetHealthResponse = await self._stub.GetHealth(
                spb.GetHealthRequest(), metadata=self._metadata, timeout=self._timeout
            )
        return response
