"""AReaL's gateway WebSocket protocol (``/ws``): its frames, its runs, and
the listener a session server serves it on."""

from turnmesh.server.compat.areal_ws.gateway import Gateway

__all__ = ["Gateway"]
