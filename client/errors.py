"""Errors a client sees, built from the server's gRPC status and details.

One class per row of the server's error table (``turnmesh.runtime.errors``),
found by the status's ``ErrorInfo.reason`` first, then by its code::

    TurnmeshClientError            (any other status; .code, .reason, .retry_after)
    ├── RequestCancelledError      CANCELLED (not asyncio's CancelledError)
    ├── InvalidArgumentError       INVALID_ARGUMENT (.violations: field -> description)
    ├── DeadlineExceededError      DEADLINE_EXCEEDED
    ├── NotFoundError              NOT_FOUND
    │   └── TurnNotFoundError      TURN_NOT_FOUND (a fork's turn is not in the history)
    ├── AlreadyExistsError         ALREADY_EXISTS
    │   ├── IdempotencyKeyReusedError  IDEMPOTENCY_KEY_REUSED (the key named another request)
    │   └── TurnAlreadyFinishedError   TURN_ALREADY_FINISHED (the key's turn ended, events gone)
    ├── PermissionDeniedError      PERMISSION_DENIED
    ├── ResourceExhaustedError     RESOURCE_EXHAUSTED (a server's limits; .retry_after)
    │   ├── RateLimitedError       RATE_LIMITED (this principal's request rate)
    │   ├── SessionQuotaExceededError  SESSION_QUOTA_EXCEEDED (sessions per principal)
    │   └── TurnQuotaExceededError     TURN_QUOTA_EXCEEDED (turns in flight per principal)
    ├── FailedPreconditionError    FAILED_PRECONDITION
    ├── AbortedError               ABORTED
    │   ├── SessionBusyError       SESSION_BUSY (REJECT policy while a turn runs)
    │   ├── AwaitingClientError    AWAITING_CLIENT (the session waits for tool results/answers)
    │   └── NotWaitingError        NOT_WAITING (answers sent to a session that waits for none)
    ├── OutOfRangeError            OUT_OF_RANGE (resuming before the events kept)
    ├── UnimplementedError         UNIMPLEMENTED
    ├── UnavailableError           UNAVAILABLE (retry, on any server)
    │   └── NoLiveWorkerError      NO_LIVE_WORKER (the agent's workers are all gone; .retry_after)
    ├── UnauthenticatedError       UNAUTHENTICATED
    └── TurnFailedError            a turn that ended with RUN_ERROR (.event)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc

from turnmesh.runtime import error_decoding, errors
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
    """The call was cancelled before it finished."""


class InvalidArgumentError(TurnmeshClientError):
    """The request was refused as invalid; ``.violations`` names each bad field."""


class DeadlineExceededError(TurnmeshClientError):
    """The call's deadline passed before an answer."""


class NotFoundError(TurnmeshClientError):
    """No such session, turn or agent (or not yours to see)."""


class TurnNotFoundError(NotFoundError):
    """The turn named (a fork's point) is not in the session's history."""


class AlreadyExistsError(TurnmeshClientError):
    """A session with that id exists already."""


class IdempotencyKeyReusedError(AlreadyExistsError):
    """The idempotency key was used for a turn with a different request."""


class TurnAlreadyFinishedError(AlreadyExistsError):
    """The idempotency key's turn finished and its events are no longer kept:
    its messages are in the session's history; never run again."""


class PermissionDeniedError(TurnmeshClientError):
    """The caller may not do this."""


class ResourceExhaustedError(TurnmeshClientError):
    """A server's limit was reached; retry after ``.retry_after`` seconds."""


class RateLimitedError(ResourceExhaustedError):
    """This principal's request rate was exceeded; retry after ``.retry_after``."""


class SessionQuotaExceededError(ResourceExhaustedError):
    """This principal holds as many sessions as it may: delete one first."""


class TurnQuotaExceededError(ResourceExhaustedError):
    """This principal runs as many turns at once as it may; retry after ``.retry_after``."""


class FailedPreconditionError(TurnmeshClientError):
    """The request cannot be served in the current state."""


class AbortedError(TurnmeshClientError):
    """The call conflicted with another."""


class SessionBusyError(AbortedError):
    """A turn runs on the session and the REJECT policy refused this one."""


class AwaitingClientError(AbortedError):
    """The session waits for the client's tool results or answers (its
    ``Session.pause``); the next turn must carry exactly those."""


class NotWaitingError(AbortedError):
    """Tool results or resume entries sent to a session that waits for none;
    ``metadata["why"]`` is "expired" or "cancelled" for a pause that ended so."""


class OutOfRangeError(TurnmeshClientError):
    """A resume asked for events no longer kept."""


class UnimplementedError(TurnmeshClientError):
    """The server does not offer this call."""


class UnavailableError(TurnmeshClientError):
    """The mesh cannot serve the call now; retry (any server will do)."""


class NoLiveWorkerError(UnavailableError):
    """No worker of the session's agent is live now; retry after ``.retry_after``."""


class UnauthenticatedError(TurnmeshClientError):
    """No API key, or one the mesh does not know."""


class TurnFailedError(TurnmeshClientError):
    def __init__(self, event: event_pb2.Event) -> None:
        super().__init__(event.message or event.problem.detail or "turn failed")
        self.event = event


# The server's row -> this client's class. Rows not listed (INTERNAL,
# UNKNOWN, DATA_LOSS, the mesh's own and the compatibility surfaces' reasons)
# are TurnmeshClientError or the class of the row they descend from.
CLIENT_CLASSES: dict[type, type[TurnmeshClientError]] = {
    errors.Cancelled: RequestCancelledError,
    errors.InvalidArgument: InvalidArgumentError,
    errors.DeadlineExceeded: DeadlineExceededError,
    errors.NotFound: NotFoundError,
    errors.TurnNotFound: TurnNotFoundError,
    errors.AlreadyExists: AlreadyExistsError,
    errors.IdempotencyKeyReused: IdempotencyKeyReusedError,
    errors.TurnAlreadyFinished: TurnAlreadyFinishedError,
    errors.PermissionDenied: PermissionDeniedError,
    errors.ResourceExhausted: ResourceExhaustedError,
    errors.RateLimited: RateLimitedError,
    errors.SessionQuotaExceeded: SessionQuotaExceededError,
    errors.TurnQuotaExceeded: TurnQuotaExceededError,
    errors.FailedPrecondition: FailedPreconditionError,
    errors.Aborted: AbortedError,
    errors.SessionBusy: SessionBusyError,
    errors.AwaitingClient: AwaitingClientError,
    errors.NotWaiting: NotWaitingError,
    errors.OutOfRange: OutOfRangeError,
    errors.Unimplemented: UnimplementedError,
    errors.Unavailable: UnavailableError,
    errors.NoLiveWorker: NoLiveWorkerError,
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
    code, message, trailers = error_decoding.call_status(exc)
    details = error_decoding.status_details(trailers)
    error = client_class(errors.kind_for(code, details.reason))(message or code.name, code)
    error.reason = details.reason
    error.metadata = dict(details.metadata)
    error.retry_after = details.retry_after
    error.violations = {v.field: v.description for v in details.violations}
    return error


@contextlib.contextmanager
def map_rpc_errors() -> Iterator[None]:
    """Re-raise gRPC errors as TurnmeshClientError: the client's one boundary."""
    try:
        yield
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from exc
