"""Agent files: a YAML description of an agent, so that running one needs no
Python. ``turnmesh worker --agent agent.yaml`` (or ``turnmesh up --agent``).

::

    name: assistant
    kind: openai            # openai | echo | demo | langgraph | areal | a2a | package.module:Class
    model:
      name: ${OPENAI_MODEL:-llama3.1}
      base_url: ${OPENAI_BASE_URL:-http://127.0.0.1:11434/v1}
      api_key_env: OPENAI_API_KEY
    instructions: You are a concise assistant.
    tools:
      - turnmesh.agent.builtin.tools:calculator
    approval: [calculator]  # these tools' calls wait for the client's approval

A remote A2A agent behind the mesh::

    name: travel
    kind: a2a
    remote:
      url: https://agents.example.com/travel   # or the card's own URL (.../agent-card.json)
      allow: [https://agents.example.com/]      # URL prefixes it may call (default: url's origin)
      bearer_token_env: TRAVEL_TOKEN            # or bearer_token_file: /run/secrets/travel

``${VAR}`` and ``${VAR:-default}`` in any string come from the environment.
The file is checked when the worker starts; a bad field stops it with a
message that names the field.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from turnmesh.agent._contract import AgentRunnable
from turnmesh.agent._spec import AgentLoadError, load_spec
from turnmesh.agent.a2a_settings import RemoteSettings
from turnmesh.agent.areal import AReaLAgent
from turnmesh.agent.builtin.llm import ModelSettings, OpenAIAgent
from turnmesh.agent.langgraph import LangGraphAgent
from turnmesh.agent.tools import ToolLoadError

AGENT_FILE_SUFFIXES = (".yaml", ".yml")
KINDS = ("openai", "echo", "demo", "langgraph", "areal", "a2a")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class AgentFileError(ValueError):
    """The agent file is missing, not YAML, or has a bad field (named)."""


class AgentFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: str = Field(min_length=1)
    model: ModelSettings | None = None
    remote: RemoteSettings | None = Field(default=None, description="a2a: the remote agent")
    instructions: str = ""
    tools: list[str] = Field(default_factory=list, max_length=128)
    # Names of `tools` whose calls wait for the client's approval (an interrupt).
    approval: list[str] = Field(default_factory=list, max_length=128)
    tool_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    max_tool_rounds: int = Field(default=8, ge=1, le=100)
    graph: str | None = Field(default=None, description="langgraph: package.module:compiled_graph")
    # `class` in the file (a Python keyword, hence the alias).
    agent_class: str | None = Field(
        default=None, alias="class", description="areal: package.module:Class (AReaL's contract)"
    )

    @field_validator("agent_class")
    @classmethod
    def _is_a_class_spec(cls, value: str | None) -> str | None:
        module, _, attribute = (value or "").partition(":")
        if value is not None and not (module.strip() and attribute.strip()):
            raise ValueError(f"expected package.module:Class, got {value!r}")
        return value

    @model_validator(mode="after")
    def _fits_the_kind(self) -> AgentFile:
        if self.kind not in KINDS and ":" not in self.kind:
            raise ValueError(f"kind must be one of {', '.join(KINDS)} or package.module:Class")
        if self.kind == "openai" and self.model is None:
            raise ValueError("an openai agent needs `model` (at least its name)")
        if self.kind == "a2a" and self.remote is None:
            raise ValueError("an a2a agent needs `remote` (at least its url)")
        if self.remote is not None and self.kind != "a2a":
            raise ValueError("`remote` is for a2a agents")
        if self.kind == "langgraph" and not self.graph:
            raise ValueError("a langgraph agent needs `graph` (package.module:compiled_graph)")
        if self.kind == "areal" and not self.agent_class:
            raise ValueError("an areal agent needs `class` (package.module:Class)")
        if self.agent_class and self.kind != "areal":
            raise ValueError("`class` is for areal agents")
        if self.tools and self.kind != "openai":
            raise ValueError("`tools` are for openai agents")
        if self.approval and self.kind != "openai":
            raise ValueError("`approval` is for openai agents")
        return self


def _expand(value: Any) -> Any:
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: os.environ.get(m[1], m[2] or ""), value)
    if isinstance(value, list):
        return [_expand(v) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v) for k, v in value.items()}
    return value


def _where(location: tuple[int | str, ...]) -> str:
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "(top level)"


def read_agent_file(path: str | Path) -> AgentFile:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise AgentFileError(f"cannot read agent file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise AgentFileError(f"agent file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise AgentFileError(f"agent file {path} must be a mapping of settings")
    try:
        return AgentFile.model_validate(_expand(data))
    except ValidationError as exc:
        problems = "; ".join(f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise AgentFileError(f"agent file {path}: {problems}") from exc


def load_agent_file(path: str) -> tuple[str, AgentRunnable]:
    """``(name, agent)`` for an agent file; AgentLoadError names the file
    and what is wrong with it."""
    try:
        config = read_agent_file(path)  # its errors name the file and field
    except AgentFileError as exc:
        raise AgentLoadError(str(exc)) from exc
    try:
        return config.name, build_agent(config)
    except (AgentFileError, AgentLoadError, ImportError, ValueError) as exc:
        raise AgentLoadError(f"agent file {path}: {exc}") from exc


def build_agent(config: AgentFile) -> AgentRunnable:
    """The agent the file describes (its name set to the file's)."""
    if config.kind == "openai":
        try:
            return OpenAIAgent(
                config.model,
                name=config.name,
                instructions=config.instructions,
                tools=config.tools,
                tool_timeout_seconds=config.tool_timeout_seconds,
                max_tool_rounds=config.max_tool_rounds,
                approval=config.approval,
            )
        except ToolLoadError as exc:
            raise AgentFileError(f"tools: {exc}") from exc
        except ValueError as exc:
            raise AgentFileError(f"approval: {exc}") from exc
    if config.kind == "a2a":
        from turnmesh.agent.remote_a2a import A2AAgent  # the SDK loads only for this kind

        assert config.remote is not None
        return A2AAgent(config.remote, name=config.name)
    if config.kind == "langgraph":
        assert config.graph is not None
        return LangGraphAgent(config.graph, name=config.name, instructions=config.instructions)
    if config.kind == "areal":
        assert config.agent_class is not None
        try:
            return AReaLAgent(config.agent_class, name=config.name)
        except AgentLoadError as exc:
            raise AgentFileError(f"class: {exc}") from exc
    _, agent = load_spec(config.kind)
    try:
        agent.name = config.name  # type: ignore[attr-defined]
    except AttributeError as exc:
        raise AgentFileError(f"kind: {config.kind!r} does not let its name be set") from exc
    return agent
