"""Agent cards: one per agent the mesh serves, at the well-known path A2A
clients resolve (``/{agent}/.well-known/agent-card.json``; the default
agent's also at the root), open to anyone. Their interfaces are absolute,
built from the request's scheme and Host (Envoy passes them on), and name
the agent as their tenant, so a client sends it with every call: HTTP+JSON
and gRPC at the edge, JSON-RPC at the agent's own ``/{agent}/jsonrpc``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from a2a.types import a2a_pb2
from google.api import httpbody_pb2
from google.protobuf import json_format

from turnmesh.files import ALLOWED_MIME_TYPES
from turnmesh.runtime.errors import InvalidArgument, ModelNotFound
from turnmesh.server.compat._common import invalid
from turnmesh.server.compat.openai_models import MAX_ECHOED_ID

PROTOCOL_VERSION = "1.0"
# The headers Envoy sets on a card's request (envoy/config.py): the Host the
# client named (without its port: the edge strips it), the port it reached,
# and the scheme it spoke.
HOST_HEADER = "x-turnmesh-card-host"
PORT_HEADER = "x-turnmesh-card-port"
SCHEME_HEADER = "x-forwarded-proto"
DEFAULT_PORTS = {"http": "80", "https": "443"}
# A host name or address: nothing else goes into a URL.
_HOST = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])$")
_PORT = re.compile(r"^\d{1,5}$")
BEARER = "bearer"
# An agent's JSON-RPC endpoint, under its name (compat_service.proto).
JSONRPC_PATH = "jsonrpc"


class AgentCards:
    def __init__(
        self,
        agents: Callable[[], Iterable[str]],
        default_agent: str,
        keyed: Callable[[], bool],
        version: str,
        push: Callable[[], bool] = lambda: False,
    ) -> None:
        self._agents = agents
        self._default = default_agent
        self._keyed = keyed
        self._version = version
        # Whether push notifications are served (webhooks are on).
        self._push = push

    def card(
        self, agent: str, metadata: Iterable[tuple[str, str | bytes]] | None
    ) -> httpbody_pb2.HttpBody:
        name = agent or self._default
        if name not in set(self._agents()):
            shown = repr(name) if len(name) <= MAX_ECHOED_ID else "requested"
            raise ModelNotFound(f"no live worker serves the agent {shown}")
        host, scheme = _origin(metadata)
        card = self._card(name, host, scheme)
        return httpbody_pb2.HttpBody(
            content_type="application/json",
            data=json_format.MessageToJson(card, indent=None).encode(),
        )

    def _card(self, agent: str, host: str, scheme: str) -> a2a_pb2.AgentCard:
        card = a2a_pb2.AgentCard(
            name=agent,
            description=f"The {agent} agent, served by a turnmesh mesh.",
            version=self._version,
            capabilities=a2a_pb2.AgentCapabilities(
                streaming=True, push_notifications=self._push(), extended_agent_card=False
            ),
            default_input_modes=["text/plain", "application/json", *sorted(ALLOWED_MIME_TYPES)],
            default_output_modes=["text/plain", "application/json"],
        )
        card.provider.organization = "turnmesh"
        card.provider.url = f"{scheme}://{host}"
        for binding, url in (
            ("HTTP+JSON", f"{scheme}://{host}"),
            # The agent's JSON-RPC endpoint (its tenant is in its path too).
            ("JSONRPC", f"{scheme}://{host}/{agent}/{JSONRPC_PATH}"),
            ("GRPC", host),
        ):
            card.supported_interfaces.add(
                url=url, protocol_binding=binding, protocol_version=PROTOCOL_VERSION, tenant=agent
            )
        card.skills.add(
            id=agent,
            name=agent,
            description=f"Conversations with {agent}: each context keeps its history.",
            tags=["chat", "multi-turn"],
        )
        if self._keyed():
            scheme_entry = card.security_schemes[BEARER]
            scheme_entry.http_auth_security_scheme.scheme = "Bearer"
            scheme_entry.http_auth_security_scheme.description = "a turnmesh API key"
            card.security_requirements.add().schemes[BEARER].SetInParent()
        return card


def _origin(metadata: Iterable[tuple[str, str | bytes]] | None) -> tuple[str, str]:
    headers = {k: v for k, v in metadata or () if isinstance(v, str)}
    host, port = headers.get(HOST_HEADER, ""), headers.get(PORT_HEADER, "")
    if not _HOST.match(host):
        raise _bad_host()
    scheme = "https" if headers.get(SCHEME_HEADER, "").lower() == "https" else "http"
    if _PORT.match(port) and port != DEFAULT_PORTS[scheme]:
        host = f"{host}:{port}"
    return host, scheme


def _bad_host() -> InvalidArgument:
    return invalid("Host", "must be a host name or address, with an optional port")
