"""Errors a client sees, built from the server's gRPC status and details.

One class per row of the server's error table (``turnmesh.runtime.errors``),
found by the status's ``ErrorInfo.reason`` first, then by its code::

    TurnmeshClientError            (any other status; .code, .reason, .retry_after)
    ├── RequestCancelledError      CANCELLED (not asyncio's CancelledError)
    ├── InvalidArgumentError       INVALID_ARGUMENT (.violations: field -> description)
    ├── DeadlineExceededError      DEADLINE_EXCEEDED
    ├── NotFoundError              NOT_FOUND
    ├── AlreadyExistsError         ALREADY_EXISTS
    ├── PermissionDeniedError      PERMISSION_DENIED
    ├── ResourceExhaustedError     RESOURCE_EXHAUSTED (a server's limits; .retry_after)
    │   └── RateLimitedError       RATE_LIMITED (this API key's request rate)
    ├── FailedPreconditionError    FAILED_PRECONDITION
    ├── AbortedError               ABORTED
    │   └── SessionBusyError       SESSION_BUSY (REJECT policy while a turn runs)
    ├── OutOfRangeError            OUT_OF_RANGE (resuming before the events kept)
    ├── UnimplementedError         UNIMPLEMENTED
    ├── UnavailableError           UNAVAILABLE (retry, on any server)
    ├── UnauthenticatedError       UNAUTHENTICATED
    └── TurnFailedError            a turn that ended with RUN_ERROR (.event)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc

from turnmesh.runtime import errors
from turnmesh.v1 import event_pb2


class TurnmeshClientError(Exception):
    """Base of every error the turnmesh client raises."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        # google.rpc.ErrorInfo.reason, e.g. "SESSION_BUSY" (empty if none).
        self.reason = ""
        # google.rpc.ErrorInfo.metadata, e.g. {"param": "model"}.
        self.metadata: dict[str, str] = {}
        self.violations: dict[str, str] = {}
        # Seconds the server asks the caller to wait before retrying.
        self.retry_after: int | None = None


class RequestCancelledError(TurnmeshClientError):
    pass


class InvalidArgumentError(TurnmeshClientError):
    pass


class DeadlineExceededError(TurnmeshClientError):
    pass


class NotFoundError(TurnmeshClientError):
    pass


class AlreadyExistsError(TurnmeshClientError):
    pass


class PermissionDeniedError(TurnmeshClientError):
    pass


class ResourceExhaustedError(TurnmeshClientError):
    pass


class RateLimitedError(ResourceExhaustedError):
    pass


class FailedPreconditionError(TurnmeshClientError):
    pass


class AbortedError(TurnmeshClientError):
    pass


class SessionBusyError(AbortedError):
    pass


class OutOfRangeError(TurnmeshClientError):
    pass


class UnimplementedError(TurnmeshClientError):
    pass


class UnavailableError(TurnmeshClientError):
    pass


class UnauthenticatedError(TurnmeshClientError):
    pass


class TurnFailedError(TurnmeshClientError):
    def __init__(self, event: event_pb2.Event) -> None:
        super().__init__(event.message or event.problem.detail or "turn failed")
        self.event = event


# The server's row -> this client's class. Rows not listed (INTERNAL,
# UNKNOWN, DATA_LOSS, and the worker-only HISTORY_MISS) are TurnmeshClientError
# or the class of the row they descend from.
CLIENT_CLASSES: dict[type, type[TurnmeshClientError]] = {
    errors.Cancelled: RequestCancelledError,
    errors.InvalidArgument: InvalidArgumentError,
    errors.DeadlineExceeded: DeadlineExceededError,
    errors.NotFound: NotFoundError,
    errors.AlreadyExists: AlreadyExistsError,
    errors.PermissionDenied: PermissionDeniedError,
    errors.ResourceExhausted: ResourceExhaustedError,
    errors.RateLimited: RateLimitedError,
    errors.FailedPrecondition: FailedPreconditionError,
    errors.Aborted: AbortedError,
    errors.SessionBusy: SessionBusyError,
    errors.OutOfRange: OutOfRangeError,
    errors.Unimplemented: UnimplementedError,
    errors.Unavailable: UnavailableError,
    errors.Unauthenticated: UnauthenticatedError,
}


def client_class(kind: type[errors.TurnmeshError]) -> type[TurnmeshClientError]:
    """The client class of a row: its own, or that of the nearest row above it."""
    for ancestor in kind.__mro__:
        if ancestor in CLIENT_CLASSES:
            return CLIENT_CLASSES[ancestor]
    return TurnmeshClientError


def from_rpc_error(exc: grpc.RpcError) -> TurnmeshClientError:
    """A failed call as the client error of its row in the error table."""
    domain = errors.from_rpc_error(exc)
    details = errors.status_details(_trailers(exc))
    error = client_class(type(domain))(domain.detail or domain.code.name, domain.code)
    error.reason = details.reason
    error.metadata = dict(details.metadata)
    error.retry_after = details.retry_after
    error.violations = {v.field: v.description for v in details.violations}
    return error


def _trailers(exc: grpc.RpcError) -> tuple[tuple[str, str | bytes], ...]:
    trailing = getattr(exc, "trailing_metadata", None)
    return tuple(trailing() or ()) if callable(trailing) else ()


@contextlib.contextmanager
def map_rpc_errors() -> Iterator[None]:
    """Re-raise gRPC errors as TurnmeshClientError: the client's one boundary."""
    try:
        yield
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from exc
