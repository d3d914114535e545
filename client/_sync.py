"""The blocking client: the same calls as AsyncClient, on a sync gRPC channel."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import grpc
from google.protobuf import json_format

from turnmesh.client._async import TurnResult, build_turn_request, collect_result
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
    """

    def __init__(
        self,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        api_key: str | None = None,
        timeout: float | None = 30.0,
    ) -> None:
        self._channel = (
            grpc.secure_channel(target, credentials, options=CLIENT_CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.insecure_channel(target, options=CLIENT_CHANNEL_OPTIONS)
        )
        self._stub = SessionServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
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
        self._channel.close()

    def create_session(
        self,
        session_id: str | None = None,
        *,
        agent: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> spb.Session:
        request = spb.CreateSessionRequest(session_id=session_id or "", agent_name=agent or "")
        if metadata:
            json_format.ParseDict(dict(metadata), request.metadata)
        with map_rpc_errors():
            return self._stub.CreateSession(
                request, metadata=self._metadata, timeout=self._timeout
            ).session

    def get_session(self, session_id: str) -> spb.Session:
        with map_rpc_errors():
            return self._stub.GetSession(
                spb.GetSessionRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=self._timeout,
            ).session

    def delete_session(self, session_id: str) -> bool:
        with map_rpc_errors():
            return self._stub.DeleteSession(
                spb.DeleteSessionRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=self._timeout,
            ).deleted

    def history(self, session_id: str) -> list[message_pb2.Message]:
        with map_rpc_errors():
            return list(
                self._stub.GetHistory(
                    spb.GetHistoryRequest(session_id=session_id),
                    metadata=self._metadata,
                    timeout=self._timeout,
                ).messages
            )

    def stream_turn(
        self, session_id: str, message: str, **options: Any
    ) -> Iterator[event_pb2.Event]:
        call = self._stub.Turn(
            build_turn_request(session_id, message, **options), metadata=self._metadata
        )
        try:
            with map_rpc_errors():
                yield from call
        finally:
            call.cancel()

    def send(self, session_id: str, message: str, **options: Any) -> TurnResult:
        return collect_result(list(self.stream_turn(session_id, message, **options)))

    def subscribe(
        self, session_id: str, turn_id: str, after_seq: int = 0
    ) -> Iterator[event_pb2.Event]:
        call = self._stub.SubscribeTurn(
            spb.SubscribeTurnRequest(session_id=session_id, turn_id=turn_id, after_seq=after_seq),
            metadata=self._metadata,
        )
        try:
            with map_rpc_errors():
                yield from call
        finally:
            call.cancel()

    def cancel_turn(self, session_id: str, turn_id: str) -> spb.TurnState.ValueType:
        with map_rpc_errors():
            return self._stub.CancelTurn(
                spb.CancelTurnRequest(session_id=session_id, turn_id=turn_id),
                metadata=self._metadata,
                timeout=self._timeout,
            ).state
