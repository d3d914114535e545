"""The public edge: Envoy's configuration and process (``turnmesh.envoy``)."""

from turnmesh.envoy.config import EdgeConfig, render
from turnmesh.envoy.guards import EdgeGuards

__all__ = ["EdgeConfig", "EdgeGuards", "render"]
