"""Attachments the agent can read: every kind of file reaches the demo agent as
text (OCR for images) through REST via Envoy and through gRPC, the history
keeps each file's metadata and text but not its bytes, and a broken or hostile
file fails only itself."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.conftest import SharedMesh
from tests.support import samples
from tests.support.mesh import Component, Mesh, until
from turnmesh.client import AsyncClient
from turnmesh.v1 import event_pb2, message_pb2


@dataclass(frozen=True)
class Kind:
    mime_type: str
    filename: str
    make: Callable[[], bytes]
    question: str
    answer: str  # only inside the file


KINDS = [
    Kind(
        "text/plain",
        "notes.txt",
        lambda: b"Shopping list.\nThe locker combination is 4-18-27.\nMilk.\n",
        "What is the locker combination?",
        "4-18-27",
    ),
    Kind(
        "text/csv",
        "birds.csv",
        lambda: b"species,count\nheron,3\nkingfisher,11\n",
        "How many kingfisher were counted?",
        "11",
    ),
    Kind(
        "text/markdown",
        "readme.md",
        lambda: b"# Ops\n\nThe staging password is tangerine-42.\n",
        "What is the staging password?",
        "tangerine-42",
    ),
    Kind(
        "application/pdf",
        "report.pdf",
        lambda: samples.pdf("Quarterly report.", "The vault code is 7391."),
        "What is the vault code?",
        "7391",
    ),
    Kind(
        samples.DOCX,
        "minutes.docx",
        lambda: samples.docx("The board meets on Thursday in room Cedar."),
        "Which room does the board meet in?",
        "Cedar",
    ),
    Kind(
        samples.XLSX,
        "stock.xlsx",
        lambda: samples.xlsx(("item", "count"), ("lanterns", 12), ("compasses", 37)),
        "How many compasses are in stock?",
        "37",
    ),
    Kind(
        samples.PPTX,
        "deck.pptx",
        lambda: samples.pptx("Launch plan", "Launch window opens on Saturday."),
        "When does the launch window open?",
        "Saturday",
    ),
    Kind(
        "image/png",
        "ferry.png",
        lambda: samples.image("The ferry leaves at 6:45"),
        "When does the ferry leave?",
        "6:45",
    ),
    Kind(
        "image/jpeg",
        "gate.jpg",
        lambda: samples.image("Boarding gate B12", "JPEG"),
        "Which boarding gate?",
        "B12",
    ),
    Kind(
        "image/webp",
        "shelf.webp",
        lambda: samples.image("Shelf number 908", "WEBP"),
        "What is the shelf number?",
        "908",
    ),
    Kind(
        "image/gif",
        "badge.gif",
        lambda: samples.image("Badge code KX7", "GIF"),
        "What is the badge code?",
        "KX7",
    ),
]


def _rest_file(kind: Kind, content: bytes) -> dict[str, str]:
    return {
        "content": base64.b64encode(content).decode(),
        "mime_type": kind.mime_type,
        "filename": kind.filename,
    }


async def _rest_turn(rest: httpx.AsyncClient, sid: str, body: dict[str, Any]) -> list[Any]:
    async with aconnect_sse(rest, "POST", f"/v1/sessions/{sid}/turns", json=body) as source:
        assert source.response.status_code == 200
        return [json.loads(sse.data) async for sse in source.aiter_sse()]


def _rest_text(events: list[Any]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


@pytest.mark.parametrize("kind", KINDS, ids=[k.filename for k in KINDS])
async def test_the_agent_answers_from_each_kind_of_file_over_rest(
    rest: httpx.AsyncClient, kind: Kind
) -> None:
    content = kind.make()
    sid = (await rest.post("/v1/sessions", json={})).json()["session"]["sessionId"]
    events = await _rest_turn(
        rest, sid, {"message": kind.question, "files": [_rest_file(kind, content)]}
    )
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]
    assert kind.answer in _rest_text(events)
    (read,) = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "file_read"]
    assert read["value"]["filename"] == kind.filename
    assert read["value"]["sha256"] == hashlib.sha256(content).hexdigest()
    assert "error" not in read["value"]

    history = (await rest.get(f"/v1/sessions/{sid}/history")).json()["messages"]
    (ref,) = history[0]["files"]
    assert ref["filename"] == kind.filename
    assert ref["size_bytes"] == str(len(content))
    assert ref["sha256"] == hashlib.sha256(content).hexdigest()
    assert kind.answer in ref["text"]
    assert "content" not in ref  # the bytes are not kept


@pytest.mark.parametrize("kind", KINDS, ids=[k.filename for k in KINDS])
async def test_the_agent_answers_from_each_kind_of_file_over_grpc(
    shared_mesh: SharedMesh, kind: Kind
) -> None:
    async with AsyncClient(shared_mesh.edge) as client:
        sid = (await client.create_session()).session_id
        file = message_pb2.File(
            content=kind.make(), mime_type=kind.mime_type, filename=kind.filename
        )
        result = await client.send(sid, kind.question, files=[file])
        assert kind.answer in result.text
        # The next turn's history carries the text, so the session stays small.
        (user, *_) = await client.history(sid)
        assert kind.answer in user.files[0].text
        assert user.files[0].size_bytes == len(file.content)
        # A later turn, with no file attached, still reaches the text.
        later = await client.send(sid, kind.question)
        assert kind.answer in later.text
        assert "attached earlier" in later.text


async def test_several_files_in_one_turn(client: AsyncClient) -> None:
    sid = (await client.create_session()).session_id
    files = [
        message_pb2.File(content=k.make(), mime_type=k.mime_type, filename=k.filename)
        for k in (KINDS[3], KINDS[4], KINDS[7])
    ]
    result = await client.send(sid, "When does the ferry leave?", files=files)
    assert "6:45" in result.text and "ferry.png" in result.text
    reads = [e for e in result.events if e.type == event_pb2.CUSTOM and e.name == "file_read"]
    assert [r.value.struct_value["index"] for r in reads] == [0, 1, 2]


# --- hostile files, on a mesh of our own -------------------------------------


def _bomb_docx() -> bytes:
    """A real Word document with a part that inflates to 512 MB."""
    import io
    import zipfile

    base = samples.docx("harmless")
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base)) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item.filename), zipfile.ZIP_DEFLATED)
        padding_info = zipfile.ZipInfo("word/padding.xml")
        padding_info.compress_type = zipfile.ZIP_DEFLATED
        with dst.open(padding_info, "w") as padding:
            chunk = b"\0" * (1024 * 1024)
            for _ in range(512):  # 512 MB inflated, about 0.5 MB packed
                padding.write(chunk)
    return out.getvalue()


def _pages(count: int) -> bytes:
    import io

    from pypdf import PdfWriter

    writer = PdfWriter()
    for _ in range(count):
        writer.add_blank_page(width=72, height=72)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _rss_kib(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


class MemoryWatch:
    """Peak RSS of a process and of all its descendants (the file readers)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_worker_kib = 0
        self.peak_total_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            worker = _rss_kib(self.pid)
            total = worker + sum(_rss_kib(p) for p in _descendants(self.pid))
            self.peak_worker_kib = max(self.peak_worker_kib, worker)
            self.peak_total_kib = max(self.peak_total_kib, total)
            self._stop.wait(0.02)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def file_mesh(mesh_factory: Mesh) -> tuple[Mesh, Component, Component]:
    mesh = mesh_factory
    mesh.start_router()
    assert mesh.router is not None
    worker = mesh.spawn(
        "worker",
        "worker",
        "--router",
        mesh.router.address,
        "--agent",
        "demo",
        # Ten times what the 2,000 pages of the huge PDF take on a healthy
        # machine: this file test is about memory and errors, not time.
        "--file-timeout",
        "60",
        "--file-memory-mb",
        "1024",
    )
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    return mesh, worker, server


