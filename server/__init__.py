"""The session server (``turnmesh server``): the public SessionService."""

from turnmesh.server.app import ServerConfig, SessionServer, serve

__all__ = ["ServerConfig", "SessionServer", "serve"]
