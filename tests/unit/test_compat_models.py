"""OpenAI's model list over the agents a server's pool knows."""

from __future__ import annotations

import json
import time

import pytest

from turnmesh.runtime.errors import NotFound
from turnmesh.server.compat.openai_models import Models


def test_models_are_the_served_agents_with_a_stable_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = {"echo", "demo"}
    clock = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    models = Models(lambda: served)
    first = json.loads(models.list().data)
    assert first == {
        "object": "list",
        "data": [
            {"id": "demo", "object": "model", "created": 1_800_000_000, "owned_by": "turnmesh"},
            {"id": "echo", "object": "model", "created": 1_800_000_000, "owned_by": "turnmesh"},
        ],
    }
    clock[0] += 60
    served.add("probe")
    again = {m["id"]: m["created"] for m in json.loads(models.list().data)["data"]}
    assert again == {"demo": 1_800_000_000, "echo": 1_800_000_000, "probe": 1_800_000_060}
    served.discard("probe")  # no worker serves it any more: gone, and forgotten
    assert "probe" not in {m["id"] for m in json.loads(models.list().data)["data"]}
    assert models._first_seen.keys() == {"demo", "echo"}
    with pytest.raises(NotFound) as info:
        models.get("probe")
    assert info.value.reason == "MODEL_NOT_FOUND"
    assert json.loads(models.get("echo").data)["created"] == 1_800_000_000
