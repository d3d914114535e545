"""The one error table of turnmesh: every gRPC status a caller can get, with
its ``google.rpc.ErrorInfo`` reason, HTTP status, problem type, title and
OpenAI error type. Everything else reads it: the interceptor that turns these
errors into statuses, Envoy's Lua filter and local replies (rendered from it),
the typed client's exceptions and the compatibility surfaces.

::

    TurnmeshError           INTERNAL             500  internal
    ├── Cancelled           CANCELLED            499  cancelled
    ├── Unknown             UNKNOWN              500  unknown
    ├── InvalidArgument     INVALID_ARGUMENT     400  invalid-argument   (+ BadRequest)
    │   └── InvalidParams     reason INVALID_PARAMS   invalid-params     (A2A; + BadRequest)
    │   │   └── ContentTypeNotSupported  reason CONTENT_TYPE_NOT_SUPPORTED  (A2A)
    │   └── InvalidRequest    reason INVALID_REQUEST  invalid-request    (A2A; the edge's)
    ├── DeadlineExceeded    DEADLINE_EXCEEDED    504  deadline-exceeded
    ├── NotFound            NOT_FOUND            404  not-found
    │   ├── ModelNotFound     reason MODEL_NOT_FOUND  model-not-found
    │   ├── TurnNotFound      reason TURN_NOT_FOUND   turn-not-found
    │   ├── ItemNotFound      reason ITEM_NOT_FOUND   item-not-found
    │   ├── PreviousResponseNotFound  reason PREVIOUS_RESPONSE_NOT_FOUND
    │   ├── TaskNotFound      reason TASK_NOT_FOUND   task-not-found     (A2A)
    │   ├── MethodNotFound    reason METHOD_NOT_FOUND method-not-found   (A2A; the edge's)
    │   └── UnknownMember     reason UNKNOWN_MEMBER   unknown-member     (router to member)
    ├── AlreadyExists       ALREADY_EXISTS       409  already-exists
    │   ├── IdempotencyKeyReused  reason IDEMPOTENCY_KEY_REUSED  idempotency-key-reused
    │   └── TurnAlreadyFinished   reason TURN_ALREADY_FINISHED   (x-should-retry: false)
    ├── PermissionDenied    PERMISSION_DENIED    403  permission-denied
    ├── ResourceExhausted   RESOURCE_EXHAUSTED   429  resource-exhausted (Retry-After)
    │   ├── RateLimited       reason RATE_LIMITED     rate-limited       (Retry-After)
    │   ├── SessionQuotaExceeded  reason SESSION_QUOTA_EXCEEDED  (Retry-After)
    │   └── TurnQuotaExceeded     reason TURN_QUOTA_EXCEEDED     (Retry-After)
    ├── FailedPrecondition  FAILED_PRECONDITION  400  failed-precondition
    │   ├── HistoryMiss       reason HISTORY_MISS     history-miss       (worker to server)
    │   ├── TurnFailed        reason TURN_FAILED      turn-failed        (x-should-retry: false)
    │   ├── TaskNotCancelable reason TASK_NOT_CANCELABLE  task-not-cancelable  (A2A)
    │   ├── UnsupportedOperation  reason UNSUPPORTED_OPERATION  (A2A)
    │   ├── PushNotificationNotSupported  reason PUSH_NOTIFICATION_NOT_SUPPORTED  (A2A)
    │   └── ExtendedAgentCardNotConfigured  reason EXTENDED_AGENT_CARD_NOT_CONFIGURED  (A2A)
    ├── Aborted             ABORTED              409  aborted
    │   ├── SessionBusy       reason SESSION_BUSY     session-busy       (Retry-After)
    │   ├── TurnCancelled     reason TURN_CANCELLED   turn-cancelled     (x-should-retry: false)
    │   ├── AwaitingClient    reason AWAITING_CLIENT  awaiting-client    (x-should-retry: false)
    │   └── NotWaiting        reason NOT_WAITING      not-waiting        (x-should-retry: false)
    ├── OutOfRange          OUT_OF_RANGE         400  out-of-range
    ├── Unimplemented       UNIMPLEMENTED        501  unimplemented
    ├── Unavailable         UNAVAILABLE          503  unavailable
    │   ├── NoLiveWorker      reason NO_LIVE_WORKER   no-live-worker     (Retry-After)
    │   ├── OwnerAway         reason OWNER_AWAY       owner-away
    │   └── HeldElsewhere     reason HELD_ELSEWHERE   held-elsewhere     (between servers)
    ├── DataLoss            DATA_LOSS            500  data-loss
    └── Unauthenticated     UNAUTHENTICATED      401  unauthenticated    (WWW-Authenticate)

The rows marked A2A are the agent-to-agent protocol's own errors: their
ErrorInfo's domain is A2A's (``a2a-protocol.org``), as A2A clients read it.

Each row also has a JSON-RPC 2.0 error code (A2A's JSON-RPC binding): an A2A
row takes A2A's own (-32001 TaskNotFound … as the pinned a2a-sdk's table
says, -32602 InvalidParams), INVALID_ARGUMENT and OUT_OF_RANGE are -32602
(invalid params), INTERNAL, UNKNOWN and DATA_LOSS -32603 (internal error), and
every other row -32050 minus its gRPC code (-32058 RESOURCE_EXHAUSTED, -32060
ABORTED …: the server range, clear of A2A's -32001…-32009), its reason in the
error's data.

A row is found by its ``ErrorInfo.reason`` first (so ``RateLimited`` and
``ResourceExhausted`` stay distinct), then by the status code. Handlers raise
these; ``turnmesh.runtime.interceptors.ErrorMappingInterceptor`` turns them
into statuses at the one boundary, and ``error_decoding.from_rpc_error`` turns
a status back into the same error (the compatibility surfaces, the worker's
history miss). ``turnmesh.envoy.edge_rows`` gives each status Envoy answers by
itself its row; ``turn_errors.TurnError`` is the smaller table of a turn's
in-band ``RUN_ERROR`` problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import grpc
from a2a.utils.errors import A2A_REASON_TO_ERROR, JSON_RPC_ERROR_CODE_MAP
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

ERROR_DOMAIN = "turnmesh.dev"
# The ErrorInfo domain of A2A's own errors (TASK_NOT_FOUND …), as its spec and
# its SDKs' clients expect.
A2A_DOMAIN = "a2a-protocol.org"
PROBLEM_BASE = "https://turnmesh.dev/problems/"
STATUS_DETAILS_KEY = "grpc-status-details-bin"
RETRY_AFTER_KEY = "retry-after"


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


@dataclass(frozen=True)
class Row:
    """One row of the table, as the edge and the tests read it."""

    code: grpc.StatusCode
    reason: str
    http_status: int
    slug: str
    title: str
    openai_type: str
    name: str
    jsonrpc_code: int

    @property
    def problem_type(self) -> str:
        return PROBLEM_BASE + self.slug


_BY_CODE: dict[grpc.StatusCode, type[TurnmeshError]] = {}
_BY_REASON: dict[str, type[TurnmeshError]] = {}


class TurnmeshError(Exception):
    """Base of every error turnmesh reports to a caller (and the INTERNAL row)."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    http_status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"
    openai_type: ClassVar[str] = "server_error"
    # Seconds; sent as `retry-after` metadata, which Envoy passes on as the
    # HTTP Retry-After header.
    default_retry_after: ClassVar[int | None] = None
    # More trailing metadata (Envoy passes it on as HTTP headers).
    trailers: ClassVar[tuple[tuple[str, str], ...]] = ()
    # Whose reason this is (google.rpc.ErrorInfo's domain).
    domain: ClassVar[str] = ERROR_DOMAIN

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "slug" not in cls.__dict__:
            return  # an alias, not a row of its own
        if "code" in cls.__dict__:
            if cls.code in _BY_CODE:
                raise TypeError(f"two rows for {cls.code.name}: {cls.__name__}")
            _BY_CODE[cls.code] = cls
        else:
            _BY_REASON[cls.reason_name()] = cls

    def __init__(
        self,
        detail: str,
        *,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason or self.reason_name()
        # Goes into google.rpc.ErrorInfo.metadata (e.g. {"param": "model"}).
        self.metadata = metadata or {}
        self.retry_after = retry_after if retry_after is not None else self.default_retry_after

    @classmethod
    def reason_name(cls) -> str:
        """The ErrorInfo reason of this row (e.g. ``SESSION_BUSY``)."""
        return cls.slug.upper().replace("-", "_")

    @classmethod
    def row(cls) -> Row:
        return Row(
            cls.code,
            cls.reason_name(),
            cls.http_status,
            cls.slug,
            cls.title,
            cls.openai_type,
            cls.__name__,
            cls.jsonrpc_code(),
        )

    @classmethod
    def jsonrpc_code(cls) -> int:
        """This row's JSON-RPC 2.0 error code (the module's docstring says which)."""
        if cls.domain == A2A_DOMAIN:
            return JSON_RPC_ERROR_CODE_MAP[A2A_REASON_TO_ERROR[cls.reason_name()]]
        return _JSONRPC_BY_CODE.get(cls.code, JSONRPC_SERVER_BASE - _rpc_code(cls.code))

    def details(self) -> list[any_pb2.Any]:
        """google.rpc detail messages for this error."""
        return [_error_info(self.reason, self.domain, self.metadata)]

    def to_status(self) -> grpc.Status:
        status = status_pb2.Status(code=_rpc_code(self.code), message=self.detail)
        status.details.extend(self.details())
        converted: grpc.Status = rpc_status.to_status(status)
        extra = list(self.trailers)
        if self.retry_after is not None:
            extra.append((RETRY_AFTER_KEY, str(self.retry_after)))
        if not extra:
            return converted
        return _Status(converted.code, converted.details, (*converted.trailing_metadata, *extra))


class Cancelled(TurnmeshError):
    code = grpc.StatusCode.CANCELLED
    # 499: the de facto status for a request the client cancelled.
    http_status = 499
    slug = "cancelled"
    title = "Request cancelled"
    openai_type = "server_error"


class Unknown(TurnmeshError):
    code = grpc.StatusCode.UNKNOWN
    http_status = 500
    slug = "unknown"
    title = "Unknown error"
    openai_type = "server_error"


class InvalidArgument(TurnmeshError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400
    slug = "invalid-argument"
    title = "Invalid request"
    openai_type = "invalid_request_error"

    def __init__(self, violations: Sequence[FieldViolation]) -> None:
        if not violations:
            raise ValueError("InvalidArgument needs at least one violation")
        summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
        super().__init__(summary)
        self.violations = list(violations)

    def details(self) -> list[any_pb2.Any]:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=v.field, description=v.description
                )
                for v in self.violations
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(bad)
        return [packed]


class InvalidParams(InvalidArgument):
    """An A2A request's parameters are invalid (its InvalidParamsError): the
    field violations, and ErrorInfo with A2A's domain, which its clients map."""

    slug = "invalid-params"
    title = "Invalid parameters"
    domain = A2A_DOMAIN

    def details(self) -> list[any_pb2.Any]:
        return [_error_info(self.reason, self.domain, self.metadata), *super().details()]


class ContentTypeNotSupported(InvalidParams):
    """An A2A message part the mesh does not take (a file by URL, say)."""

    slug = "content-type-not-supported"
    title = "Content type not supported"


class InvalidRequest(InvalidArgument):
    """A2A's InvalidRequestError: a request the edge refuses before reading
    it as one (not JSON, too large, a media type it does not take)."""

    slug = "invalid-request"
    title = "Request not readable"
    domain = A2A_DOMAIN

    def details(self) -> list[any_pb2.Any]:
        return [_error_info(self.reason, self.domain, self.metadata), *super().details()]


class DeadlineExceeded(TurnmeshError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504
    slug = "deadline-exceeded"
    title = "Deadline exceeded"
    openai_type = "server_error"


class NotFound(TurnmeshError):
    code = grpc.StatusCode.NOT_FOUND
    http_status = 404
    slug = "not-found"
    title = "Not found"
    openai_type = "invalid_request_error"


class ModelNotFound(NotFound):
    """The compatibility surfaces' ``model`` (an agent) is served by no worker
    this mesh has ever seen."""

    slug = "model-not-found"
    title = "Model not found"


class MethodNotFound(NotFound):
    """A2A's MethodNotFoundError: a path under an A2A binding that names no
    method (the edge's own 404 there)."""

    slug = "method-not-found"
    title = "Method not found"
    domain = A2A_DOMAIN


class TurnNotFound(NotFound):
    """A turn named by id is not in the session's history (a fork's point)."""

    slug = "turn-not-found"
    title = "Turn not found"


class ItemNotFound(NotFound):
    """A Responses input item names a stored item that does not exist."""

    slug = "item-not-found"
    title = "Item not found"


class PreviousResponseNotFound(NotFound):
    """``previous_response_id`` names no stored response of the caller's."""

    slug = "previous-response-not-found"
    title = "Previous response not found"


class TaskNotFound(NotFound):
    """An A2A task id names no task of the caller's (another principal's, or
    another agent's, is not found either)."""

    slug = "task-not-found"
    title = "Task not found"
    domain = A2A_DOMAIN


class UnknownMember(NotFound):
    """The router does not know the calling member (it restarted, or dropped
    it after missed heartbeats): register again. Never reaches a public caller."""

    slug = "unknown-member"
    title = "Unknown mesh member"


class AlreadyExists(TurnmeshError):
    code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409
    slug = "already-exists"
    title = "Already exists"
    openai_type = "invalid_request_error"


class IdempotencyKeyReused(AlreadyExists):
    """A turn's idempotency key came back with a different request: the key
    names the first turn, which this request is not (never retryable)."""

    slug = "idempotency-key-reused"
    title = "Idempotency key reused"


class TurnAlreadyFinished(AlreadyExists):
    """A turn's idempotency key names a finished turn whose events are no
    longer kept: running it again would answer twice (never retryable)."""

    slug = "turn-already-finished"
    title = "Turn already finished"
    trailers = (("x-should-retry", "false"),)


class PermissionDenied(TurnmeshError):
    code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403
    slug = "permission-denied"
    title = "Permission denied"
    openai_type = "permission_error"


class ResourceExhausted(TurnmeshError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    slug = "resource-exhausted"
    title = "Too many requests"
    openai_type = "rate_limit_error"
    default_retry_after = 1


class RateLimited(ResourceExhausted):
    slug = "rate-limited"
    title = "Rate limit exceeded"


class SessionQuotaExceeded(ResourceExhausted):
    """The caller's principal holds as many sessions as it may."""

    slug = "session-quota-exceeded"
    title = "Session quota exceeded"
    # Sessions free up when deleted or expired, not within a second.
    default_retry_after = 30


class TurnQuotaExceeded(ResourceExhausted):
    """The caller's principal runs as many turns at once as it may."""

    slug = "turn-quota-exceeded"
    title = "Turn quota exceeded"


class FailedPrecondition(TurnmeshError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 400
    slug = "failed-precondition"
    title = "Failed precondition"
    openai_type = "invalid_request_error"


class HistoryMiss(FailedPrecondition):
    """A worker does not hold the history the server assumed it does (the
    server then sends all of it); never reaches a public caller."""

    slug = "history-miss"
    title = "History not held"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"this worker does not hold the history of session {session_id!r}; send all of it"
        )


class TurnFailed(FailedPrecondition):
    """A turn a surface answers in one piece failed in its agent (the
    RUN_ERROR's code is in the ErrorInfo's ``cause``): the same request would
    most likely fail the same way, so clients are told not to retry."""

    slug = "turn-failed"
    title = "Turn failed"
    trailers = (("x-should-retry", "false"),)


class TaskNotCancelable(FailedPrecondition):
    """An A2A task that ended already (completed, failed, canceled, rejected)."""

    slug = "task-not-cancelable"
    title = "Task not cancelable"
    domain = A2A_DOMAIN


class UnsupportedOperation(FailedPrecondition):
    """An A2A operation this mesh does not serve, or not in the task's state
    (resubscribing to a task that ended, a message to a finished task)."""

    slug = "unsupported-operation"
    title = "Unsupported operation"
    domain = A2A_DOMAIN


class PushNotificationNotSupported(FailedPrecondition):
    """A2A push notifications: the agent card says they are not served."""

    slug = "push-notification-not-supported"
    title = "Push notifications not supported"
    domain = A2A_DOMAIN


class ExtendedAgentCardNotConfigured(FailedPrecondition):
    """A2A's GetExtendedAgentCard where no extended card is configured (the
    card says so: its capabilities.extended_agent_card is false)."""

    slug = "extended-agent-card-not-configured"
    title = "Extended agent card not configured"
    domain = A2A_DOMAIN


class Aborted(TurnmeshError):
    code = grpc.StatusCode.ABORTED
    http_status = 409
    slug = "aborted"
    title = "Conflict"
    openai_type = "invalid_request_error"


class SessionBusy(Aborted):
    slug = "session-busy"
    title = "Session busy"
    default_retry_after = 1


class TurnCancelled(Aborted):
    """A turn a surface answers in one piece was cancelled on the server (a
    CancelTurn, a newer turn's INTERRUPT, the session's delete). Sending it
    again would run it again: the official OpenAI SDKs retry a 409 unless
    told not to."""

    slug = "turn-cancelled"
    title = "Turn cancelled"
    trailers = (("x-should-retry", "false"),)


class AwaitingClient(Aborted):
    """The session waits for the client's answers (its tools' results,
    approvals, answers to questions): the next turn must carry exactly
    those. ErrorInfo metadata names what it waits for. Sending the same
    request again cannot help (the OpenAI SDKs retry a 409 unless told not to)."""

    slug = "awaiting-client"
    title = "Session waits for the client"
    trailers = (("x-should-retry", "false"),)


class NotWaiting(Aborted):
    """Answers (tool results, resume entries) sent to a session that waits
    for none: never paused, answered already, or its pause expired or was
    cancelled (metadata ``why``: "expired" or "cancelled")."""

    slug = "not-waiting"
    title = "Session waits for no answer"
    trailers = (("x-should-retry", "false"),)


class OutOfRange(TurnmeshError):
    code = grpc.StatusCode.OUT_OF_RANGE
    http_status = 400
    slug = "out-of-range"
    title = "Out of range"
    openai_type = "invalid_request_error"


class Unimplemented(TurnmeshError):
    code = grpc.StatusCode.UNIMPLEMENTED
    http_status = 501
    slug = "unimplemented"
    title = "Not implemented"
    openai_type = "server_error"


class Unavailable(TurnmeshError):
    code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    slug = "unavailable"
    title = "Service unavailable"
    openai_type = "server_error"


class NoLiveWorker(Unavailable):
    """The agent is known, but no worker that serves it is live now (all
    stopped, restarting or draining): retry once one has registered."""

    slug = "no-live-worker"
    title = "No live worker"
    # A worker that restarts registers again within a few seconds.
    default_retry_after = 5


class OwnerAway(Unavailable):
    """The server that holds the session (in a store only it reads) is
    unreachable; the session waits for it to come back."""

    slug = "owner-away"
    title = "Session owner unreachable"


class HeldElsewhere(Unavailable):
    """Another live server holds the session's lease (metadata ``owner_id``,
    ``owner_address``): the call belongs there. Between servers only."""

    slug = "held-elsewhere"
    title = "Session held by another server"


class DataLoss(TurnmeshError):
    code = grpc.StatusCode.DATA_LOSS
    http_status = 500
    slug = "data-loss"
    title = "Data loss"
    openai_type = "server_error"


class Unauthenticated(TurnmeshError):
    code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401
    slug = "unauthenticated"
    title = "Authentication required"
    openai_type = "authentication_error"
    trailers = (("www-authenticate", 'Bearer realm="turnmesh"'),)


_BY_CODE[grpc.StatusCode.INTERNAL] = TurnmeshError

# JSON-RPC 2.0's own codes (its specification, section 5.1) for the rows they
# fit and for the envelope's own refusals; the rest count down from here.
JSONRPC_PARSE_ERROR = -32700
JSONRPC_INVALID_REQUEST = -32600
JSONRPC_METHOD_NOT_FOUND = -32601
JSONRPC_INVALID_PARAMS = -32602
JSONRPC_INTERNAL_ERROR = -32603
JSONRPC_SERVER_BASE = -32050
_JSONRPC_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: JSONRPC_INVALID_PARAMS,
    grpc.StatusCode.OUT_OF_RANGE: JSONRPC_INVALID_PARAMS,
    grpc.StatusCode.INTERNAL: JSONRPC_INTERNAL_ERROR,
    grpc.StatusCode.UNKNOWN: JSONRPC_INTERNAL_ERROR,
    grpc.StatusCode.DATA_LOSS: JSONRPC_INTERNAL_ERROR,
}


def kind_for(code: grpc.StatusCode, reason: str | None = None) -> type[TurnmeshError]:
    """The row for a status: by its ErrorInfo reason, else by its code."""
    kind = _BY_REASON.get(reason or "")
    if kind is not None and kind.code == code:
        return kind
    return _BY_CODE.get(code, TurnmeshError)


def code_rows() -> list[Row]:
    """One row per status code, in the codes' order."""
    return [_BY_CODE[code].row() for code in grpc.StatusCode if code in _BY_CODE]


def reason_rows() -> list[Row]:
    """The rows of the reasons that have one of their own (RATE_LIMITED …)."""
    return [kind.row() for kind in _BY_REASON.values()]


def rows() -> list[Row]:
    """Every row: one per status code, then one per reason of its own."""
    return code_rows() + reason_rows()


@dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def _error_info(reason: str, domain: str, metadata: dict[str, str]) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=metadata))
    return packed


def _rpc_code(code: grpc.StatusCode) -> int:
    value: int = code.value[0]
    assert code_pb2.Code.Name(value)  # every grpc.StatusCode has a google.rpc.Code
    return value
