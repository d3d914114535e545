"""The one error tree of turnmesh, and its mapping to gRPC statuses.

::

    TurnmeshError                      INTERNAL           500
    ├── InvalidArgument                INVALID_ARGUMENT   400  (+ google.rpc.BadRequest)
    ├── Unauthenticated                UNAUTHENTICATED    401
    ├── PermissionDenied               PERMISSION_DENIED  403
    ├── NotFound                       NOT_FOUND          404
    ├── AlreadyExists                  ALREADY_EXISTS     409
    ├── SessionBusy                    ABORTED            409  (+ google.rpc.ErrorInfo)
    ├── FailedPrecondition             FAILED_PRECONDITION 400
    ├── OutOfRange                     OUT_OF_RANGE       400
    ├── ResourceExhausted              RESOURCE_EXHAUSTED 429
    └── Unavailable                    UNAVAILABLE        503

Handlers raise these; ``turnmesh.runtime.interceptors.ErrorMappingInterceptor``
turns them into statuses with ``google.rpc`` details at the one boundary, and
any other exception into a bare INTERNAL that leaks nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

ERROR_DOMAIN = "turnmesh.dev"
PROBLEM_BASE = "https://turnmesh.dev/problems/"


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class TurnmeshError(Exception):
    """Base of every error turnmesh reports to a caller."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    http_status: ClassVar[int] = 500
    # Seconds; sent as `retry-after` metadata, which Envoy passes on as the
    # HTTP Retry-After header.
    retry_after: ClassVar[int | None] = None
    # More trailing metadata (Envoy passes it on as HTTP headers).
    trailers: ClassVar[tuple[tuple[str, str], ...]] = ()
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"

    def __init__(
        self, detail: str, *, reason: str | None = None, metadata: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason
        # Goes into google.rpc.ErrorInfo.metadata (e.g. {"param": "model"}).
        self.metadata = metadata or {}

    @property
    def problem_type(self) -> str:
        return PROBLEM_BASE + self.slug

    def details(self) -> list[any_pb2.Any]:
        """google.rpc detail messages for this error."""
        info = error_details_pb2.ErrorInfo(
            reason=self.reason or self.slug.upper().replace("-", "_"),
            domain=ERROR_DOMAIN,
            metadata=self.metadata,
        )
        packed = any_pb2.Any()
        packed.Pack(info)
        return [packed]

    def to_status(self) -> grpc.Status:
        status = status_pb2.Status(code=_rpc_code(self.code), message=self.detail)
        status.details.extend(self.details())
        converted = rpc_status.to_status(status)
        extra = list(self.trailers)
        if self.retry_after is not None:
            extra.append(("retry-after", str(self.retry_after)))
        if not extra:
            return converted
        return _Status(converted.code, converted.details, (*converted.trailing_metadata, *extra))


class InvalidArgument(TurnmeshError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400
    slug = "invalid-argument"
    title = "Invalid request"

    def __init__(self, violations: list[FieldViolation]) -> None:
        if not violations:
            raise ValueError("InvalidArgument needs at least one violation")
        summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
        super().__init__(summary)
        self.violations = violations

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


class Unauthenticated(TurnmeshError):
    code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401
    slug = "unauthenticated"
    title = "Authentication required"
    trailers = (("www-authenticate", 'Bearer realm="turnmesh"'),)


class PermissionDenied(TurnmeshError):
    code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403
    slug = "permission-denied"
    title = "Permission denied"


class NotFound(TurnmeshError):
    code = grpc.StatusCode.NOT_FOUND
    http_status = 404
    slug = "not-found"
    title = "Not found"


class AlreadyExists(TurnmeshError):
    code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409
    slug = "already-exists"
    title = "Already exists"


class SessionBusy(TurnmeshError):
    code = grpc.StatusCode.ABORTED
    http_status = 409
    slug = "session-busy"
    title = "Session busy"
    retry_after = 1


class FailedPrecondition(TurnmeshError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 400
    slug = "failed-precondition"
    title = "Failed precondition"


class OutOfRange(TurnmeshError):
    code = grpc.StatusCode.OUT_OF_RANGE
    http_status = 400
    slug = "out-of-range"
    title = "Out of range"


class ResourceExhausted(TurnmeshError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    slug = "resource-exhausted"
    title = "Too many requests"
    retry_after = 1


class RateLimited(ResourceExhausted):
    slug = "rate-limited"
    title = "Rate limit exceeded"


class Unavailable(TurnmeshError):
    code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    slug = "unavailable"
    title = "Service unavailable"


@dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def _rpc_code(code: grpc.StatusCode) -> int:
    value: int = code.value[0]
    assert code_pb2.Code.Name(value)  # every grpc.StatusCode has a google.rpc.Code
    return value
