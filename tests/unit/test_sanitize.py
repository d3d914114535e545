"""No Python exception text leaves a process in an error (runtime.sanitize)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from turnmesh.runtime import errors, sanitize
from turnmesh.runtime.interceptors import worded_for_callers


def _texts_python_writes() -> list[str]:
    """Exception texts CPython itself produces for hostile input."""
    texts = []
    attempts: tuple[Callable[[], object], ...] = (
        lambda: b"\xff".decode("utf-8"),
        lambda: int("9" * 5000),
        lambda: json.loads("{"),
        lambda: None.field,  # type: ignore[attr-defined]
        lambda: {[]: 1},
        lambda: len(5),  # type: ignore[arg-type]
    )
    for attempt in attempts:
        try:
            attempt()
        except Exception as exc:
            texts.append(f"{type(exc).__name__}: {exc}" if isinstance(exc, KeyError) else str(exc))
    texts.append('Traceback (most recent call last):\n  File "x.py", line 3, in <module>')
    texts.append("<object object at 0x7f1c2a3b4c50>")
    texts.append("ValueError: bad")
    return texts


@pytest.mark.parametrize("text", _texts_python_writes())
def test_pythons_own_words_are_recognised(text: str) -> None:
    assert sanitize.is_internal(text), text


@pytest.mark.parametrize(
    "text",
    [
        "body: not valid JSON: Expecting value at character 0",
        "session 'abc' not found",
        "message: must not be blank",
        "holds more than 1000000 values",
        "no live worker serves agent 'demo' now; retry",
        "the value error was in field x",
    ],
)
def test_turnmeshs_own_words_pass(text: str) -> None:
    assert not sanitize.is_internal(text), text


def test_an_error_in_pythons_words_goes_out_in_the_tables() -> None:
    leaked = errors.NotFound("'NoneType' object has no attribute 'x'", metadata={"param": "p"})
    clean = worded_for_callers(leaked, "/m")
    assert type(clean) is errors.NotFound
    assert clean.detail == errors.NotFound.title
    assert clean.metadata == {"param": "p"}
    invalid = errors.InvalidArgument(
        [
            errors.FieldViolation("body", "'utf-8' codec can't decode byte 0xff in position 12"),
            errors.FieldViolation("model", "must not be blank"),
        ]
    )
    cleaned = worded_for_callers(invalid, "/m")
    assert isinstance(cleaned, errors.InvalidArgument)
    assert [(v.field, v.description) for v in cleaned.violations] == [
        ("body", "is not valid"),
        ("model", "must not be blank"),
    ]
    fine = errors.NotFound("session 's' not found")
    assert worded_for_callers(fine, "/m") is fine
