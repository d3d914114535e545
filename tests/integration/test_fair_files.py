"""Fair file reading on a real worker: one principal's turn of many slow
files does not hold back another principal's one-file turn, and cancelling
the big turn takes its waiting files out of the queue at once."""

from __future__ import annotations

import asyncio

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import samples
from tests.support.mesh import Mesh, eventually
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import worker_service_pb2 as wpb
from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceStub

PDF = "application/pdf"
BIG_FILES = 6
REFUSED = "too many of this caller's files are waiting to be read; send it again later"


def _metrics(address: str) -> dict[str, float]:
    """The file queue's samples by name (and limit), histogram buckets left out."""
    text = httpx.get(f"http://{address}/metrics", timeout=10).text
    return {
        s.name + "".join(f"{{{v}}}" for v in s.labels.values()): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("turnmesh_file_queue")
        for s in family.samples
        if "le" not in s.labels
    }


async def test_a_small_turn_is_read_while_a_big_turn_of_another_principal_waits(
    mesh_factory: Mesh,
) -> None:
    # One reader slot, standalone (no router): the order is the scheduler's alone.
    worker = mesh_factory.spawn(
        "worker",
        "worker",
        "--router",
        "",
        "--agent",
        "echo",
        "--file-concurrency",
        "1",
        "--metrics-port",
        "0",
        # Alice may hold 5 waiting files: her big turn's, and no more.
        "--file-queue",
        "10",
    )
    mesh_factory.wait_ready(worker)
    metrics_address = str(worker.info["metrics_address"])

    def metric(name: str) -> float:
        return _metrics(metrics_address)[name]

    async def depth() -> float:
        return await asyncio.to_thread(metric, "turnmesh_file_queue_depth")

    async def alice_queued() -> bool:
        # One of hers is being read, the rest wait (for seconds: the worker's
        # fork server starts, then the first file takes a second).
        return await depth() == BIG_FILES - 1

    async def queue_empty() -> bool:
        return await depth() == 0

    # 20,000 blank pages: each takes a reader about a second.
    slow = samples.blank_pdf(20_000)
    big_request = wpb.RunRequest(
        session_id="alice/big",
        turn_id="t1",
        messages=["Read them all"],
        files=[
            # Each its own bytes: the worker reads one file's copies once.
            message_pb2.File(content=slow + b"%% copy %d\n" % n, mime_type=PDF, filename=f"{n}.pdf")
            for n in range(BIG_FILES)
        ],
    )
    small_request = wpb.RunRequest(
        session_id="bob/small",
        turn_id="t1",
        messages=["Read mine"],
        files=[message_pb2.File(content=b"bob's note", mime_type="text/plain", filename="b.txt")],
    )
    async with grpc.aio.insecure_channel(worker.address) as channel:
        stub = WorkerServiceStub(channel)
        big = stub.Run(big_request, timeout=300)
        # The big turn's first response comes only once all its files are read.
        big_read = asyncio.create_task(big.read())
        await eventually(alice_queued, timeout=60, what="alice's files queued")

        # Alice's next file finds her share of the queue full: it fails alone, at once.
        more = wpb.RunRequest(
            session_id="alice/other",
            turn_id="t1",
            messages=["And this"],
            files=[message_pb2.File(content=b"more", mime_type="text/plain", filename="m.txt")],
        )
        refused = [r async for r in stub.Run(more, timeout=120)]
        (ref,) = refused[0].files
        assert (ref.text, ref.error) == ("", REFUSED)
        (event,) = refused[0].events
        assert event.value.struct_value["error"] == REFUSED
        assert refused[-1].events[-1].type == event_pb2.RUN_FINISHED
        assert await asyncio.to_thread(metric, "turnmesh_file_queue_refused_total{principal}") == 1

        small = [r async for r in stub.Run(small_request, timeout=120)]

        # Bob's turn finished while alice's files were still waiting.
        assert not big_read.done()
        assert await depth() >= 1
        (read,) = small[0].files
        assert (read.text, read.error) == ("bob's note", "")
        assert small[-1].events[-1].type == event_pb2.RUN_FINISHED
        # Bob waited for the slot alice's first file held, not for her queue.
        granted = await asyncio.to_thread(metric, "turnmesh_file_queue_seconds_count")
        assert granted >= 2
        assert await asyncio.to_thread(metric, "turnmesh_file_queue_seconds_sum") > 0

        # Cancelled, alice's waiting files leave the queue and are never read.
        big.cancel()
        await eventually(queue_empty, timeout=10, what="alice's files gone")
        # At most the one granted between the scrape and the cancel.
        after = await asyncio.to_thread(metric, "turnmesh_file_queue_seconds_count")
        assert after <= granted + 1
        assert big_read.done()
    assert worker.proc.poll() is None
