"""The connection of a ``kind: a2a`` agent to its remote A2A agent, through
the pinned a2a-sdk client (``a2a_settings`` says where the remote is, which
URLs the worker may call and the token it sends), and what a failure says
to the caller.

Every request the client makes (the card, then the interface the card
names) is checked against the allow-list before it leaves, so a card cannot
send the worker, or its token, anywhere the agent file did not allow. A
gRPC interface (``host:port``, optionally ``grpc://``/``grpcs://``) is
admitted by its origin: ``https://host:port`` under an allowed prefix makes a
TLS channel, ``http://host:port`` a plaintext one, so the allow-list also
says which. The token is never logged nor put in an error; a token file is
read again for each request (each call, on gRPC), so a rotated token
applies at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import httpx
from a2a.client import (
    A2ACardResolver,
    AgentCardResolutionError,
    Client,
    ClientConfig,
    ClientFactory,
)
from a2a.client.errors import A2AClientError, A2AClientTimeoutError
from a2a.utils.errors import A2AError, TaskNotFoundError

from turnmesh.agent._contract import AgentError
from turnmesh.agent.a2a_settings import RemoteSettings, read_token
from turnmesh.runtime.outbound import shape_problem, under

__all__ = ["Link", "remote_error"]

log = logging.getLogger(__name__)

# The bindings the worker speaks; the card's order picks one. Each passes
# the allow-list and carries the token (httpx's hook and auth; gRPC's
# channel factory and a metadata interceptor).
BINDINGS = ["JSONRPC", "HTTP+JSON", "GRPC"]
# What a remote may send in one gRPC message (grpc's default is 4 MiB; an
# answer is bounded by the worker's own limits after this).
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
_GRPC_SCHEMES = {"grpc": "http", "grpcs": "https", "http": "http", "https": "https"}
# gRPC statuses that say the remote could not be reached, or took too long.
_GRPC_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
_GRPC_REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


class NotAllowed(Exception):
    """A request to a URL the allow-list does not admit (never sent)."""


class TokenUnreadable(Exception):
    """The token file cannot be read now (its path is logged, never its text)."""


class _Bearer(httpx.Auth):
    def __init__(self, settings: RemoteSettings) -> None:
        self._token = os.environ.get(settings.bearer_token_env or "", "")
        self._file = Path(settings.bearer_token_file) if settings.bearer_token_file else None

    def token(self) -> str:
        if self._file is None:
            return self._token
        try:
            return read_token(self._file)
        except ValueError:
            raise TokenUnreadable(str(self._file)) from None

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if token := self.token():
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


def _with_token(bearer: _Bearer, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    token = bearer.token()
    if not token:
        return details
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata["authorization"] = f"Bearer {token}"
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


# Two classes: grpc.aio files an interceptor under the first kind it is.
class _UnaryBearer(grpc.aio.UnaryUnaryClientInterceptor):
    """The token as ``authorization`` metadata on every unary gRPC call."""

    def __init__(self, bearer: _Bearer) -> None:
        self._bearer = bearer

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(self._bearer, details), request)


class _StreamBearer(grpc.aio.UnaryStreamClientInterceptor):
    """The token as ``authorization`` metadata on every streamed gRPC call."""

    def __init__(self, bearer: _Bearer) -> None:
        self._bearer = bearer

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(self._bearer, details), request)


def grpc_target(url: str, allowed: list[str]) -> tuple[str, bool]:
    """The ``host:port`` to dial for a card's gRPC interface URL, and whether
    over TLS, by the allow-list's word; NotAllowed if it admits neither."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    origin_schemes = [_GRPC_SCHEMES[scheme]] if scheme in _GRPC_SCHEMES else []
    if not scheme:
        origin_schemes = ["https", "http"]  # TLS first, if the allow-list names it
    if not origin_schemes or "/" in rest.rstrip("/") or not rest:
        raise NotAllowed(url)
    target = rest.rstrip("/")
    for origin_scheme in origin_schemes:
        origin = f"{origin_scheme}://{target}"
        parts = urlsplit(origin)
        try:
            port = parts.port
        except ValueError:
            raise NotAllowed(url) from None
        if port is None or shape_problem(origin):
            continue
        if port == _DEFAULT_PORTS[origin_scheme]:  # as an allow-list names it
            origin = f"{origin_scheme}://{parts.netloc.rsplit(':', 1)[0]}"
        if any(under(origin + "/", prefix) for prefix in allowed):
            return target, origin_scheme == "https"
    log.warning("the remote A2A agent's card names %s, which allow does not admit", url)
    raise NotAllowed(url)


