"""Files through the compatibility surfaces, with their real clients: the
OpenAI SDK (chat ``file`` and ``image_url`` parts, Responses ``input_file`` and
``input_image``), the AG-UI client (``document`` and ``image`` parts) and the
simple chat API. Only inline bytes are accepted."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import SharedMesh
from tests.support import samples

AGUI_DIR = Path(__file__).resolve().parents[2] / "clients" / "agui"


def _data_url(mime_type: str, content: bytes) -> str:
    return f"data:{mime_type};base64,{base64.b64encode(content).decode()}"


@pytest.fixture
def sdk(shared_mesh: SharedMesh) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=f"http://{shared_mesh.edge}/v1", api_key="not-needed", max_retries=0
    )
    try:
        yield client
    finally:
        client.close()


def test_chat_completion_reads_a_pdf_and_an_image(sdk: openai.OpenAI) -> None:
    pdf = samples.pdf("The vault code is 7391.")
    completion = sdk.chat.completions.create(
        model="demo",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the vault code?"},
                    {
                        "type": "file",
                        "file": {
                            "filename": "report.pdf",
                            "file_data": _data_url("application/pdf", pdf),
                        },
                    },
                    {
                        "type": "image_url",
                        "image_url": {"url": _data_url("image/png", samples.image("Gate B12"))},
                    },
                ],
            }
        ],
    )
    assert "7391" in (completion.choices[0].message.content or "")
    assert "report.pdf" in (completion.choices[0].message.content or "")


def test_streamed_chat_completion_reads_a_spreadsheet(sdk: openai.OpenAI) -> None:
    xlsx = samples.xlsx(("item", "count"), ("compasses", 37))
    stream = sdk.chat.completions.create(
        model="demo",
        stream=True,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "How many compasses?"},
                    # Bare base64: the type comes from the filename.
                    {
                        "type": "file",
                        "file": {
                            "filename": "stock.xlsx",
                            "file_data": base64.b64encode(xlsx).decode(),
                        },
                    },
                ],
            }
        ],
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert "37" in text


def test_responses_reads_a_word_document_and_an_image(sdk: openai.OpenAI) -> None:
    docx = samples.docx("The board meets in room Cedar.")
    response = sdk.responses.create(
        model="demo",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Which room does the board meet in?"},
                    {
                        "type": "input_file",
                        "filename": "minutes.docx",
                        "file_data": _data_url(samples.DOCX, docx),
                    },
                    {
                        "type": "input_image",
                        "image_url": _data_url("image/jpeg", samples.image("Shelf 908", "JPEG")),
                        "detail": "auto",
                    },
                ],
            }
        ],
    )
    assert "Cedar" in response.output_text
    # The next turn, by previous_response_id, asks about the image's text.
    follow = sdk.responses.create(
        model="demo",
        previous_response_id=response.id,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Which shelf?"},
                    {
                        "type": "input_image",
                        "image_url": _data_url("image/png", samples.image("Shelf 908")),
                        "detail": "auto",
                    },
                ],
            }
        ],
    )
    assert "908" in follow.output_text


@pytest.mark.parametrize(
    ("filename", "mime_type", "make", "question", "answer"),
    [
        (
            "deck.pptx",
            samples.PPTX,
            lambda: samples.pptx("Plan", "Launch on Saturday."),
            "When is the launch?",
            "Saturday",
        ),
        (
            "ferry.png",
            "image/png",
            lambda: samples.image("The ferry leaves at 6:45"),
            "When does the ferry leave?",
            "6:45",
        ),
    ],
)
def test_agui_client_sends_a_document_or_an_image(
    shared_mesh: SharedMesh,
    tmp_path: Path,
    filename: str,
    mime_type: str,
    make: object,
    question: str,
    answer: str,
) -> None:
    node = shutil.which("node")
    assert node, "node is installed by `make install` (system-deps)"
    path = tmp_path / filename
    path.write_bytes(make())  # type: ignore[operator]
    result = subprocess.run(
        [
            node,
            "run-file.mjs",
            f"http://{shared_mesh.edge}/v1/agui",
            f"agui-file-{filename}",
            str(path),
            mime_type,
            question,
        ],
        cwd=AGUI_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert "error" not in output, output
    reads = [e for e in output["events"] if e["type"] == "CUSTOM" and e["name"] == "file_read"]
    assert reads[0]["value"]["filename"] == filename
    text = "".join(
        e.get("delta", "") for e in output["events"] if e["type"] == "TEXT_MESSAGE_CONTENT"
    )
    assert answer in text


async def test_simple_chat_reads_a_markdown_file(rest: httpx.AsyncClient) -> None:
    body = {
        "message": "What is the staging password?",
        "files": [
            {
                "content": base64.b64encode(
                    b"# Ops\n\nThe staging password is tangerine-42.\n"
                ).decode(),
                "mime_type": "text/markdown",
                "filename": "ops.md",
            }
        ],
    }
    response = await rest.post("/v1/chat", json=body)
    assert response.status_code == 200, response.text
    assert "tangerine-42" in response.json()["content"]


@pytest.mark.parametrize(
    ("part", "field", "says"),
    [
        (
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            "messages[0].content[1].image_url.url",
            "does not fetch",
        ),
        (
            {"type": "file", "file": {"file_id": "file-abc"}},
            "messages[0].content[1].file.file_id",
            "not supported",
        ),
        (
            {
                "type": "file",
                "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,%%%"},
            },
            "messages[0].content[1].file.file_data",
            "base64",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
            "messages[0].content[1].type",
            "not supported",
        ),
    ],
)
def test_chat_refuses_what_it_cannot_read_inline(
    sdk: openai.OpenAI, part: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="demo",
            # A part the SDK's types do not allow, on purpose.
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}],  # type: ignore[list-item, misc]
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == field
    assert says in error["message"]


def test_a_file_whose_bytes_lie_is_refused_on_every_surface(sdk: openai.OpenAI) -> None:
    png = samples.minimal("image/png")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="demo",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {
                            "type": "file",
                            "file": {
                                "filename": "fake.pdf",
                                "file_data": _data_url("application/pdf", png),
                            },
                        },
                    ],
                }
            ],
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == "files[0].content"
    assert "fake.pdf" in error["message"] and "image/png" in error["message"]
