"""Process-wide logging set-up: one line per record, to stderr.

``TURNMESH_LOG_FORMAT=json`` (or ``--log-format json``) writes each record as
one JSON object: timestamp, level, component, logger, message, and the
record's structured fields (session_id, turn_id, status, latency_ms ...).
Message content is never logged at INFO; DEBUG may show bodies, but never a
credential: every record passes ``RedactSecrets`` (a library logging a request
line or its headers at DEBUG, as websockets does for AReaL's ``/ws?token=``,
would otherwise write API keys to the log).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has: anything else came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


# A key in a query (`token=`, `access_token=`, `api_key=`) or a header as
# libraries log it: a line (`< Authorization: Basic …`), a dict or a gRPC
# metadata tuple (`'authorization', 'Bearer …'`); the scheme word is kept.
_SECRET = re.compile(
    r"(?i)((?<![a-z0-9])(?:[a-z]+_)?(?:token|api_?key)="
    r"|\b(?:authorization|x-api-key|api-key|x-turnmesh-mesh-key)[\"']?\s*[:=,]\s*[\"']?"
    r"(?:(?:bearer|basic|token)\s+)?)"
    r"[^\s&\"',)\]}]+"
)
_EXCEPTION = logging.Formatter()


def _redacted(text: str) -> str:
    return _SECRET.sub(r"\1[redacted]", text)


class RedactSecrets(logging.Filter):
    """Replaces credentials in a record's message and its traceback with
    ``[redacted]``; never raises (a record it cannot format passes as it is,
    for the handler to report, as logging does)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        if _SECRET.search(message) is not None:
            record.msg = _redacted(message)
            record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = _EXCEPTION.formatException(record.exc_info)
        if record.exc_text and _SECRET.search(record.exc_text) is not None:
            record.exc_text = _redacted(record.exc_text)
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self._component = component

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "component": self._component,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(component: str, level: str = "INFO", fmt: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if (fmt or os.environ.get("TURNMESH_LOG_FORMAT", "text")) == "json":
        handler.setFormatter(JsonFormatter(component))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {component} %(name)s: %(message)s")
        )
    handler.addFilter(RedactSecrets())
    logging.basicConfig(level=level.upper(), handlers=[handler])
