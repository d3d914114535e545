"""``load_agent``: what a worker runs, from a spec or an agent file.

The top of the package's imports: agent files (``_config``) load their agents
through ``_spec``, never through here, so imports go one way.
"""

from __future__ import annotations

from turnmesh.agent._contract import AgentRunnable
from turnmesh.agent._spec import load_spec

__all__ = ["load_agent"]


def load_agent(spec: str) -> tuple[str, AgentRunnable]:
    """Return ``(agent_name, instance)`` for a built-in name, ``module:Class``,
    or an agent file (``.yaml``).

    A class is instantiated with no arguments; its name is its ``name``
    attribute when it has one, else the class name in lower case.
    """
    spec = spec.strip()
    if spec.endswith((".yaml", ".yml")):
        # Lazily: an agent file needs YAML and the openai SDK (its `model`),
        # which a worker running a spec need not import.
        from turnmesh.agent._config import load_agent_file

        return load_agent_file(spec)
    return load_spec(spec)
