"""A2A task ids: the mesh's own spelling reads back; any other spelling of
the same bytes (base64 padding, its unused bits) names no task, so a task's
push configs can never be kept under an id its pushes do not look up."""

from __future__ import annotations

import string

import pytest

from turnmesh.runtime.errors import TaskNotFound
from turnmesh.server.compat.a2a.ids import parse_task_id, task_id

SESSION = "01M8YCC1N8BJ5HQBGX8P27HYNH"  # 26 bytes: base64's last character has unused bits
ALPHABET = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"


def test_the_meshs_spelling_reads_back() -> None:
    shown = task_id(SESSION, "turn-1")
    assert "=" not in shown
    assert parse_task_id(shown) == (SESSION, "turn-1")


def test_other_spellings_of_the_same_id_name_no_task() -> None:
    shown = task_id(SESSION, "turn-1")
    last = ALPHABET.index(shown[-1])
    unused_bits = shown[:-1] + ALPHABET[last ^ 1]  # the same bytes once decoded
    for alias in (shown + "=", shown + "==", unused_bits):
        with pytest.raises(TaskNotFound):
            parse_task_id(alias)


@pytest.mark.parametrize("value", ["", ".", "turn-1.", ".abc", "turn-1.!!", "no-dot"])
def test_what_the_mesh_never_made_names_no_task(value: str) -> None:
    with pytest.raises(TaskNotFound):
        parse_task_id(value)
