"""Typed Python clients for turnmesh's public SessionService.

``AsyncClient`` (asyncio first) and ``Client`` (blocking) offer the same calls:
create a session, stream or send a turn, resume a turn, cancel, history,
delete. Errors are ``TurnmeshClientError`` subclasses.
"""

from turnmesh.client._async import AsyncClient, EventStream, TurnResult
from turnmesh.client._sync import Client
from turnmesh.client.errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    RateLimitedError,
    ResourceExhaustedError,
    SessionBusyError,
    TurnFailedError,
    TurnmeshClientError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "AsyncClient",
    "CancelledError",
    "Client",
    "DeadlineExceededError",
    "EventStream",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "ResourceExhaustedError",
    "SessionBusyError",
    "TurnFailedError",
    "TurnResult",
    "TurnmeshClientError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
]
