"""OpenAI's model list (``GET /v1/models``): the agents the mesh serves.

Open WebUI, LibreChat and many SDK helpers list models before anything else;
an agent is a model here (its name is what ``model`` names in a request).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from google.api import httpbody_pb2

from turnmesh.runtime.errors import ModelNotFound
from turnmesh.server.compat._common import json_body

__all__ = ["Models"]

OWNED_BY = "turnmesh"
# A longer id is not echoed back in the error (it names no agent anyway).
MAX_ECHOED_ID = 128


class Models:
    """The agents a live worker serves now, each with when this server first
    saw it (OpenAI's ``created``; stable while the agent stays served)."""

    def __init__(self, agents: Callable[[], Iterable[str]]) -> None:
        self._agents = agents
        self._first_seen: dict[str, int] = {}

    def _served(self) -> dict[str, int]:
        now = int(time.time())
        # Only the agents served now are kept: bounded by the mesh's workers.
        self._first_seen = {
            name: self._first_seen.get(name, now) for name in sorted(self._agents())
        }
        return self._first_seen

    def list(self) -> httpbody_pb2.HttpBody:
        data = [_model(name, created) for name, created in self._served().items()]
        return json_body({"object": "list", "data": data})

    def get(self, model: str) -> httpbody_pb2.HttpBody:
        created = self._served().get(model)
        if created is None:
            shown = repr(model) if len(model) <= MAX_ECHOED_ID else "requested"
            raise ModelNotFound(
                f"The model {shown} does not exist",
                metadata={"param": "model"},
            )
        return json_body(_model(model, created))


def _model(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY}
