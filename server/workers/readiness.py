"""Whether a turn of the default agent can run on this server now.

Ready as soon as a live worker of the agent is listed; not ready only after
``misses`` lists in a row without one, so a worker that restarts, or one list
that comes back empty while the router relearns the mesh, does not flap the
signal. Published as the gRPC health service ``AGENT_HEALTH_SERVICE``, kept
apart from the server's own ("" and the service names, which Envoy checks):
with ``healthy_panic_threshold`` 0, servers reporting NOT_SERVING for want of
workers would make Envoy answer 503 to every call, reads included.
"""

from __future__ import annotations

from dataclasses import dataclass

# The health service a load balancer or probe asks "can a turn of the
# default agent run here now" (SERVING) rather than "is this server up".
AGENT_HEALTH_SERVICE = "turnmesh.v1.DefaultAgent"
# Lists (one a second) without a live worker before readiness is withdrawn.
READY_MISSES = 3


@dataclass
class AgentReadiness:
    agent: str
    misses: int = READY_MISSES
    ready: bool = False
    _missed: int = 0

    def observe(self, live: bool) -> bool:
        """One list of the mesh's workers: ``live`` if one serves the agent.
        True if readiness changed."""
        if live:
            self._missed = 0
            changed = not self.ready
            self.ready = True
            return changed
        self._missed += 1
        if self.ready and self._missed >= self.misses:
            self.ready = False
            return True
        return False
