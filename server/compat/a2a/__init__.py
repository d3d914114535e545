"""A2A (agent-to-agent protocol v1.0, ``lf.a2a.v1``): every agent of the
mesh as an A2A agent, on the same port as every other surface.

By concept: ``ids`` (task ids that name their session and turn),
``messages`` (A2A messages in and out), ``task`` (a task's state and
updates from its turn), ``send`` (a message starts a task: blocking,
returned at once, or streamed), ``stored`` (a task read, cancelled or
followed again by its id), ``push_configs`` and ``push`` (push notification
configs, and their pushes on the webhook outbox), ``service`` (the RPCs),
``card`` (agent cards).

The mapping (docs/api.md has it whole): the A2A tenant is the agent; a
context is a session of the caller's (a message without one starts one, a
client-chosen id is made on first use); a task is its message's turn, run in
the background (ENQUEUE) so that it has a durable record and outlives its
caller; the answer is the task's one text artifact.
"""

from turnmesh.server.compat.a2a.card import AgentCards
from turnmesh.server.compat.a2a.push import PushNotifications
from turnmesh.server.compat.a2a.service import SERVICE_NAME, A2AServicer

__all__ = ["SERVICE_NAME", "A2AServicer", "AgentCards", "PushNotifications"]
