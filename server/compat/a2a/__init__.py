"""A2A (agent-to-agent protocol v1.0, ``lf.a2a.v1``): every agent of the
mesh as an A2A agent, on the same port as every other surface.

By concept: ``ids`` (task ids that name their session and turn),
``messages`` (A2A messages in and out), ``task`` (a task's state and
updates from its turn), ``records`` (tasks as durable records: chains of
turns), ``send`` (a message starts a task, or answers one that waits:
blocking, returned at once, or streamed), ``answering`` (a message as the
answers to a task's pause), ``stored`` (a task read, cancelled or followed
again by its id), ``tasklist`` (ListTasks), ``push_configs`` and ``push``
(push notification configs, and their pushes on the webhook outbox),
``service`` (the RPCs), ``jsonrpc`` (the JSON-RPC 2.0 binding, over the
same RPCs), ``card`` (agent cards).

The mapping (docs/api.md has it whole): the A2A tenant is the agent; a
context is a session of the caller's (a message without one starts one, a
client-chosen id is made on first use); a task is a chain of turns (its
message's, then one per answer given on it: ``answering``), each run in the
background (ENQUEUE) so that it outlives its caller, with a durable record
(``records``) that any server finds by the task's id and ``tasklist`` pages;
the answers are the task's text artifacts.
"""

from turnmesh.server.compat.a2a.card import AgentCards
from turnmesh.server.compat.a2a.push import PushNotifications
from turnmesh.server.compat.a2a.service import SERVICE_NAME, A2AServicer

__all__ = ["SERVICE_NAME", "A2AServicer", "AgentCards", "PushNotifications"]
