"""The blocking client: the same calls as AsyncClient, on a sync gRPC channel
(a test holds their methods and parameters equal)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
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


class Client:
    """Blocking client for scripts::

        with Client("127.0.0.1:7100") as client:
            session = client.create_session()
            print(client.send(session.session_id, "hello").text)

    The options are AsyncClient's. A stream (``stream_turn``, ``subscribe``)
    is an iterator; leaving it early (``break``, or ``close()``) closes the
    stream, which is a disconnect, not a cancel.
    """

    def __init__(
        self,
        target: str,
        *,
        channel: grpc.Channel | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        api_key: str | None = None,
        timeout: float | None = 30.0,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        if channel is None and credentials is not None:
            channel = grpc.secure_channel(target, credentials, options=CLIENT_CHANNEL_OPTIONS)
        self._channel = channel or grpc.insecure_channel(target, options=CLIENT_CHANNEL_OPTIONS)
        self._owns_channel = channel is None
        self._stub = SessionServiceStub(self._channel)
        auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._metadata = (*auth, *metadata)
        self._timeout = timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def create_session(
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
            response: spb.CreateSessionResponse = self._stub.CreateSession(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response.session

    def fork_session(
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
            response: spb.ForkSessionResponse = self._stub.ForkSession(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response.session

    def list_sessions(
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
            response: spb.ListSessionsResponse = self._stub.ListSessions(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response

    def get_session(self, session_id: str, *, principal: str = "") -> spb.Session:
        """A session's summary; ``principal``: an admin reading another's."""
        with map_rpc_errors():
            response: spb.GetSessionResponse = self._stub.GetSession(
                spb.GetSessionRequest(session_id=session_id, principal=principal),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return response.session

    def delete_session(self, session_id: str) -> bool:
        with map_rpc_errors():
            response: spb.DeleteSessionResponse = self._stub.DeleteSession(
                spb.DeleteSessionRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return response.deleted

    def history(self, session_id: str, *, principal: str = "") -> list[message_pb2.Message]:
        """A session's messages; ``principal``: an admin reading another's."""
        with map_rpc_errors():
            response: spb.GetHistoryResponse = self._stub.GetHistory(
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
    ) -> Iterator[event_pb2.Event]:
        """Stream a turn's events as they happen (see AsyncClient.stream_turn)."""
        request = build_turn_request(session_id, message, options)
        return self._events(lambda: self._stub.Turn(request, metadata=self._metadata))

    def send(
        self,
        session_id: str,
        message: str,
        **options: Unpack[TurnOptions],
    ) -> TurnResult:
        """Run a turn to its end; raises TurnFailedError if it ends with RUN_ERROR."""
        events = self.stream_turn(session_id, message, **options)
        return collect_result(list(events))

    def start_turn(
        self,
        session_id: str,
        message: str,
        **options: Unpack[TurnOptions],
    ) -> spb.Turn:
        """Start a background turn and return at once (see AsyncClient.start_turn)."""
        request = spb.StartTurnRequest(
            session_id=session_id, turn=build_turn_request(session_id, message, options)
        )
        with map_rpc_errors():
            response: spb.StartTurnResponse = self._stub.StartTurn(
                request, metadata=self._metadata, timeout=self._timeout
            )
        return response.turn

    def get_turn(self, session_id: str, turn_id: str) -> spb.Turn:
        """A turn's state, times, usage and how it ended (see AsyncClient.get_turn)."""
        with map_rpc_errors():
            response: spb.GetTurnResponse = self._stub.GetTurn(
                spb.GetTurnRequest(session_id=session_id, turn_id=turn_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return response.turn

    def subscribe(
        self, session_id: str, turn_id: str, after_seq: int = 0
    ) -> Iterator[event_pb2.Event]:
        """Replay a turn's events after ``after_seq``, then follow it live."""
        request = spb.SubscribeTurnRequest(
            session_id=session_id, turn_id=turn_id, after_seq=after_seq
        )
        return self._events(lambda: self._stub.SubscribeTurn(request, metadata=self._metadata))

    def cancel_turn(self, session_id: str, turn_id: str) -> spb.TurnState.ValueType:
        with map_rpc_errors():
            response: spb.CancelTurnResponse = self._stub.CancelTurn(
                spb.CancelTurnRequest(session_id=session_id, turn_id=turn_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        return response.state

    def health(self) -> spb.GetHealthResponse:
        with map_rpc_errors():
            response: spb.GetHealthResponse = self._stub.GetHealth(
                spb.GetHealthRequest(), metadata=self._metadata, timeout=self._timeout
            )
        return response

    @staticmethod
    def _events(start: Callable[[], Any]) -> Iterator[event_pb2.Event]:
        # A generator: the call starts on the first next(), and is cancelled
        # however iteration stops.
        call = start()
        try:
            with map_rpc_errors():
                yield from call
        finally:
            call.cancel()
