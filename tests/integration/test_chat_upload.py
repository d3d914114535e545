"""Simple chat's multipart/form-data forms (HoloDeck's uploads) through the
real Envoy, with httpx's own multipart encoder: real PDF and PNG files read
by the agent, the answer in the JSON form's shape, the streamed form, the
spec's `/agent/{name}/chat` paths, and every malformed form refused."""

from __future__ import annotations

import json

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.support import samples
from turnmesh.client import AsyncClient

pytestmark = pytest.mark.integration

PDF_LINE = "The lighthouse keeper counts forty ships."


async def test_a_form_with_a_pdf_and_a_png_is_answered_as_json_is(rest: httpx.AsyncClient) -> None:
    files = [
        ("files", ("ships.pdf", samples.pdf(PDF_LINE), "application/pdf")),
        ("files", ("sign.png", samples.image("OPEN DAILY"), "image/png")),
    ]
    form = {"message": "how many ships does the lighthouse keeper count?"}
    response = await rest.post("/v1/chat", data=form, files=files)
    assert response.status_code == 200, response.text
    body = response.json()
    assert "forty ships" in body["content"]
    # The JSON form's shape: every field, zeros and empties too.
    plain = (await rest.post("/v1/chat", json={"message": "hi"})).json()
    assert set(body) == set(plain)
    history = (await rest.get(f"/v1/sessions/{body['session_id']}/history")).json()["messages"]
    given = history[0]["files"]
    assert [(f["filename"], f["mime_type"]) for f in given] == [
        ("ships.pdf", "application/pdf"),
        ("sign.png", "image/png"),
    ]
    assert PDF_LINE in given[0]["text"] and "OPEN" in given[1]["text"].upper()
    # The same session continues, by form too.
    again = await rest.post(
        "/v1/chat",
        data={"message": "what did I ask first?", "session_id": body["session_id"]},
        files=[("files", ("more.txt", b"nothing new", "text/plain"))],
    )
    assert again.status_code == 200 and again.json()["session_id"] == body["session_id"]


async def test_the_streamed_form_sends_the_events_chat_stream_sends(
    rest: httpx.AsyncClient,
) -> None:
    files = [("files", ("note.txt", b"the code word is heliotrope", "text/plain"))]
    form = {"message": "what is the code word?", "agent_name": "demo"}
    async with aconnect_sse(rest, "POST", "/v1/chat:stream", data=form, files=files) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(e.data) async for e in source.aiter_sse()]
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    text = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "heliotrope" in text
    # Set fields only, as the JSON route's stream prints them.
    assert "role" not in events[0] and "delta" not in events[0]


@pytest.mark.parametrize("stream", [False, True])
async def test_the_spec_paths_name_the_agent(rest: httpx.AsyncClient, stream: bool) -> None:
    path = "/agent/echo/chat/stream" if stream else "/agent/echo/chat"
    form = {"message": "from the spec path"}
    files = [("files", ("n.txt", b"hello", "text/plain"))]
    if stream:
        async with aconnect_sse(rest, "POST", path, data=form, files=files) as source:
            events = [json.loads(e.data) async for e in source.aiter_sse()]
        session_id = events[0]["threadId"]
    else:
        response = await rest.post(path, data=form, files=files)
        assert response.status_code == 200, response.text
        session_id = response.json()["session_id"]
    session = (await rest.get(f"/v1/sessions/{session_id}")).json()
    assert session["session"]["agentName"] == "echo"


async def _session_count(client: AsyncClient) -> int:
    count, token = 0, ""
    while True:
        page = await client.list_sessions(page_size=100, page_token=token)
        count += len(page.sessions)
        if not (token := page.next_page_token):
            return count


@pytest.mark.parametrize(
    ("data", "files", "field", "words"),
    [
        # A type the mesh does not read.
        (
            {"message": "read this"},
            [("files", ("a.zip", b"PK\x03\x04", "application/zip"))],
            "files[0].mime_type",
            "a.zip",
        ),
        # Eleven files.
        (
            {"message": "read these"},
            [("files", (f"{n}.txt", b"x", "text/plain")) for n in range(11)],
            "files",
            "at most 10",
        ),
        # No message.
        ({"session_id": "x"}, [("files", ("n.txt", b"x", "text/plain"))], "message", ""),
        # A message that is not UTF-8.
        ({}, [("message", (None, b"\xff\xfe", "text/plain"))], "message", "UTF-8"),
    ],
)
async def test_a_wrong_form_is_400_naming_its_field(
    rest: httpx.AsyncClient,
    data: dict[str, str],
    files: list[tuple[str, tuple[str | None, bytes, str]]],
    field: str,
    words: str,
) -> None:
    response = await rest.post("/v1/chat", data=data, files=files)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    violation = response.json()["violations"][0]
    assert violation["field"] == field
    assert words in violation["description"]


@pytest.mark.parametrize(
    ("content_type", "body", "field"),
    [
        # Not a form at all, a form cut short, a missing boundary.
        ("multipart/form-data; boundary=XyZ", b"not a form", "body"),
        (
            "multipart/form-data; boundary=XyZ",
            b'--XyZ\r\nContent-Disposition: form-data; name="message"\r\n\r\nhi',
            "body",
        ),
        ("multipart/form-data", b"--XyZ--\r\n", "Content-Type"),
        # The same field twice.
        (
            "multipart/form-data; boundary=XyZ",
            b'--XyZ\r\nContent-Disposition: form-data; name="message"\r\n\r\none\r\n'
            b'--XyZ\r\nContent-Disposition: form-data; name="message"\r\n\r\ntwo\r\n--XyZ--\r\n',
            "message",
        ),
        # Far too many parts.
        (
            "multipart/form-data; boundary=XyZ",
            b"".join(
                b'--XyZ\r\nContent-Disposition: form-data; name="x%d"\r\n\r\nv\r\n' % n
                for n in range(200)
            )
            + b"--XyZ--\r\n",
            "body",
        ),
    ],
)
async def test_a_malformed_form_is_400_and_makes_nothing(
    rest: httpx.AsyncClient, client: AsyncClient, content_type: str, body: bytes, field: str
) -> None:
    before = await _session_count(client)
    response = await rest.post("/v1/chat", content=body, headers={"content-type": content_type})
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["violations"][0]["field"] == field
    assert "Traceback" not in response.text and "multipart" not in problem["title"].lower()
    assert await _session_count(client) == before


async def test_a_json_request_still_goes_to_chat(rest: httpx.AsyncClient) -> None:
    response = await rest.post("/v1/chat", json={"message": "plain json"})
    assert response.status_code == 200
    assert "plain json" in response.json()["content"]


async def test_a_form_from_an_allowed_origin_is_taken_and_from_another_is_415(
    rest: httpx.AsyncClient,
) -> None:
    files = [("files", ("n.txt", b"hello", "text/plain"))]
    form = {"message": "from a browser"}
    allowed = await rest.post(
        "/v1/chat", data=form, files=files, headers={"origin": "http://localhost:3000"}
    )
    assert allowed.status_code == 200, allowed.text
    assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
    # A form is what a page may send anywhere without asking: the guard stays.
    foreign = await rest.post(
        "/v1/chat", data=form, files=files, headers={"origin": "https://evil.example"}
    )
    assert foreign.status_code == 415
