"""Agent files: validated at start-up with a message naming the bad field."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnmesh.agent import AgentLoadError, load_agent
from turnmesh.agent._config import read_agent_file
from turnmesh.agent.builtin.llm import OpenAIAgent


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: a\nkind: openai\n", "needs `model`"),
        ("name: a\nkind: robot\n", "kind must be one of openai, echo, demo, langgraph"),
        ("name: a\nkind: echo\ntools: [x:y]\n", "`tools` are for openai agents"),
        ("name: a\nkind: langgraph\n", "needs `graph`"),
        ("name: 'no spaces'\nkind: echo\n", "name: String should match pattern"),
        ("kind: echo\n", "name: Field required"),
        ("name: a\nkind: echo\ncolour: blue\n", "colour: Extra inputs are not permitted"),
        ("name: a\nkind: openai\nmodel: {name: m, temperature: 9}\n", "model.temperature"),
        ("name: a\nkind: openai\nmodel: {name: m}\ntools: [nope.nowhere:f]\n", "tools:"),
        (
            "name: a\nkind: openai\nmodel: {name: m}\ntool_timeout_seconds: 0\n",
            "tool_timeout_seconds",
        ),
        ("name: a\nkind: echo\napproval: [x]\n", "`approval` is for openai agents"),
        (
            "name: a\nkind: openai\nmodel: {name: m}\n"
            "tools: ['turnmesh.agent.builtin.tools:calculator']\napproval: [calculator, rm]\n",
            "approval: approval names tools the agent does not have: rm",
        ),
        ("- just\n- a list\n", "must be a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_agent_file_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(AgentLoadError) as refused:
        load_agent(path)
    assert message in str(refused.value)
    assert path in str(refused.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AgentLoadError, match=r"cannot read agent file .*missing\.yaml"):
        load_agent(str(tmp_path / "missing.yaml"))


def test_environment_variables_fill_in_strings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TM_MODEL", "qwen3")
    monkeypatch.delenv("TM_UNSET", raising=False)
    path = _write(
        tmp_path,
        "name: a\nkind: openai\nmodel:\n  name: ${TM_MODEL}\n"
        "  base_url: ${TM_UNSET:-http://127.0.0.1:9/v1}\n",
    )
    config = read_agent_file(path)
    assert config.model is not None
    assert (config.model.name, config.model.base_url) == ("qwen3", "http://127.0.0.1:9/v1")


def test_an_openai_agent_with_tools(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "name: helper\nkind: openai\nmodel: {name: m, base_url: 'http://127.0.0.1:9/v1'}\n"
        "instructions: Be kind.\ntools:\n  - turnmesh.agent.builtin.tools:calculator\n",
    )
    name, agent = load_agent(path)
    assert name == "helper"
    assert isinstance(agent, OpenAIAgent)
    assert agent.instructions == "Be kind."
    assert list(agent.tools) == ["calculator"]


@pytest.mark.parametrize("kind", ["echo", "demo", "turnmesh.agent.builtin.echo:EchoAgent"])
def test_other_kinds_take_the_files_name(tmp_path: Path, kind: str) -> None:
    name, agent = load_agent(_write(tmp_path, f"name: renamed\nkind: {kind}\n"))
    assert name == "renamed"
    assert agent.name == "renamed"  # type: ignore[attr-defined]


def test_the_example_agent_file_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "assistant.yaml"
    name, agent = load_agent(str(example))
    assert name == "assistant"
    assert isinstance(agent, OpenAIAgent)
    assert set(agent.tools) == {"calculator", "current_time"}


def test_openai_without_a_file_needs_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    with pytest.raises(AgentLoadError, match="set OPENAI_MODEL"):
        load_agent("openai")
    monkeypatch.setenv("OPENAI_MODEL", "m")
    assert load_agent("openai")[0] == "openai"
