"""Files attached to a turn: which are accepted (``types``), and their text
(``extract``, run in a ``sandbox`` process with limits, whose slots ``fair``
shares among principals and turns)."""

from turnmesh.files.sandbox import Outcome, Sandbox
from turnmesh.files.types import (
    ALLOWED_MIME_TYPES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_TOTAL_FILE_BYTES,
    sniff_problem,
)

__all__ = [
    "ALLOWED_MIME_TYPES",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_TOTAL_FILE_BYTES",
    "Outcome",
    "Sandbox",
    "sniff_problem",
]
