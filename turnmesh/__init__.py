"""turnmesh: a gRPC service mesh for stateful, multi-turn AI agents.

The public Python surface:

- ``turnmesh.client``: typed clients for the public ``SessionService``.
- ``turnmesh.agent``: the contract an agent implements (``AgentRunnable``).
- ``turnmesh.v1``: the generated protobuf messages and gRPC stubs.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
