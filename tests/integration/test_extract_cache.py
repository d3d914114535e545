"""The worker's cache of file texts on a real mesh: a file attached again in a
session is not read again (the worker's reader slots, which count every read
in ``turnmesh_file_queue_seconds``, see it once) while the agent still gets
its text, and another principal's same file is read for that principal."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import samples
from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient, TurnResult
from turnmesh.v1 import event_pb2, message_pb2

MESH_KEY = "tm-extract-cache-mesh-key-0123456789"
KEYS = {"acme": "key-of-acme", "beta": "key-of-beta"}
CACHE = "turnmesh_worker_file_text_cache_total"
READS = "turnmesh_file_queue_seconds_count"  # one per file given a reader


def _samples(address: str) -> dict[str, float]:
    text = httpx.get(f"http://{address}/metrics", timeout=10).text
    return {
        s.name + "".join(f"{{{v}}}" for v in s.labels.values()): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in (CACHE, READS)
    }


def _file_reads(result: TurnResult) -> list[dict[str, object]]:
    return [
        dict(e.value.struct_value)
        for e in result.events
        if e.type == event_pb2.CUSTOM and e.name == "file_read"
    ]


async def test_a_file_attached_again_is_not_read_again(mesh_factory: Mesh, tmp_path: Path) -> None:
    keys = tmp_path / "api-keys"
    keys.write_text("".join(f"{name}\t{key}\n" for name, key in KEYS.items()))
    mesh = mesh_factory
    mesh.common_args = ("--mesh-key", MESH_KEY)
    router = mesh.start_router()
    worker = mesh.spawn(
        "worker", "worker", "--router", router.address, "--agent", "demo", "--metrics-port", "0"
    )
    server = mesh.spawn_server("server", "--api-keys-file", str(keys))
    mesh.wait_ready(worker, server)

    def counts() -> dict[str, float]:
        return _samples(str(worker.info["metrics_address"]))

    content = samples.pdf("Quarterly report.", "The vault code is 7391.")
    report = message_pb2.File(content=content, mime_type="application/pdf", filename="report.pdf")
    sha256 = hashlib.sha256(content).hexdigest()

    async with AsyncClient(server.address, api_key=KEYS["acme"]) as acme:
        sid = (await acme.create_session()).session_id
        first = await acme.send(sid, "What is the vault code?", files=[report])
        assert counts() == {f"{CACHE}{{miss}}": 1, READS: 1}
        second = await acme.send(sid, "Which vault code is in the report?", files=[report])
        # The same text reached the agent and the history, without a reader.
        assert "7391" in first.text and "7391" in second.text
        assert _file_reads(second) == _file_reads(first)
        assert _file_reads(second)[0]["sha256"] == sha256
        assert "error" not in _file_reads(second)[0]
        history = await acme.history(sid)
        attached = [m.files[0].text for m in history if m.files]
        assert len(attached) == 2 and all("7391" in text for text in attached)
        assert counts() == {f"{CACHE}{{miss}}": 1, f"{CACHE}{{hit}}": 1, READS: 1}

    async with AsyncClient(server.address, api_key=KEYS["beta"]) as beta:
        # Another principal's same bytes are read for it (a hit would tell it
        # that someone sent this file); twice in one turn, once.
        sid = (await beta.create_session()).session_id
        result = await beta.send(sid, "What is the vault code?", files=[report, report])
        assert [r["sha256"] for r in _file_reads(result)] == [sha256, sha256]
        assert "7391" in result.text
        after = counts()
        assert (after[f"{CACHE}{{miss}}"], after[READS]) == (2, 2)
        # The second copy found the first's text, or its read running.
        served = after.get(f"{CACHE}{{hit}}", 0) + after.get(f"{CACHE}{{shared}}", 0)
        assert served == 2
