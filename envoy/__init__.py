"""The public edge: Envoy's configuration and process (``turnmesh.envoy``)."""

from turnmesh.envoy.config import render
from turnmesh.envoy.edge_config import EdgeConfig, EdgeGuards

__all__ = ["EdgeConfig", "EdgeGuards", "render"]
