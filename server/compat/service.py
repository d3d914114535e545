"""CompatService: the other APIs' surfaces, thin over the modules that speak them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

from google.api import httpbody_pb2

from turnmesh.runtime.handlers import ServicerContext
from turnmesh.server.compat import agui, chat_upload, openai_chat, openai_responses, simple_chat
from turnmesh.server.compat._common import ON_DISCONNECT_HEADER, Mesh, on_disconnect
from turnmesh.server.compat.a2a import A2AServicer, AgentCards, jsonrpc
from turnmesh.server.compat.coalesce import coalesced
from turnmesh.server.compat.openai_models import Models
from turnmesh.server.sessions import validation
from turnmesh.v1 import chat_upload_pb2, event_pb2
from turnmesh.v1 import compat_service_pb2 as cpb
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.chat_upload_pb2_grpc import ChatUploadServiceServicer
from turnmesh.v1.compat_service_pb2_grpc import CompatServiceServicer

SESSION_HEADER = "x-session-id"


def _header(context: ServicerContext, name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name and isinstance(value, str) and value:
            return value
    return None


async def _then_headers(
    context: ServicerContext,
    headers: tuple[tuple[str, str], ...],
    bodies: AsyncIterator[httpbody_pb2.HttpBody],
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    """Send response headers only with the first body, so an error before it
    is still a plain HTTP error status."""
    first = True
    async for body in bodies:
        if first and headers:
            await context.send_initial_metadata(headers)
        first = False
        yield body


class CompatServicer(CompatServiceServicer):
    def __init__(self, mesh: Mesh, models: Models, cards: AgentCards, a2a: A2AServicer) -> None:
        self._mesh = mesh
        self._models = models
        self._cards = cards
        self._a2a = a2a

    async def CreateChatCompletion(
        self, request: httpbody_pb2.HttpBody, context: ServicerContext
    ) -> AsyncIterator[httpbody_pb2.HttpBody]:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        parsed = await openai_chat.parse(request)
        del request  # its body's bytes (a turn may hold the call for minutes)
        turn, message = await openai_chat.open_turn(
            mesh,
            parsed,
            _header(context, SESSION_HEADER),
            on_disconnect(_header(context, ON_DISCONNECT_HEADER)),
        )
        if parsed.stream:
            bodies = coalesced(openai_chat.stream(mesh, parsed, turn, message), mesh.events_ready)
        else:
            bodies = _one(openai_chat.complete(mesh, parsed, turn, message))
        async for body in _then_headers(context, ((SESSION_HEADER, turn.session_id),), bodies):
            yield body

    async def CreateResponse(
        self, request: httpbody_pb2.HttpBody, context: ServicerContext
    ) -> AsyncIterator[httpbody_pb2.HttpBody]:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        parsed = await openai_responses.parse(request)
        del request  # its body's bytes (a turn may hold the call for minutes)
        policy = on_disconnect(_header(context, ON_DISCONNECT_HEADER))
        if parsed.stream:
            bodies = coalesced(openai_responses.stream(mesh, parsed, policy), mesh.events_ready)
        else:
            bodies = _one(openai_responses.create(mesh, parsed, policy))
        async for body in bodies:
            yield body

    async def GetResponse(
        self, request: cpb.GetResponseRequest, context: ServicerContext
    ) -> httpbody_pb2.HttpBody:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        return await openai_responses.get(mesh, request.response_id)

    async def CancelResponse(
        self, request: cpb.CancelResponseRequest, context: ServicerContext
    ) -> httpbody_pb2.HttpBody:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        return await openai_responses.cancel(mesh, request.response_id)

    async def ListModels(
        self, request: cpb.ListModelsRequest, context: ServicerContext
    ) -> httpbody_pb2.HttpBody:
        return self._models.list()

    async def GetModel(
        self, request: cpb.GetModelRequest, context: ServicerContext
    ) -> httpbody_pb2.HttpBody:
        return self._models.get(request.model)

    async def RunAgent(
        self, request: httpbody_pb2.HttpBody, context: ServicerContext
    ) -> AsyncIterator[httpbody_pb2.HttpBody]:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        policy = on_disconnect(_header(context, ON_DISCONNECT_HEADER))
        parsed = await agui.parse(request)
        del request  # its body's bytes (a turn may hold the call for minutes)
        async for body in coalesced(agui.run(mesh, parsed, policy), mesh.events_ready):
            yield body

    async def Chat(self, request: cpb.ChatRequest, context: ServicerContext) -> cpb.ChatResponse:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        await _validate_chat(request)
        return await simple_chat.chat(mesh, request)

    async def GetChatHealth(
        self, request: cpb.GetChatHealthRequest, context: ServicerContext
    ) -> cpb.ChatHealth:
        return simple_chat.health(await self._mesh.health())

    async def ChatStream(
        self, request: cpb.ChatRequest, context: ServicerContext
    ) -> AsyncIterator[event_pb2.Event]:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        await _validate_chat(request)
        async for event in simple_chat.stream(mesh, request):
            yield event

    async def GetAgentCard(
        self, request: cpb.GetAgentCardRequest, context: ServicerContext
    ) -> httpbody_pb2.HttpBody:
        return self._cards.card(request.agent, context.invocation_metadata())

    async def A2AJsonRpc(
        self, request: cpb.A2AJsonRpcRequest, context: ServicerContext
    ) -> AsyncIterator[httpbody_pb2.HttpBody]:
        bodies = jsonrpc.answer(self._a2a, request.agent, request.body, context)
        del request  # its body's bytes (a task may hold the call for minutes): answer drops them
        async for response in bodies:
            yield response


class ChatUploadServicer(ChatUploadServiceServicer):
    """Simple chat's multipart forms: read into a ChatRequest, then answered
    as Chat and ChatStream answer it."""

    def __init__(self, mesh: Mesh) -> None:
        self._mesh = mesh

    async def UploadChat(
        self, request: chat_upload_pb2.UploadChatRequest, context: ServicerContext
    ) -> AsyncIterator[httpbody_pb2.HttpBody]:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        chat = await chat_upload.read(request)
        del request  # its body's bytes: the files are in `chat` now
        await _validate_chat(chat)
        yield chat_upload.response_body(await simple_chat.chat(mesh, chat))

    async def UploadChatStream(
        self, request: chat_upload_pb2.UploadChatRequest, context: ServicerContext
    ) -> AsyncIterator[httpbody_pb2.HttpBody]:
        mesh = self._mesh.for_caller(context.invocation_metadata())
        chat = await chat_upload.read(request)
        del request
        await _validate_chat(chat)
        bodies = (chat_upload.event_body(event) async for event in simple_chat.stream(mesh, chat))
        async for body in coalesced(bodies, mesh.events_ready):
            yield body


async def _one(body: Awaitable[httpbody_pb2.HttpBody]) -> AsyncIterator[httpbody_pb2.HttpBody]:
    """A single response as the one-item stream the RPC returns."""
    yield await body


async def _validate_chat(request: cpb.ChatRequest) -> None:
    """The Turn rules, named as this API's fields, before any session is made;
    with files, in a thread (each is copied into the turn, then read)."""
    if request.files:
        await asyncio.to_thread(_check_chat, request)
    else:
        _check_chat(request)


def _check_chat(request: cpb.ChatRequest) -> None:
    turn = spb.TurnRequest(
        session_id=request.session_id or "placeholder",
        message=request.message,
        tools=request.tools,
        tool_results=request.tool_results,
        resume=request.resume,
    )
    for file in request.files:  # one call each: the event loop runs between them
        turn.files.append(file)
    validation.validate_turn(turn)
