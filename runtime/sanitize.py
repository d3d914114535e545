"""The last check before an error's text leaves a process: Python's own words.

Handlers word their errors for the caller (``runtime.bodies`` says where a body
is not JSON, not what the decoder raised). This catches what slips through, at
the one boundary every status passes (``interceptors.ErrorMappingInterceptor``):
a text that reads like an exception's (a traceback, a frame, an object's
address, the interpreter's advice, a codec's or a type's complaint) is replaced
by the row's title, and the original is logged so the handler can be fixed.
"""

from __future__ import annotations

import re

# Phrases of CPython's own exception messages and tracebacks; none is a phrase
# turnmesh's handlers use.
_INTERNAL = re.compile(
    "|".join(
        [
            r"Traceback \(most recent call last\)",
            r'File "[^"]*", line \d+',
            r" object at 0x[0-9a-f]+",
            r"sys\.set_int_max_str_digits",
            r"codec can't (?:de|en)code",
            r"'\w+' object (?:has no attribute|is not (?:subscriptable|iterable|callable))",
            r"unhashable type",
            r"object of type '\w+' has no",
            r"line \d+ column \d+ \(char \d+\)",
            r"takes \d+ positional arguments? but \d+ (?:was|were) given",
            r"(?:missing|got an unexpected) \d* ?(?:required )?(?:positional |keyword )?argument",
            r"\b(?:Type|Value|Key|Attribute|Index|Unicode\w*|Recursion|Overflow|Assertion|Runtime)"
            r"Error\b[:(]",
        ]
    )
)


def is_internal(text: str) -> bool:
    """True if ``text`` reads like Python's exception text."""
    return _INTERNAL.search(text) is not None
