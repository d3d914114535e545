"""A failed call's status back into the error the other side raised: the
inverse of ``TurnmeshError.to_status`` (the compatibility surfaces, a server
forwarding to another, the worker's history miss, the typed client)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

import grpc
from google.rpc import error_details_pb2, status_pb2

from turnmesh.runtime.errors import (
    RETRY_AFTER_KEY,
    STATUS_DETAILS_KEY,
    FieldViolation,
    InvalidArgument,
    TurnmeshError,
    kind_for,
)


@dataclass(frozen=True)
class StatusDetails:
    """What a status's trailers say beyond its code and message."""

    # google.rpc.ErrorInfo's reason ("" when the status had none) and metadata.
    reason: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    # google.rpc.BadRequest's field violations.
    violations: list[FieldViolation] = field(default_factory=list)
    # The retry-after trailer, in seconds.
    retry_after: int | None = None


def status_details(trailing_metadata: Sequence[tuple[str, str | bytes]]) -> StatusDetails:
    reason = ""
    metadata: dict[str, str] = {}
    violations: list[FieldViolation] = []
    retry_after: int | None = None
    for key, value in trailing_metadata:
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            with contextlib.suppress(Exception):  # unreadable details: the code still stands
                for detail in status_pb2.Status.FromString(value).details:
                    if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                        bad = error_details_pb2.BadRequest()
                        detail.Unpack(bad)
                        violations += [
                            FieldViolation(v.field, v.description) for v in bad.field_violations
                        ]
                    elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                        info = error_details_pb2.ErrorInfo()
                        detail.Unpack(info)
                        reason, metadata = info.reason, dict(info.metadata)
        elif key == RETRY_AFTER_KEY and isinstance(value, str) and value.isdigit():
            retry_after = int(value)
    return StatusDetails(reason, metadata, violations, retry_after)


def from_status(
    code: grpc.StatusCode,
    message: str,
    trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
) -> TurnmeshError:
    """A status (code, message, trailers with google.rpc details) as the error
    it was raised as: the inverse of ``TurnmeshError.to_status``."""
    details = status_details(trailing_metadata)
    kind = kind_for(code, details.reason)
    # Built without the rows' own constructors (InvalidArgument's, HistoryMiss's):
    # the error is rebuilt exactly as it was sent.
    error = TurnmeshError.__new__(kind)
    TurnmeshError.__init__(
        error, message, reason=details.reason or None, metadata=dict(details.metadata)
    )
    if isinstance(error, InvalidArgument):
        error.violations = list(details.violations)
    # As sent: a RESOURCE_EXHAUSTED that gRPC raised itself (a message over
    # the size limit) asks for no wait.
    error.retry_after = details.retry_after
    return error


class _FailedCall(Protocol):
    def code(self) -> grpc.StatusCode: ...
    def details(self) -> str | None: ...
    def trailing_metadata(self) -> Iterable[tuple[str, str | bytes]] | None: ...


def call_status(
    exc: grpc.RpcError,
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str | bytes], ...]]:
    """A failed call's code, message and trailers."""
    if not callable(getattr(exc, "code", None)):
        return grpc.StatusCode.UNKNOWN, "the call failed without a status", ()
    # Every RpcError grpc raises (sync and aio) carries its status like this.
    call = cast(_FailedCall, exc)
    return call.code(), call.details() or "", tuple(call.trailing_metadata() or ())


def from_rpc_error(exc: grpc.RpcError) -> TurnmeshError:
    """A failed call's status as the error the other side raised."""
    return from_status(*call_status(exc))


@contextlib.contextmanager
def mapped_rpc_errors() -> Iterator[None]:
    """Re-raise a failed call's status as a TurnmeshError (``raise … from``)."""
    try:
        yield
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from exc
