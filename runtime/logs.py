"""Process-wide logging set-up: one line per record, to stderr."""

from __future__ import annotations

import logging
import sys


def setup_logging(component: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {component} %(name)s: %(message)s",
    )
