"""The public edge: Envoy's configuration and process (``turnmesh.envoy``)."""

from turnmesh.envoy.config import EdgeConfig, render

__all__ = ["EdgeConfig", "render"]
