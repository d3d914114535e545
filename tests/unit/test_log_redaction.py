"""No credential reaches a log line, whoever logs it: websockets logs AReaL's
request line (``/ws?token=KEY``) and its headers at DEBUG."""

from __future__ import annotations

import io
import logging

import pytest

from turnmesh.runtime.logs import RedactSecrets


@pytest.mark.parametrize(
    ("message", "args", "expected"),
    [
        (
            "< GET %s HTTP/1.1",
            ("/ws?token=sk-abc123&x=1",),
            "< GET /ws?token=[redacted]&x=1 HTTP/1.1",
        ),
        ("< %s: %s", ("Authorization", "Bearer sk-abc123"), "< Authorization: Bearer [redacted]"),
        ("< %s: %s", ("authorization", "sk-abc123"), "< authorization: [redacted]"),
        ("< %s: %s", ("X-API-Key", "sk-abc123"), "< X-API-Key: [redacted]"),
        ("< %s: %s", ("Authorization", "Basic dXNlcjpwYXNz"), "< Authorization: Basic [redacted]"),
        ("GET %s", ("/x?access_token=sk-abc123",), "GET /x?access_token=[redacted]"),
        ("GET %s", ("/x?api_key=sk-abc123&a=1",), "GET /x?api_key=[redacted]&a=1"),
        ("%s", ({"authorization": "Bearer sk-abc123"},), "{'authorization': 'Bearer [redacted]'}"),
        (
            "%s",
            ([("authorization", "Bearer sk-abc123")],),
            "[('authorization', 'Bearer [redacted]')]",
        ),
        ("%s: %s", ("x-turnmesh-mesh-key", "sk-abc123"), "x-turnmesh-mesh-key: [redacted]"),
        ("turn ended", (), "turn ended"),
    ],
)
def test_credentials_are_redacted_from_any_record(
    message: str, args: tuple[str, ...], expected: str
) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets())
    logger = logging.getLogger("websockets.server.test")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        logger.debug(message, *args)
    finally:
        logger.removeHandler(handler)
    assert out.getvalue().strip() == expected
    assert "sk-abc123" not in out.getvalue()


def test_a_traceback_is_redacted_and_a_bad_record_never_raises() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets())
    logger = logging.getLogger("turnmesh.test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError("could not reach /ws?token=sk-abc123")
        except ValueError:
            logger.exception("failed")
        logger.warning("%s %s", 1)  # one argument short: logging reports it, nothing raises
    finally:
        logger.removeHandler(handler)
    assert "token=[redacted]" in out.getvalue()
    assert "sk-abc123" not in out.getvalue()
