"""Typed Python clients for turnmesh's public SessionService.

``AsyncClient`` (asyncio first) and ``Client`` (blocking) offer the same calls:
create a session, stream or send a turn, resume a turn, cancel, history,
delete. Errors are ``TurnmeshClientError`` subclasses.
"""

from turnmesh.client._async import AsyncClient, EventStream, TurnResult
from turnmesh.client._sync import Client
from turnmesh.client.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    SessionBusyError,
    TurnFailedError,
    TurnmeshClientError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = [
    "AlreadyExistsError",
    "AsyncClient",
    "Client",
    "EventStream",
    "InvalidArgumentError",
    "NotFoundError",
    "SessionBusyError",
    "TurnFailedError",
    "TurnResult",
    "TurnmeshClientError",
    "UnauthenticatedError",
    "UnavailableError",
]
