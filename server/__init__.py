"""The session server (``turnmesh server``): the public SessionService."""

from turnmesh.server.app import SessionServer, serve
from turnmesh.server.config import ServerConfig, SessionLimits

__all__ = ["ServerConfig", "SessionLimits", "SessionServer", "serve"]
