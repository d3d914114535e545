"""Request validation: every rule and boundary, with the exact fields named."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import struct_pb2

from tests.support.samples import DOCX, XLSX, minimal
from turnmesh.files import ALLOWED_MIME_TYPES, MAX_FILE_BYTES, MAX_TOTAL_FILE_BYTES
from turnmesh.runtime.errors import InvalidArgument
from turnmesh.server.sessions import validation
from turnmesh.server.sessions.validation import (
    MAX_METADATA_BYTES,
    validate_create_session,
    validate_session_id,
    validate_subscribe,
    validate_turn,
    validate_turn_ref,
)
from turnmesh.v1 import message_pb2
from turnmesh.v1 import session_service_pb2 as spb

MB = 1024 * 1024


def fields_of(check: Callable[[], None]) -> list[str]:
    """The fields named by the InvalidArgument ``check`` raises ([] if it passes)."""
    try:
        check()
    except InvalidArgument as exc:
        return [v.field for v in exc.violations]
    return []


def struct_of_size(size: int) -> struct_pb2.Struct:
    """A Struct whose serialized size is exactly ``size`` bytes."""
    struct = struct_pb2.Struct()
    length = size
    for _ in range(10):
        struct["k"] = "x" * length
        got = struct.ByteSize()
        if got == size:
            return struct
        length += size - got
    raise AssertionError(f"cannot build a Struct of {size} bytes")


def pdf(content: bytes = b"%PDF-1.7\n", filename: str = "a.pdf") -> message_pb2.File:
    return message_pb2.File(content=content, mime_type="application/pdf", filename=filename)


def turn(**overrides: Any) -> spb.TurnRequest:
    fields: dict[str, Any] = {"session_id": "s1", "message": "hello"}
    fields.update(overrides)
    return spb.TurnRequest(**fields)


def turn_fields(**overrides: Any) -> list[str]:
    return fields_of(lambda: validate_turn(turn(**overrides)))


# --- the session id (shared by every request) ----------------------------------


@pytest.mark.parametrize(
    ("session_id", "expected"),
    [
        ("s", []),
        ("a" * 128, []),
        ("a" * 129, ["session_id"]),
        ("AZaz09._:-", []),
        ("", ["session_id"]),
        ("has space", ["session_id"]),
        ("slash/no", ["session_id"]),
        ("trailing-newline\n", ["session_id"]),
        ("ünicode", ["session_id"]),
    ],
)
def test_session_id(session_id: str, expected: list[str]) -> None:
    assert fields_of(lambda: validate_session_id(session_id)) == expected
    assert turn_fields(session_id=session_id) == expected


def test_missing_session_id_is_required_not_malformed() -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_session_id("")
    assert info.value.violations[0].description == "required"


# --- Turn: message -----------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("x", []),
        ("x" * 10_000, []),
        ("x" * 10_001, ["message"]),
        ("é" * 10_000, []),  # characters, not bytes
        ("é" * 10_001, ["message"]),
        (" padded ", []),
        ("", ["message"]),
        ("   ", ["message"]),
        ("\n\t ", ["message"]),
    ],
)
def test_turn_message(message: str, expected: list[str]) -> None:
    assert turn_fields(message=message) == expected


@pytest.mark.parametrize(
    ("message", "description"),
    [("", "required"), ("  ", "must not be blank"), ("x" * 10_001, "at most 10000 characters")],
)
def test_turn_message_descriptions(message: str, description: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_turn(turn(message=message))
    assert description in info.value.violations[0].description


# --- Turn: files ---------------------------------------------------------------


@pytest.mark.parametrize(("count", "expected"), [(0, []), (10, []), (11, ["files"])])
def test_turn_file_count(count: int, expected: list[str]) -> None:
    assert turn_fields(files=[pdf() for _ in range(count)]) == expected


@pytest.mark.parametrize("mime_type", sorted(ALLOWED_MIME_TYPES))
def test_turn_every_allowed_mime_type(mime_type: str) -> None:
    assert (
        turn_fields(files=[message_pb2.File(content=minimal(mime_type), mime_type=mime_type)]) == []
    )


@pytest.mark.parametrize(
    ("content", "declared", "says"),
    [
        pytest.param("image/png", "application/pdf", "the content is image/png", id="png-as-pdf"),
        pytest.param(
            "application/pdf", "image/png", "the content is application/pdf", id="pdf-as-png"
        ),
        pytest.param("image/jpeg", "image/gif", "the content is image/jpeg", id="jpeg-as-gif"),
        pytest.param(DOCX, XLSX, f"the content is {DOCX}", id="docx-as-xlsx"),
        pytest.param("text/plain", "image/webp", "not a recognised binary type", id="text-as-webp"),
        pytest.param("image/png", "text/plain", "the content is image/png", id="png-as-text"),
    ],
)
def test_turn_file_bytes_must_match_the_declared_type(
    content: str, declared: str, says: str
) -> None:
    bad = message_pb2.File(content=minimal(content), mime_type=declared, filename="x.bin")
    with pytest.raises(InvalidArgument) as info:
        validate_turn(turn(files=[pdf(), bad]))
    (violation,) = info.value.violations
    assert violation.field == "files[1].content"
    assert says in violation.description
    assert "(x.bin)" in violation.description


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe not utf-8", b"zero\x00byte", "é".encode() * 5000 + b"\xc3"],
    ids=["not-utf8", "nul-byte", "cut-after-the-sample"],
)
def test_turn_text_files_must_be_utf8_text(content: bytes) -> None:
    bad = message_pb2.File(content=content, mime_type="text/plain")
    expected = ["files[0].content"] if len(content) < 9000 else []
    # Only the first 8 KiB are sniffed: a file cut inside a character there passes.
    assert turn_fields(files=[bad]) == expected


@pytest.mark.parametrize(
    ("mime_type", "description"),
    [("", "required"), ("image/svg+xml", "not allowed"), ("APPLICATION/PDF", "not allowed")],
)
def test_turn_file_mime_type(mime_type: str, description: str) -> None:
    request = turn(files=[pdf(), message_pb2.File(content=b"x", mime_type=mime_type)])
    with pytest.raises(InvalidArgument) as info:
        validate_turn(request)
    assert [v.field for v in info.value.violations] == ["files[1].mime_type"]
    assert description in info.value.violations[0].description


def test_turn_empty_file_content() -> None:
    assert turn_fields(files=[pdf(), pdf(), pdf(content=b"")]) == ["files[2].content"]


@pytest.mark.parametrize(("length", "expected"), [(0, []), (255, []), (256, ["files[0].filename"])])
def test_turn_filename_length(length: int, expected: list[str]) -> None:
    assert turn_fields(files=[pdf(filename="f" * length)]) == expected


def test_turn_violation_descriptions_name_the_file() -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_turn(turn(files=[message_pb2.File(content=b"", filename="r.pdf")]))
    assert [v.field for v in info.value.violations] == ["files[0].mime_type", "files[0].content"]
    assert all("(r.pdf)" in v.description for v in info.value.violations)


def test_turn_one_file_can_break_every_file_rule() -> None:
    bad = message_pb2.File(content=b"", mime_type="x/y", filename="f" * 256)
    assert turn_fields(files=[bad]) == [
        "files[0].mime_type",
        "files[0].content",
        "files[0].filename",
    ]


@pytest.fixture(scope="module")
def max_file() -> message_pb2.File:
    return pdf(content=b"%PDF-" + bytes(MAX_FILE_BYTES - 5))


def test_turn_file_of_exactly_50_mb_is_allowed(max_file: message_pb2.File) -> None:
    assert MAX_FILE_BYTES == 50 * MB
    assert turn_fields(files=[max_file]) == []


def test_turn_file_of_50_mb_plus_one_byte_is_refused() -> None:
    assert turn_fields(files=[pdf(), pdf(content=b"%PDF-" + bytes(MAX_FILE_BYTES - 4))]) == [
        "files[1].content"
    ]


def test_turn_files_of_exactly_100_mb_in_all_are_allowed(max_file: message_pb2.File) -> None:
    assert MAX_TOTAL_FILE_BYTES == 100 * MB
    assert turn_fields(files=[max_file, max_file]) == []


def test_turn_files_of_100_mb_plus_one_byte_in_all_are_refused(
    max_file: message_pb2.File,
) -> None:
    one_byte = message_pb2.File(content=b"x", mime_type="text/plain")
    assert turn_fields(files=[max_file, max_file, one_byte]) == ["files"]


# --- Turn: policies, idempotency key, metadata -------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [*((p, []) for p in spb.TurnPolicy.values()), (5, ["policy"]), (-1, ["policy"])],
)
def test_turn_policy(policy: int, expected: list[str]) -> None:
    assert turn_fields(policy=policy) == expected


@pytest.mark.parametrize(
    ("on_disconnect", "expected"),
    [*((p, []) for p in spb.DisconnectPolicy.values()), (3, ["on_disconnect"])],
)
def test_turn_on_disconnect(on_disconnect: int, expected: list[str]) -> None:
    assert turn_fields(on_disconnect=on_disconnect) == expected


@pytest.mark.parametrize(("length", "expected"), [(0, []), (256, []), (257, ["idempotency_key"])])
def test_turn_idempotency_key_length(length: int, expected: list[str]) -> None:
    assert turn_fields(idempotency_key="k" * length) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [("job-1 é✓", []), ("a\x00b", ["idempotency_key"]), ("a\nb", ["idempotency_key"]),
     ("a\x7f", ["idempotency_key"])],
)  # fmt: skip
def test_turn_idempotency_key_has_no_control_characters(key: str, expected: list[str]) -> None:
    """A NUL no PostgreSQL text column holds: refused for every store alike."""
    assert turn_fields(idempotency_key=key) == expected


@pytest.mark.parametrize(
    ("size", "expected"), [(MAX_METADATA_BYTES, []), (MAX_METADATA_BYTES + 1, ["metadata"])]
)
def test_turn_metadata_size(size: int, expected: list[str]) -> None:
    assert MAX_METADATA_BYTES == 64 * 1024
    assert turn_fields(metadata=struct_of_size(size)) == expected


def test_turn_reports_every_violation_at_once_in_order() -> None:
    request = spb.TurnRequest(
        session_id="",
        message="",
        files=[pdf() for _ in range(11)],
        policy=9,  # type: ignore[arg-type]  # out of range on purpose
        on_disconnect=9,  # type: ignore[arg-type]  # out of range on purpose
        idempotency_key="k" * 257,
        metadata=struct_of_size(MAX_METADATA_BYTES + 1),
    )
    assert fields_of(lambda: validate_turn(request)) == [
        "session_id",
        "message",
        "files",
        "policy",
        "on_disconnect",
        "idempotency_key",
        "metadata",
    ]


# --- CreateSession ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, []),  # every field is optional
        ({"session_id": "a" * 128}, []),
        ({"session_id": "a" * 129}, ["session_id"]),
        ({"session_id": "bad id"}, ["session_id"]),
        ({"agent_name": "a" * 128}, []),
        ({"agent_name": "a" * 129}, ["agent_name"]),
        ({"metadata": struct_of_size(MAX_METADATA_BYTES)}, []),
        ({"metadata": struct_of_size(MAX_METADATA_BYTES + 1)}, ["metadata"]),
        (
            {
                "session_id": "bad id",
                "agent_name": "a" * 129,
                "metadata": struct_of_size(MAX_METADATA_BYTES + 1),
            },
            ["session_id", "agent_name", "metadata"],
        ),
    ],
)
def test_create_session(overrides: dict[str, Any], expected: list[str]) -> None:
    request = spb.CreateSessionRequest(**overrides)
    assert fields_of(lambda: validate_create_session(request)) == expected


# --- SubscribeTurn and turn references --------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "turn_id", "expected"),
    [
        ("s1", "t1", []),
        ("s1", "t" * 128, []),
        ("s1", "t" * 129, ["turn_id"]),
        ("s1", "", ["turn_id"]),
        ("", "t1", ["session_id"]),
        ("a" * 129, "t1", ["session_id"]),
        ("", "", ["session_id", "turn_id"]),
    ],
)
def test_turn_ref(session_id: str, turn_id: str, expected: list[str]) -> None:
    assert fields_of(lambda: validate_turn_ref(session_id, turn_id)) == expected
    subscribe = spb.SubscribeTurnRequest(session_id=session_id, turn_id=turn_id)
    assert fields_of(lambda: validate_subscribe(subscribe)) == expected


@pytest.mark.parametrize(
    ("after_seq", "expected"), [(0, []), (1, []), (2**31 - 1, []), (-1, ["after_seq"])]
)
def test_subscribe_after_seq(after_seq: int, expected: list[str]) -> None:
    request = spb.SubscribeTurnRequest(session_id="s1", turn_id="t1", after_seq=after_seq)
    assert fields_of(lambda: validate_subscribe(request)) == expected


def test_subscribe_reports_every_violation() -> None:
    request = spb.SubscribeTurnRequest(session_id="", turn_id="", after_seq=-5)
    assert fields_of(lambda: validate_subscribe(request)) == [
        "session_id",
        "turn_id",
        "after_seq",
    ]


def test_a_seeded_history_holds_no_more_than_turns_could_have_put_there() -> None:
    """A file text of 60 MB in a seeded reference (which every later turn
    would carry to its worker) is refused, as is anything a turn could not
    have written."""
    huge_ref = message_pb2.FileRef(mime_type="text/plain", text="x" * 200_001)
    calls = [
        message_pb2.ToolCall(id=f"c{i}", function=message_pb2.FunctionCall(arguments="{}"))
        for i in range(129)
    ]
    request = spb.CreateSessionRequest(
        messages=[
            message_pb2.Message(role="user", content="hi", files=[huge_ref]),
            message_pb2.Message(role="user", content="hi", files=[message_pb2.FileRef()] * 11),
            message_pb2.Message(role="assistant", content="", tool_calls=calls),
        ]
    )
    fields = fields_of(lambda: validate_create_session(request))
    assert set(fields) == {
        "messages[0].files[0].text",
        "messages[1].files",
        "messages[2].tool_calls",
    }
    fine = message_pb2.FileRef(mime_type="text/plain", text="x" * 200_000)
    validate_create_session(
        spb.CreateSessionRequest(messages=[message_pb2.Message(role="user", files=[fine])])
    )


async def test_a_seeded_history_is_held_to_its_total_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seed's total is summed a message at a time, in a thread (up to
    64 MiB is read): past it, the create is refused as inline validation would."""
    monkeypatch.setattr(validation, "MAX_SEED_BYTES", 2000)
    seed = [message_pb2.Message(role="user", content="x" * 900) for _ in range(3)]
    request = spb.CreateSessionRequest(messages=seed)
    with pytest.raises(InvalidArgument) as info:
        await validation.validate_create_session_async(request)
    assert [v.field for v in info.value.violations] == ["messages"]
    await validation.validate_create_session_async(spb.CreateSessionRequest(messages=seed[:2]))
