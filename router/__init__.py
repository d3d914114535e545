"""The router: mesh membership and session ownership (turnmesh.v1.RouterService)."""

from turnmesh.router.app import RouterConfig, serve
from turnmesh.router.service import RouterServicer
from turnmesh.router.state import RouterState

__all__ = ["RouterConfig", "RouterServicer", "RouterState", "serve"]
