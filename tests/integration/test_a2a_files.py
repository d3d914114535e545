"""Files and data through A2A with the real, pinned a2a-sdk client, over
gRPC and HTTP+JSON: a ``raw`` part goes through the mesh's file pipeline
(its extracted text reaches the agent), one the mesh does not take is
ContentTypeNotSupported or InvalidParams naming the part, a file by ``url``
is refused unfetched, and ``data`` parts reach the agent as metadata. A
refused message leaves nothing behind: its (client-chosen) context is never
made."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from a2a.types import a2a_pb2
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError

from tests.conftest import SharedMesh
from tests.support import samples
from tests.support.a2a_clients import Agents, S, answer, message, sent
from turnmesh.files import MAX_FILE_BYTES, MAX_FILES

pytestmark = pytest.mark.integration


def _with_file(
    text: str, content: bytes, media_type: str, filename: str, context_id: str = ""
) -> a2a_pb2.SendMessageRequest:
    request = message(text, context_id)
    request.message.parts.add(raw=content, media_type=media_type, filename=filename)
    return request


async def _absent(edge: str, context_id: str) -> None:
    """The context was never made: its session is not found."""
    async with httpx.AsyncClient(base_url=f"http://{edge}", timeout=30) as rest:
        found = await rest.get(f"/v1/sessions/{context_id}")
    assert found.status_code == 404, found.text


async def test_a_raw_pdf_and_a_text_file_are_read_by_the_agent(agents: Agents) -> None:
    client = await agents.client("demo", streaming=False)
    request = _with_file(
        "What is the vault code?",
        samples.pdf("The vault code is 7391."),
        "application/pdf",
        "report.pdf",
    )
    task = await sent(client, request)
    assert task.status.state == S.TASK_STATE_COMPLETED
    assert "7391" in answer(task) and "report.pdf" in answer(task)
    # The history names the file (not its bytes).
    (user,) = [m for m in task.history if m.role == a2a_pb2.ROLE_USER]
    assert [(p.filename, p.media_type) for p in user.parts if p.filename] == [
        ("report.pdf", "application/pdf")
    ]
    # No media type: the filename's extension says it.
    notes = message("Which gate?", task.context_id)
    notes.message.parts.add(raw=b"The gate is B12.\n", filename="notes.md")
    read = await sent(client, notes)
    assert "B12" in answer(read) and "notes.md" in answer(read)
    assert not any(p.raw for p in user.parts)


class _Listener:
    """A TCP listener on loopback that counts the connections it is offered:
    a file by URL pointing here must never be fetched."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        async def seen(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(seen, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}/secret.pdf"


@pytest.fixture
async def listener() -> AsyncIterator[_Listener]:
    made = _Listener()
    yield made
    if made.server is not None:
        made.server.close()
        await made.server.wait_closed()


async def test_files_the_mesh_does_not_take(
    agents: Agents, shared_mesh: SharedMesh, listener: _Listener
) -> None:
    client = await agents.client("demo", streaming=False)
    url = await listener.start()
    pdf = samples.pdf("x")
    cases: list[tuple[str, type[Exception], a2a_pb2.SendMessageRequest]] = []

    def case(field: str, error: type[Exception]) -> a2a_pb2.SendMessageRequest:
        request = message("read this", f"a2a-files-{uuid.uuid4()}")
        cases.append((field, error, request))
        return request

    case("parts[1].media_type", ContentTypeNotSupportedError).message.parts.add(
        raw=b"PK\x03\x04zip", media_type="application/zip", filename="a.zip"
    )
    case("parts[1].url", ContentTypeNotSupportedError).message.parts.add(
        url=url, media_type="application/pdf", filename="secret.pdf"
    )
    # Declared a PDF, but text: the magic numbers must match.
    case("parts[1].raw", InvalidParamsError).message.parts.add(
        raw=b"just text", media_type="application/pdf", filename="fake.pdf"
    )
    case("parts[1].raw", InvalidParamsError).message.parts.add(
        raw=b"", media_type="text/plain", filename="empty.txt"
    )
    # No media type, and an extension that names none.
    case("parts[1].media_type", InvalidParamsError).message.parts.add(raw=b"x", filename="mystery")
    many = case("message.parts", InvalidParamsError)
    for n in range(MAX_FILES + 1):
        many.message.parts.add(raw=pdf, media_type="application/pdf", filename=f"{n}.pdf")
    for field, error, request in cases:
        with pytest.raises(error) as refused:
            await sent(client, request)
        assert field in str(refused.value), (field, str(refused.value))
        await _absent(shared_mesh.edge, request.message.context_id)
    assert listener.connections == 0  # the URL was never fetched


async def test_an_oversized_file_is_refused(shared_mesh: SharedMesh) -> None:
    """One byte over the mesh's file limit, over gRPC (the bytes as they are)."""
    agents = Agents(shared_mesh.edge, "GRPC")
    try:
        client = await agents.client("echo", streaming=False)
        request = _with_file(
            "read this",
            b"a" * (MAX_FILE_BYTES + 1),
            "text/plain",
            "big.txt",
            f"a2a-big-{uuid.uuid4()}",
        )
        with pytest.raises(InvalidParamsError) as refused:
            await sent(client, request)
        assert "parts[1].raw" in str(refused.value) and "50 MB" in str(refused.value)
    finally:
        await agents.close()
    await _absent(shared_mesh.edge, request.message.context_id)


async def test_bad_base64_over_http_json(shared_mesh: SharedMesh) -> None:
    """The transcoder's own 400 for a value of the wrong type, in A2A's shape:
    InvalidParams with the field, never the value echoed back."""
    context_id = f"a2a-b64-{uuid.uuid4()}"
    garbage = "!!not-base64!!" * 1000
    body = {
        "message": {
            "messageId": "m",
            "role": "ROLE_USER",
            "contextId": context_id,
            "parts": [{"text": "hi"}, {"raw": garbage, "mediaType": "text/plain"}],
        }
    }
    async with httpx.AsyncClient(base_url=f"http://{shared_mesh.edge}", timeout=30) as rest:
        refused = await rest.post("/echo/message:send", json=body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    reasons = {(d.get("reason"), d.get("domain")) for d in error["details"] if "reason" in d}
    assert reasons == {("INVALID_PARAMS", "a2a-protocol.org")}
    (bad,) = [d for d in error["details"] if "fieldViolations" in d]
    assert bad["fieldViolations"] == [
        {"field": "message.parts[1].raw", "description": "must be base64"}
    ]
    assert "not-base64" not in refused.text
    await _absent(shared_mesh.edge, context_id)


async def test_data_parts_reach_the_agent_as_metadata(
    agents: Agents, shared_mesh: SharedMesh
) -> None:
    client = await agents.client("probe", streaming=False)
    request = message("take this order", deltas="1")
    request.message.parts.add().data.struct_value.update({"order": 42, "items": ["a", "b"]})
    request.message.parts.add().data.list_value.extend([1, "two"])
    task = await sent(client, request)
    assert task.status.state == S.TASK_STATE_COMPLETED
    turn_id = task.id.partition(".")[0]
    given = json.loads((shared_mesh.mesh.probe_dir / f"{turn_id}.metadata.json").read_text())
    assert given["a2a_data"] == [{"order": 42, "items": ["a", "b"]}, [1, "two"]]
    assert given["a2a_message_id"] == request.message.message_id
    assert given["deltas"] == "1"  # the message's own metadata beside them
    # The data is the agent's input, not the history's text.
    (user,) = [m for m in task.history if m.role == a2a_pb2.ROLE_USER]
    assert [p.text for p in user.parts] == ["take this order"]
