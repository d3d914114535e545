"""Errors a client sees, built from the server's gRPC status and details.

::

    TurnmeshClientError
    ├── InvalidArgumentError   INVALID_ARGUMENT  (.violations: field -> description)
    ├── NotFoundError          NOT_FOUND
    ├── AlreadyExistsError     ALREADY_EXISTS
    ├── SessionBusyError       ABORTED (REJECT policy while a turn runs)
    ├── UnauthenticatedError   UNAUTHENTICATED
    ├── UnavailableError       UNAVAILABLE
    └── TurnFailedError        a turn that ended with RUN_ERROR (.event)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc
from google.rpc import error_details_pb2, status_pb2

from turnmesh.v1 import event_pb2


class TurnmeshClientError(Exception):
    """Base of every error the turnmesh client raises."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = ""
        self.violations: dict[str, str] = {}


class InvalidArgumentError(TurnmeshClientError):
    pass


class NotFoundError(TurnmeshClientError):
    pass


class AlreadyExistsError(TurnmeshClientError):
    pass


class SessionBusyError(TurnmeshClientError):
    pass


class UnauthenticatedError(TurnmeshClientError):
    pass


class UnavailableError(TurnmeshClientError):
    pass


class TurnFailedError(TurnmeshClientError):
    def __init__(self, event: event_pb2.Event) -> None:
        super().__init__(event.message or event.problem.detail or "turn failed")
        self.event = event


_BY_CODE: dict[grpc.StatusCode, type[TurnmeshClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.ABORTED: SessionBusyError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
}


def from_rpc_error(exc: grpc.RpcError) -> TurnmeshClientError:
    code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
    message: str = exc.details() or code.name  # type: ignore[attr-defined]
    error = _BY_CODE.get(code, TurnmeshClientError)(message, code)
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                error.violations.update({v.field: v.description for v in bad.field_violations})
            elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                error.reason = info.reason
    return error


@contextlib.contextmanager
def map_rpc_errors() -> Iterator[None]:
    """Re-raise gRPC errors as TurnmeshClientError: the client's one boundary."""
    try:
        yield
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from exc
