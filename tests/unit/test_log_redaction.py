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
