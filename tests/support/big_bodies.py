"""Large request bodies, accepted and refused, on every surface that takes
one: the REST paths through an edge (OpenAI chat and Responses, AG-UI, the
simple chat API, native turns) and the gRPC methods straight at a server
(the HttpBody ones and native turns); and a process's resident memory with
its children's (a server's body decoders count against the same limit).

Each kind of body has the outcome it must get: a 400 (or INVALID_ARGUMENT)
for the refused ones, a turn for the accepted ones, whose sessions are
deleted afterwards (their histories are memory a server rightly keeps).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
from google.api import httpbody_pb2

from turnmesh.client import AsyncClient, TurnmeshClientError
from turnmesh.runtime.serving import CLIENT_CHANNEL_OPTIONS
from turnmesh.server.compat.openai_responses import ids
from turnmesh.v1 import message_pb2

AGENT = "echo"
COMPAT = "/turnmesh.v1.CompatService/"


def rss_mib(pid: int) -> float:
    """A process's resident memory (VmRSS), MiB; 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    """Its child processes, whichever of its threads started them."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_rss_mib(pid: int) -> float:
    """The process's and its children's resident memory (a container's
    limit counts them all)."""
    return rss_mib(pid) + sum(tree_rss_mib(child) for child in children(pid))


def _b64(size: int) -> str:
    """Base64 of about ``size`` characters (text/plain bytes)."""
    return base64.b64encode(b"large body. " * (size * 3 // 4 // 12 + 1)).decode()


def _bad_json(size: int) -> bytes:
    return b'{"model": "echo", "messages": [' + b"x" * size + b"]}"


def _too_many_values(size: int) -> bytes:
    return b'{"model": "echo", "input": [' + b"0," * (size // 2) + b"0]}"


def _chat(size: int, *, file: bool) -> bytes:
    if not file:
        return json.dumps(
            {"model": AGENT, "messages": [{"role": "user", "content": "a" * size}]}
        ).encode()
    part = {
        "type": "file",
        "file": {"filename": "a.txt", "file_data": f"data:text/plain;base64,{_b64(size)}"},
    }
    message = {"role": "user", "content": [{"type": "text", "text": "hi"}, part]}
    return json.dumps({"model": AGENT, "messages": [message]}).encode()


def _responses(size: int, *, file: bool) -> bytes:
    if not file:
        return json.dumps({"model": AGENT, "input": "a" * size}).encode()
    part = {
        "type": "input_file",
        "filename": "a.txt",
        "file_data": f"data:text/plain;base64,{_b64(size)}",
    }
    content = [{"type": "input_text", "text": "hi"}, part]
    return json.dumps({"model": AGENT, "input": [{"role": "user", "content": content}]}).encode()


def _agui(size: int, thread: str, *, file: bool) -> bytes:
    content: object = "a" * size
    if file:
        source = {"type": "data", "value": _b64(size), "mimeType": "text/plain"}
        content = [{"type": "text", "text": "hi"}, {"type": "document", "source": source}]
    message = {"id": "m1", "role": "user", "content": content}
    return json.dumps({"threadId": thread, "runId": "r1", "messages": [message]}).encode()


def _simple_chat(size: int, *, file: bool) -> bytes:
    if not file:
        return json.dumps({"message": "a" * size, "agent_name": AGENT}).encode()
    files = [{"content": _b64(size), "mime_type": "text/plain", "filename": "a.txt"}]
    return json.dumps({"message": "hi", "agent_name": AGENT, "files": files}).encode()


def _turn(size: int, *, file: bool) -> bytes:
    if not file:
        return json.dumps({"message": "a" * size}).encode()
    files = [{"content": _b64(size), "mime_type": "text/plain", "filename": "a.txt"}]
    return json.dumps({"message": "hi", "files": files}).encode()


@dataclass(frozen=True)
class Kind:
    surface: str  # "rest /v1/responses", "grpc CreateResponse", ...
    name: str  # bad_json, too_many_values, too_long, file
    expected: str  # "400", "200", "INVALID_ARGUMENT", "OK"

    @property
    def label(self) -> str:
        return f"{self.surface} {self.name}"


_HTTP_BODY = {
    "/v1/chat/completions": "CreateChatCompletion",
    "/v1/responses": "CreateResponse",
    "/v1/agui": "RunAgent",
}


def kinds(*, grpc_only: bool = False) -> list[Kind]:
    """Every kind of body on every surface (``grpc_only``: the gRPC ones)."""
    found = []
    for path, method in _HTTP_BODY.items():
        for name in ("bad_json", "too_many_values", "too_long", "file"):
            if not grpc_only:
                found.append(Kind(f"rest {path}", name, "200" if name == "file" else "400"))
            found.append(
                Kind(f"grpc {method}", name, "OK" if name == "file" else "INVALID_ARGUMENT")
            )
    for path in ("/v1/chat", "/v1/sessions/{id}/turns"):
        for name in ("too_long", "file"):
            if not grpc_only:
                found.append(Kind(f"rest {path}", name, "200" if name == "file" else "400"))
    for name in ("too_long", "file"):
        found.append(Kind("grpc Turn", name, "OK" if name == "file" else "INVALID_ARGUMENT"))
    return found


class Sender:
    """Sends a kind of body of ``size`` bytes; returns its outcome (an HTTP
    status or a gRPC code's name). Sessions that turns made are deleted."""

    def __init__(self, server: str, edge: str | None, size: int) -> None:
        self._size = size
        self._edge = edge
        self._server = server
        self._http: httpx.AsyncClient | None = None
        self._channel: grpc.aio.Channel | None = None
        self._client: AsyncClient | None = None
        self._threads = 0
        self._bodies: dict[tuple[str, str], bytes] = {}

    async def __aenter__(self) -> Sender:
        if self._edge is not None:
            self._http = httpx.AsyncClient(base_url=f"http://{self._edge}", timeout=300)
        self._channel = grpc.aio.insecure_channel(self._server, options=CLIENT_CHANNEL_OPTIONS)
        self._client = AsyncClient(self._server, timeout=300)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self._channel is not None:
            await self._channel.close()
        if self._client is not None:
            await self._client.close()

    def _body(self, kind: Kind, path: str) -> bytes:
        """The body (built once: the same bytes every time it is sent)."""
        key = (path, kind.name)
        if key not in self._bodies:
            file = kind.name == "file"
            size = self._size
            if kind.name == "bad_json":
                body = _bad_json(size)
            elif kind.name == "too_many_values":
                body = _too_many_values(size)
            elif path == "/v1/chat/completions":
                body = _chat(size, file=file)
            elif path == "/v1/responses":
                body = _responses(size, file=file)
            elif path == "/v1/agui":
                body = _agui(size, "THREAD", file=file)
            elif path == "/v1/chat":
                body = _simple_chat(size, file=file)
            else:
                body = _turn(size, file=file)
            self._bodies[key] = body
        return self._bodies[key]

    def _agui_body(self, kind: Kind) -> tuple[bytes, str]:
        self._threads += 1
        thread = f"agui-big-{self._threads}"
        return self._body(kind, "/v1/agui").replace(b'"THREAD"', f'"{thread}"'.encode(), 1), thread

    async def send(self, kind: Kind) -> str:
        transport, where = kind.surface.split(" ", 1)
        if transport == "rest":
            return await self._rest(kind, where)
        if where == "Turn":
            return await self._grpc_turn(kind)
        path = next(p for p, m in _HTTP_BODY.items() if m == where)
        thread = ""
        body = self._body(kind, path)
        if path == "/v1/agui":
            body, thread = self._agui_body(kind)
        assert self._channel is not None
        method = self._channel.unary_stream(
            COMPAT + where,
            httpbody_pb2.HttpBody.SerializeToString,
            httpbody_pb2.HttpBody.FromString,
        )
        call = method(httpbody_pb2.HttpBody(content_type="application/json", data=body))
        try:
            replies = [reply.data async for reply in call]
            headers = dict(await call.initial_metadata() or ())
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        session = headers.get("x-session-id")
        await self._forget(path, b"".join(replies), thread, str(session) if session else None)
        return "OK"

    async def _rest(self, kind: Kind, path: str) -> str:
        assert self._http is not None and self._client is not None
        thread = ""
        if path == "/v1/agui":
            body, thread = self._agui_body(kind)
        else:
            body = self._body(kind, path)
        url = path
        created = ""
        if path == "/v1/sessions/{id}/turns":
            created = (await self._client.create_session(agent=AGENT)).session_id
            url = f"/v1/sessions/{created}/turns"
        response = await self._http.post(
            url, content=body, headers={"content-type": "application/json"}
        )
        if response.status_code == 200:
            await self._forget(path, response.content, thread, response.headers.get("x-session-id"))
        if created:
            await self._delete(created)
        return str(response.status_code)

    async def _grpc_turn(self, kind: Kind) -> str:
        assert self._client is not None
        sid = (await self._client.create_session(agent=AGENT)).session_id
        try:
            if kind.name == "file":
                file = message_pb2.File(
                    content=b"large body. " * (self._size // 12), mime_type="text/plain"
                )
                await self._client.send(sid, "hi", files=[file])
            else:
                await self._client.send(sid, "a" * self._size)
        except TurnmeshClientError as exc:
            return exc.code.name if exc.code else "?"
        finally:
            await self._delete(sid)
        return "OK"

    async def _forget(self, path: str, reply: bytes, thread: str, session: str | None) -> None:
        """Delete the session an accepted request's turn made."""
        if path == "/v1/responses":
            session = ids.decoded(json.loads(reply)["id"].removeprefix("resp_"))[0]
        elif path == "/v1/agui":
            session = thread
        elif path == "/v1/chat":
            session = json.loads(reply)["session_id"]
        if session:
            await self._delete(session)

    async def _delete(self, session: str) -> None:
        assert self._client is not None
        with contextlib.suppress(TurnmeshClientError):
            await self._client.delete_session(session)


# Settled: no drop of more than SETTLE_MIB in SETTLE_SECONDS (a server trims
# half a second after a large request ends), or MAX_SETTLE_SECONDS.
SETTLE_MIB = 1.0
SETTLE_SECONDS = 2.0
MAX_SETTLE_SECONDS = 20.0


async def settled(pid: int) -> tuple[float, float]:
    """RSS (alone, with its children) once it stops falling."""
    started = time.monotonic()
    last = rss_mib(pid)
    last_at = time.monotonic()
    while time.monotonic() - started < MAX_SETTLE_SECONDS:
        await asyncio.sleep(0.2)
        now = rss_mib(pid)
        if last - now > SETTLE_MIB:
            last, last_at = now, time.monotonic()
        elif time.monotonic() - last_at >= SETTLE_SECONDS:
            break
    return rss_mib(pid), tree_rss_mib(pid)
