"""Resolve an agent spec (a built-in name or ``package.module:Class``) to an
instance. Below the agents and agent files that load other agents (``areal``,
``_config``), so it imports none of them."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

from turnmesh.agent._contract import AgentRunnable

__all__ = ["BUILTIN_AGENTS", "AgentLoadError", "import_agent", "load_spec"]

# Name -> spec; resolved lazily so a worker imports only the agent it runs.
BUILTIN_AGENTS: Mapping[str, str] = MappingProxyType(
    {
        "demo": "turnmesh.agent.builtin.demo:DemoAgent",
        "echo": "turnmesh.agent.builtin.echo:EchoAgent",
        "openai": "turnmesh.agent.builtin.llm:OpenAIAgent",
    }
)


class AgentLoadError(ValueError):
    """The agent spec names nothing that can run as an agent."""


def load_spec(spec: str) -> tuple[str, AgentRunnable]:
    """``(agent_name, instance)`` for a built-in name or ``module:Class``."""
    spec = spec.strip()
    if ":" not in spec:
        if spec not in BUILTIN_AGENTS:
            known = ", ".join(sorted(BUILTIN_AGENTS))
            raise AgentLoadError(
                f"unknown agent {spec!r}: use a built-in agent ({known}) or 'package.module:Class'"
            )
        return import_agent(BUILTIN_AGENTS[spec])
    return import_agent(spec)


def import_agent(spec: str) -> tuple[str, AgentRunnable]:
    """``(agent_name, instance)`` for ``package.module:Class`` (instantiated
    with no arguments) or ``package.module:agent`` (an agent object)."""
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise AgentLoadError(f"invalid agent spec {spec!r}: expected 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentLoadError(f"cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:
        # The module exists but fails while importing: say so, not "not found".
        raise AgentLoadError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc

    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AgentLoadError(f"module {module_name!r} has no attribute {attr_path!r}") from None

    if not inspect.iscoroutinefunction(getattr(target, "run", None)):
        raise AgentLoadError(
            f"{spec!r} is not an agent: it needs a method "
            "'async def run(self, request, *, emitter)'"
        )
    if inspect.isclass(target):
        try:
            instance = target()
        except Exception as exc:
            raise AgentLoadError(
                f"cannot instantiate {spec!r} with no arguments: {type(exc).__name__}: {exc}"
            ) from exc
    else:
        instance = target  # an agent object defined at module level
    name = getattr(instance, "name", None)
    if not isinstance(name, str) or not name:
        name = type(instance).__name__.lower()
    return name, cast(AgentRunnable, instance)
