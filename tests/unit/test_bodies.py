"""Large request bodies decode off the event loop, with the same answers as
inline: JSON in a child process, base64 a chunk at a time, protobuf
serialized a piece at a time."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mesh import wait_for
from turnmesh.runtime import bodies, wire
from turnmesh.v1 import message_pb2, worker_service_pb2


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"[1, 2]", "must be a JSON object"),
        (b"{", "not valid JSON"),
        (b'{"a": "\xff"}', "not valid JSON"),
        (b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}", "nested deeper than 64 levels"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper than 64 levels"),
        (b'{"a": "\\ud800"}', "lone surrogate"),
        (b'{"a": [' + b"1," * bodies.MAX_JSON_VALUES + b"1]}", "more than 200000 values"),
        (b'{"model": ' + b"1" * 5000 + b"}", "not valid JSON"),  # past int's 4,300 digits
    ],
)
def test_bodies_that_are_not_requests_are_refused_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(bodies.BodyError, match=why) as refused:
        bodies.decode_json(data)
    # In the API's words: never a Python exception's text.
    said = str(refused.value)
    assert not any(text in said for text in ("sys.", "codec", "position", "Traceback", "int("))


def test_a_body_of_too_many_values_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parsing would build them all first (empty objects: ~28 times the
    body's size), so too many are counted in the bytes."""

    def parse(_: bytes) -> object:
        raise AssertionError("parsed")

    monkeypatch.setattr(json, "loads", parse)
    body = b'{"a": [' + b"{}," * (2 * bodies.MAX_JSON_VALUES) + b"{}]}"
    with pytest.raises(bodies.BodyError, match="more than 200000 values"):
        bodies.decode_json(body)


async def test_a_large_body_parses_in_a_child_process_while_the_loop_runs() -> None:
    """Parsing a large body leaves the loop free (another task runs all the
    while), and answers as parsing inline does: the object, or the reason."""
    payload = {"model": "m", "data": base64.b64encode(os.urandom(3 * 2**20)).decode()}
    data = json.dumps(payload).encode()
    assert len(data) >= bodies.OFFLOAD_BYTES

    ticks = 0
    parsing = asyncio.create_task(bodies.parse_json(data))
    while not parsing.done():
        ticks += 1
        await asyncio.sleep(0)
    assert await parsing == payload
    # Inline, the parse would finish before any other task ran.
    assert ticks > 10
    bad = b'{"a": [' + b"[" * 100 + b" " * bodies.OFFLOAD_BYTES + b"]" * 100 + b"]}"
    with pytest.raises(bodies.BodyError, match="nested deeper than 64 levels"):
        await bodies.parse_json(bad)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 1000, 3 * bodies.BASE64_CHUNK // 4 * 3 + 1])
def test_base64_in_chunks_decodes_as_base64_does(size: int) -> None:
    raw = os.urandom(size)
    assert bodies.b64decode(base64.b64encode(raw).decode()) == raw
    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    assert bodies.b64decode(url, url.index(",") + 1) == raw


@pytest.mark.parametrize(
    "value",
    [
        "QQ",  # unpadded
        "QQ==QUJD",  # padding inside
        "QUJD" * (bodies.BASE64_CHUNK // 4 - 1) + "QQ==" + "QUJD",  # padding at a chunk's end
        "QUJD" * bodies.BASE64_CHUNK + "Q!==",  # outside the alphabet, past the first chunk
        "QUJ\n" + "QUJD",  # whitespace
        "QUJDé",  # beyond ASCII
    ],
)
def test_base64_in_chunks_refuses_what_strict_base64_refuses(value: str) -> None:
    with pytest.raises(ValueError, match=r"padding|base64|ASCII"):
        base64.b64decode(value, validate=True)
    with pytest.raises(ValueError, match=r"padding|base64|ASCII"):
        bodies.b64decode(value)


def test_a_request_serialized_in_pieces_parses_as_the_whole() -> None:
    head = worker_service_pb2.RunRequest(session_id="s", turn_id="t", messages=["hi"])
    head.metadata.update({"k": 1})
    history = [message_pb2.Message(role="user", content=f"m{i}") for i in range(3)]
    # Lengths of one, two and three varint bytes, and an empty file.
    files = [message_pb2.File(content=os.urandom(n)) for n in (0, 100, 1000, 200_000)]
    whole = worker_service_pb2.RunRequest()
    whole.CopyFrom(head)
    whole.history.extend(history)
    whole.files.extend(files)
    pieces = wire.serialize(head, {"history": history, "files": files})
    assert worker_service_pb2.RunRequest.FromString(pieces) == whole


def test_the_parsing_processes_end_with_a_server_that_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves no parsing process behind (the pool's queue never tells
    its children: each watches for its parent instead)."""
    script = (
        "import asyncio, json, os, sys\n"
        "from turnmesh.runtime import bodies\n"
        "body = json.dumps({'a': 'x' * bodies.OFFLOAD_BYTES}).encode()\n"
        "asyncio.run(bodies.parse_json(body))\n"
        "print(os.getpid(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as server:
        try:
            assert server.stdout is not None
            pid = int(server.stdout.readline())
            # Each thread lists the children it started: the pool is started
            # from a worker thread (asyncio.to_thread), not the main one.
            children = [
                child for task in Path(f"/proc/{pid}/task").iterdir() for child in _kids(task)
            ]
            assert children  # the pool's child (and the semaphores' tracker)
        finally:
            server.kill()
            server.wait(timeout=30)
    wait_for(
        lambda: not any(Path(f"/proc/{c}").exists() and _running(c) for c in children),
        timeout=30,
        what="the parsing processes to end",
    )


def _kids(task: Path) -> list[int]:
    try:
        return [int(child) for child in (task / "children").read_text().split()]
    except OSError:  # the thread ended meanwhile
        return []


def _running(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone, maybe between the check and the read (ESRCH)
        return False