async def test_broken_and_hostile_files_fail_only_themselves(
    file_mesh: tuple[Mesh, Component, Component], record_property: Callable[[str, Any], None]
) -> None:
    _, worker, server = file_mesh
    hostile = [
        ("broken.pdf", "application/pdf", b"%PDF-1.7\n" + b"\x13garbage" * 1000, "damaged"),
        ("bomb.docx", samples.DOCX, _bomb_docx(), "decompression bomb"),
        ("huge.pdf", "application/pdf", _pages(20_000), None),
    ]
    async with AsyncClient(server.address, timeout=120) as client:
        sid = (await client.create_session()).session_id
        await client.send(
            sid, "warm up", files=[message_pb2.File(content=b"hi", mime_type="text/plain")]
        )
        baseline = _rss_kib(worker.pid)
        for filename, mime_type, content, error in hostile:
            with MemoryWatch(worker.pid) as watch:
                started = time.monotonic()
                result = await client.send(
                    sid,
                    "What does it say?",
                    files=[
                        message_pb2.File(content=content, mime_type=mime_type, filename=filename)
                    ],
                )
                elapsed = time.monotonic() - started
            (read,) = [e for e in result.events if e.type == event_pb2.CUSTOM]
            value = dict(read.value.struct_value)
            if error is None:  # 20,000 pages: the first 2,000 are read
                assert value["truncated"] is True
                assert "error" not in value
            else:
                message = value["error"]
                assert isinstance(message, str), value
                assert error in message, value
                assert f"I could not read {filename}" in result.text
            record_property(
                f"{filename} peak RSS MiB (worker / with readers) and seconds",
                f"{watch.peak_worker_kib // 1024} / {watch.peak_total_kib // 1024}, {elapsed:.2f}",
            )
            # The worker holds the request's bytes, never what a reader inflates.
            assert watch.peak_worker_kib - baseline < 256 * 1024, (
                filename,
                baseline,
                watch.peak_worker_kib,
            )
            assert watch.peak_total_kib - baseline < 1536 * 1024, (filename, watch.peak_total_kib)
        # The same worker serves the next turn.
        after = await client.send(sid, "What is 6*7?")
        assert "42" in after.text
        assert worker.proc.poll() is None
        history = await client.history(sid)
        assert [f.filename for m in history for f in m.files][-3:] == [h[0] for h in hostile]


