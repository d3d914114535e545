"""Typed Python clients for turnmesh's public SessionService.

``AsyncClient`` (asyncio first) and ``Client`` (blocking) offer the same calls
with the same parameters: create and list sessions, stream or send a turn, resume a
turn, cancel, history, delete, health. ``tool``, ``tool_result``, ``approve`` and
``resume`` build a turn's own tools and the answers to a turn that waits for the
client. Errors are ``TurnmeshClientError``
subclasses, one per row of the server's error table.
"""

from types import FunctionType

from turnmesh.client._async import AsyncClient, EventStream
from turnmesh.client._pauses import approve, resume, tool, tool_result
from turnmesh.client._sync import Client
from turnmesh.client._turns import Policy, PolicyName, TurnOptions, TurnResult
from turnmesh.client.errors import (
    AbortedError,
    AlreadyExistsError,
    AwaitingClientError,
    DeadlineExceededError,
    FailedPreconditionError,
    IdempotencyKeyReusedError,
    InvalidArgumentError,
    NoLiveWorkerError,
    NotFoundError,
    NotWaitingError,
    OutOfRangeError,
    PermissionDeniedError,
    RateLimitedError,
    RequestCancelledError,
    ResourceExhaustedError,
    SessionBusyError,
    SessionQuotaExceededError,
    TurnAlreadyFinishedError,
    TurnFailedError,
    TurnmeshClientError,
    TurnNotFoundError,
    TurnQuotaExceededError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "AsyncClient",
    "AwaitingClientError",
    "Client",
    "DeadlineExceededError",
    "EventStream",
    "FailedPreconditionError",
    "IdempotencyKeyReusedError",
    "InvalidArgumentError",
    "NoLiveWorkerError",
    "NotFoundError",
    "NotWaitingError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "Policy",
    "PolicyName",
    "RateLimitedError",
    "RequestCancelledError",
    "ResourceExhaustedError",
    "SessionBusyError",
    "SessionQuotaExceededError",
    "TurnAlreadyFinishedError",
    "TurnFailedError",
    "TurnNotFoundError",
    "TurnOptions",
    "TurnQuotaExceededError",
    "TurnResult",
    "TurnmeshClientError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "approve",
    "resume",
    "tool",
    "tool_result",
]

# Reprs, tracebacks and docs say turnmesh.client.Client, not the private module.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type | FunctionType):
        _obj.__module__ = __name__
del _name, _obj