class Link:
    """One remote agent's client, made on first use (the remote need not be
    up when the worker starts) and made again after the remote could not be
    reached (it may have restarted with another card)."""

    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        self._client: Client | None = None
        self._http: httpx.AsyncClient | None = None
        self._bearer = _Bearer(settings)
        self._lock = asyncio.Lock()

    async def _check(self, request: httpx.Request) -> None:
        url = str(request.url)
        if shape_problem(url) or not any(under(url, p) for p in self.settings.allowed):
            log.warning("the remote A2A agent's card names %s, which allow does not admit", url)
            raise NotAllowed(url)

    async def client(self) -> Client:
        async with self._lock:
            if self._client is None:
                self._client = await self._connect()
            return self._client

    async def _connect(self) -> Client:
        settings = self.settings
        timeout = httpx.Timeout(settings.timeout_seconds, connect=settings.connect_timeout_seconds)
        http = httpx.AsyncClient(
            timeout=timeout,
            follow_redirects=False,  # a redirect could leave the allow-list
            auth=self._bearer,
            event_hooks={"request": [self._check]},
        )
        try:
            url = settings.url.rstrip("/")
            card_path = "/" if url.endswith(".json") else None  # "/": the url is the card's
            card = await A2ACardResolver(http, url).get_agent_card(relative_card_path=card_path)
            config = ClientConfig(
                httpx_client=http,
                grpc_channel_factory=self._channel,
                supported_protocol_bindings=BINDINGS,
            )
            factory = ClientFactory(config)
            try:
                client = factory.create(card)
            except ValueError:
                raise AgentError(
                    "Remote agent unsupported",
                    "the remote agent's card offers none of JSON-RPC, HTTP+JSON and gRPC",
                    code="remote_unsupported",
                ) from None
        except BaseException:
            await http.aclose()
            raise
        self._http = http
        return client

    def _channel(self, url: str) -> grpc.aio.Channel:
        target, tls = grpc_target(url, self.settings.allowed)
        options = [
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
        ]
        interceptors = [_UnaryBearer(self._bearer), _StreamBearer(self._bearer)]
        if tls:
            credentials = grpc.ssl_channel_credentials()
            return grpc.aio.secure_channel(target, credentials, options, interceptors=interceptors)
        return grpc.aio.insecure_channel(target, options, interceptors=interceptors)

    async def forget(self) -> None:
        """Drop the client: the next turn fetches the card again."""
        async with self._lock:
            await self._close()

    async def close(self) -> None:
        async with self._lock:
            await self._close()

    async def _close(self) -> None:
        client, http = self._client, self._http
        self._client = self._http = None
        if client is not None:
            await client.close()
        if http is not None:
            await http.aclose()


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def remote_error(exc: BaseException) -> AgentError | None:
    """What the caller is told of a failed call to the remote (None: not a
    failure of the remote's, let it be a generic agent error). The remote's
    own words stay in the worker's log."""
    chain = _causes(exc)
    status = next(
        (c.response.status_code for c in chain if isinstance(c, httpx.HTTPStatusError)),
        getattr(exc, "status_code", None),
    )
    if any(isinstance(c, NotAllowed) for c in chain):
        return AgentError(
            "Remote agent not allowed",
            "the remote agent's card names a URL this agent may not call",
            code="remote_not_allowed",
        )
    if any(isinstance(c, TokenUnreadable) for c in chain):
        return AgentError(
            "Remote agent credentials unreadable",
            "the agent's token file cannot be read",
            code="remote_credentials",
        )
    codes = {c.code() for c in chain if isinstance(c, grpc.aio.AioRpcError)}
    if any(
        isinstance(c, httpx.TimeoutException | TimeoutError | A2AClientTimeoutError) for c in chain
    ):
        return AgentError(
            "Remote agent timed out",
            "the remote A2A agent did not answer in time",
            code="remote_timeout",
            status=504,
        )
    if status in (401, 403) or codes & _GRPC_REFUSED:
        return AgentError(
            "Remote agent refused the credentials",
            "the remote A2A agent rejected this agent's credentials",
            code="remote_auth",
        )
    if any(isinstance(c, httpx.TransportError) for c in chain) or codes & _GRPC_UNREACHABLE:
        return AgentError(
            "Remote agent unreachable",
            "the remote A2A agent could not be reached",
            code="remote_unreachable",
        )
    if isinstance(exc, AgentCardResolutionError):
        detail = f"the remote answered {status}" if status else "its card is not a valid A2A card"
        return AgentError("Remote agent card unavailable", detail, code="remote_card")
    if isinstance(exc, TaskNotFoundError):
        return AgentError(
            "Remote task not found",
            "the remote A2A agent no longer knows the task this turn continues",
            code="remote_task_not_found",
            status=409,
        )
    if status is not None:
        detail = f"the remote A2A agent answered HTTP {status}"
        return AgentError("Remote agent error", detail, code="remote_error")
    if codes and (isinstance(exc, grpc.aio.AioRpcError) or type(exc) is A2AClientError):
        # A gRPC status without A2A's ErrorInfo: its code, never its details.
        detail = f"the remote A2A agent answered gRPC {min(c.name for c in codes)}"
        return AgentError("Remote agent error", detail, code="remote_error")
    if isinstance(exc, A2AError):
        # The class's own words, never the remote's message.
        what = type(exc).message if type(exc) is not A2AError else "an error"
        detail = f"the remote A2A agent answered: {what}"
        return AgentError("Remote agent error", detail, code="remote_error")
    return None