async def test_a_reader_that_runs_too_long_is_stopped(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    assert mesh.router is not None
    worker = mesh.spawn(
        "worker",
        "worker",
        "--router",
        mesh.router.address,
        "--agent",
        "demo",
        "--file-timeout",
        "0.1",
    )
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    async with AsyncClient(server.address, timeout=60) as client:
        sid = (await client.create_session()).session_id
        slow = message_pb2.File(
            content=_pages(20_000), mime_type="application/pdf", filename="slow.pdf"
        )
        result = await client.send(sid, "Anything?", files=[slow])
        assert "took longer than 0.1 seconds" in result.text
        assert "42" in (await client.send(sid, "What is 6*7?")).text


async def test_invalid_base64_is_a_400_naming_the_file(rest: httpx.AsyncClient) -> None:
    sid = (await rest.post("/v1/sessions", json={})).json()["session"]["sessionId"]
    good = {"content": base64.b64encode(b"fine").decode(), "mime_type": "text/plain"}
    bad = {"content": "not base64 at all!", "mime_type": "text/plain", "filename": "b.txt"}
    response = await rest.post(
        f"/v1/sessions/{sid}/turns", json={"message": "hi", "files": [good, bad]}
    )
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["violations"] == [{"field": "files[1].content", "description": "must be base64"}]
    assert "not base64 at all" not in response.text  # the value is never echoed
    assert (await rest.get(f"/v1/sessions/{sid}/history")).json().get("messages", []) == []


async def test_a_mismatched_magic_number_is_a_400_naming_the_file(rest: httpx.AsyncClient) -> None:
    sid = (await rest.post("/v1/sessions", json={})).json()["session"]["sessionId"]
    png = samples.minimal("image/png")
    fake = {
        "content": base64.b64encode(png).decode(),
        "mime_type": "application/pdf",
        "filename": "invoice.pdf",
    }
    response = await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "hi", "files": [fake]})
    assert response.status_code == 400
    problem = response.json()
    (violation,) = problem["violations"]
    assert violation["field"] == "files[0].content"
    assert "invoice.pdf" in violation["description"]
    assert "image/png" in violation["description"]


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


async def test_cancelling_a_turn_kills_its_file_reader_and_ocr(
    file_mesh: tuple[Mesh, Component, Component],
) -> None:
    _, worker, server = file_mesh
    # A page of small print: Tesseract needs seconds for it.
    lines = [f"Line {n}: the quick brown fox jumps over the lazy dog" for n in range(60)]
    page = samples.image_lines(lines)
    async with AsyncClient(server.address, timeout=60) as client:
        sid = (await client.create_session()).session_id
        file = message_pb2.File(content=page, mime_type="image/png", filename="page.png")
        async with client.stream_turn(sid, "Read it", files=[file]) as events:
            started = await anext(aiter(events))
            assert started.type == event_pb2.RUN_STARTED

            def readers() -> list[int]:
                # The fork server's children are the readers, each a group leader.
                return [p for p in _descendants(worker.pid) if p in _group_members(p)]

            await until(
                lambda: any(len(_group_members(r)) >= 2 for r in readers()),
                timeout=30,
                what="the reader and its tesseract",
            )
            (reader,) = readers()
            await client.cancel_turn(sid, started.run_id)
        # Left alone, this OCR takes about 10 s; cancelled, it is gone at once.
        await until(lambda: not _group_members(reader), timeout=2, what="the reader group gone")
        assert "42" in (await client.send(sid, "What is 6*7?")).text
