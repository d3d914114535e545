"""The worker: serves ``turnmesh.v1.WorkerService`` for one agent (``turnmesh.worker``)."""

from turnmesh.worker.app import WorkerConfig, serve
from turnmesh.worker.service import WorkerServicer

__all__ = ["WorkerConfig", "WorkerServicer", "serve"]
