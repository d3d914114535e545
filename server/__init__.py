"""The session server (``turnmesh server``): the public SessionService.

Its names load on first use: ``turnmesh worker`` and ``turnmesh router``
parse the same command line, and importing the whole server (its stores,
Redis client and compatibility surfaces) cost every one of them 0.6 s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnmesh.server.app import SessionServer, serve
    from turnmesh.server.config import ServerConfig, SessionLimits

__all__ = ["ServerConfig", "SessionLimits", "SessionServer", "serve"]

_HOMES = {
    "ServerConfig": "turnmesh.server.config",
    "SessionLimits": "turnmesh.server.config",
    "SessionServer": "turnmesh.server.app",
    "serve": "turnmesh.server.app",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
