"""Simple chat's multipart forms read into ChatRequests (the integration
tests send real ones through Envoy)."""

from __future__ import annotations

import pytest

from turnmesh.runtime.errors import InvalidArgument
from turnmesh.server.compat import chat_upload
from turnmesh.server.compat.openai_responses.ids import parse_approval_item_id

BOUNDARY = "b0undary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def _form(*parts: tuple[str, bytes]) -> bytes:
    out = b""
    for headers, body in parts:
        out += f"--{BOUNDARY}\r\n{headers}\r\n\r\n".encode() + body + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


def _field(name: str, value: bytes) -> tuple[str, bytes]:
    return f'Content-Disposition: form-data; name="{name}"', value


def _file(filename: str, mime: str, content: bytes) -> tuple[str, bytes]:
    disposition = f'Content-Disposition: form-data; name="files"; filename="{filename}"'
    return f"{disposition}\r\nContent-Type: {mime}", content


def test_a_form_is_the_chat_request_its_json_would_be() -> None:
    body = _form(
        _field("message", "héllo".encode()),
        _field("session_id", b"s1"),
        _field("unknown", b"ignored, as HoloDeck's form parser ignores it"),
        _file("a.pdf", "application/pdf", b"%PDF-1.4 ..."),
        _file("b.txt", "text/plain; charset=utf-8", b"\r\n--not a boundary\r\n"),
    )
    request = chat_upload._read(CONTENT_TYPE, body, "")
    assert (request.message, request.session_id, request.agent_name) == ("héllo", "s1", "")
    assert [(f.filename, f.mime_type, f.content) for f in request.files] == [
        ("a.pdf", "application/pdf", b"%PDF-1.4 ..."),
        ("b.txt", "text/plain", b"\r\n--not a boundary\r\n"),
    ]


def test_the_path_names_the_agent_and_a_form_may_agree() -> None:
    body = _form(_field("message", b"hi"), _field("agent_name", b"echo"))
    assert chat_upload._read(CONTENT_TYPE, body, "echo").agent_name == "echo"
    with pytest.raises(InvalidArgument) as refused:
        chat_upload._read(CONTENT_TYPE, body, "demo")
    assert refused.value.violations[0].field == "agent_name"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_form(("Content-Disposition: attachment", b"x")), "body"),
        (_form(("Content-Disposition: form-data", b"x")), "body"),
        (_form(*[_file(f"{n}.txt", "text/plain", b"x") for n in range(11)]), "files"),
        (_form(*[_field(f"f{n}", b"x") for n in range(chat_upload.MAX_PARTS + 1)]), "body"),
        (_form(_field("session_id", b"\xff")), "session_id"),
        (_form(_field("message", b"a"), _field("message", b"b")), "message"),
        (_form(_field("message", b"a"))[:-4], "body"),
    ],
)
def test_what_is_not_a_form_is_named(body: bytes, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        chat_upload._read(CONTENT_TYPE, body, "")
    assert refused.value.violations[0].field == field


@pytest.mark.parametrize(
    "content_type",
    [
        "multipart/form-data",
        "application/json",
        "multipart/mixed; boundary=x",
        "multipart/form-data; boundary=" + "x" * 300,
        "multipart/form-data; boundary=€",
    ],
)
def test_a_body_that_is_not_multipart_form_data_is_named(content_type: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        chat_upload._read(content_type, _form(_field("message", b"hi")), "")
    assert refused.value.violations[0].field == "Content-Type"


@pytest.mark.parametrize(
    "value", ["mcpr_²_x.cw", "mcpr_\u0661_x.cw", "mcpr_12345_x.cw", "mcpr__x", "mcpr_1", "msg_1_x"]
)
def test_an_approval_item_id_that_is_not_ours_is_none(value: str) -> None:
    # Unicode digits pass str.isdigit but not int(): never a 500.
    assert parse_approval_item_id(value) is None
