"""runtime/sse.py: events printed as the transcoder prints them (its oracle
is tests/integration/test_sse_printing.py), and SSE messages bounded in size."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from turnmesh.runtime import sse
from turnmesh.v1 import event_pb2


def test_doubles_print_as_protobufs_cpp_writer_prints_them() -> None:
    cases = {
        1796295938888.0: "1796295938888",  # json.dumps says 1796295938888.0
        1.0: "1",
        -0.0: "-0",
        0.1: "0.1",
        1 / 3: "0.33333333333333331",  # 15 digits do not read back: 17
        1e15: "1e+15",
        1e21: "1e+21",
        1.5e-7: "1.5e-07",
        float("nan"): '"NaN"',
        float("-inf"): '"-Infinity"',
    }
    for value, printed in cases.items():
        assert sse.number(value) == printed, value


def test_strings_escape_what_cpp_escapes_and_keep_the_rest() -> None:
    assert sse.string('<a href="x">\u2028é😀\x7f') == (
        '"\\u003ca href=\\"x\\"\\u003e\\u2028é😀\\u007f"'
    )
    assert sse.string("\U000e0020") == '"\\udb40\\udc20"'  # a pair, as C++ writes it


def test_an_event_prints_set_fields_in_field_order_by_json_name() -> None:
    event = event_pb2.Event(
        type=event_pb2.RUN_FINISHED, seq=9, thread_id="s", timestamp=1.5e12, execution_time_ms=3
    )
    event.result.update({"b": 1, "a": [True, None, "x"]})
    event.usage.add(input_tokens=1, total_tokens=1)
    assert sse.event_json(event) == (
        '{"type":"RUN_FINISHED","seq":9,"threadId":"s","timestamp":1500000000000,'
        '"usage":[{"inputTokens":1,"totalTokens":1}],"executionTimeMs":3,'
        '"result":{"a":[true,null,"x"],"b":1}}'
    )
    unknown = event_pb2.Event(type=99)  # type: ignore[arg-type]
    assert sse.event_json(unknown) == '{"type":99}'


async def _batches(*batches: list[event_pb2.Event]) -> AsyncGenerator[list[event_pb2.Event], None]:
    for batch in batches:
        yield batch


async def test_each_batch_is_one_message_until_the_size_bound() -> None:
    small = [event_pb2.Event(seq=n, delta="x") for n in range(1, 4)]
    big = [event_pb2.Event(seq=n, delta="y" * 100_000) for n in range(4, 10)]
    bodies = [body async for body in sse.bodies(_batches(small, [], big))]
    assert bodies[0].data == sse.frames(small)  # one message for the three
    assert {b.content_type for b in bodies} == {"text/event-stream"}
    # Six 100 KB frames: a message closes once past the bound, so none holds
    # more than the bound and one frame.
    rest = bodies[1:]
    assert len(rest) == 2
    assert all(len(b.data) < sse.MAX_BODY_BYTES + 100_100 for b in rest)
    frames = b"".join(b.data for b in rest).split(b"\n\n")[:-1]
    assert [json.loads(f.removeprefix(b"data: "))["seq"] for f in frames] == list(range(4, 10))


async def test_the_size_bound_counts_bytes_not_characters() -> None:
    # 40,000 characters of three bytes each: 120 KB a frame, so a message of
    # three frames would be past the bound in bytes though not in characters.
    wide = [event_pb2.Event(seq=n, delta="\u20ac" * 40_000) for n in range(1, 7)]
    bodies = [body async for body in sse.bodies(_batches(wide))]
    assert len(bodies) == 2
    assert all(len(b.data) < sse.MAX_BODY_BYTES + 120_100 for b in bodies)
    frames = b"".join(b.data for b in bodies).split(b"\n\n")[:-1]
    assert [json.loads(f.removeprefix(b"data: "))["seq"] for f in frames] == list(range(1, 7))
