"""A2AService (lf.a2a.v1, the pinned a2a-sdk's generated contract), served by
every session server over the session service in this process, as the
other surfaces are. The A2A ``tenant`` names the agent (empty: the mesh's
default); the caller's principal is its key's, as everywhere."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

from a2a.types import a2a_pb2, a2a_pb2_grpc
from google.protobuf import empty_pb2

from turnmesh.runtime.errors import (
    ExtendedAgentCardNotConfigured,
    InvalidArgument,
    InvalidParams,
)
from turnmesh.runtime.handlers import ServicerContext
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.a2a import send, stored, tasklist
from turnmesh.server.compat.a2a.push import PushNotifications

SERVICE_NAME = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"].full_name


@contextlib.contextmanager
def _a2a_errors() -> Iterator[None]:
    """The mesh's own 400s in A2A's words (InvalidParams, with A2A's ErrorInfo
    beside the field violations); every other error keeps its row."""
    try:
        yield
    except InvalidParams:
        raise
    except InvalidArgument as exc:
        raise InvalidParams(exc.violations) from None


class A2AServicer(a2a_pb2_grpc.A2AServiceServicer):
    def __init__(self, mesh: Mesh, push: PushNotifications) -> None:
        self._mesh = mesh
        self._push = push

    def _for(self, context: ServicerContext) -> Mesh:
        return self._mesh.for_caller(context.invocation_metadata())

    async def SendMessage(
        self, request: a2a_pb2.SendMessageRequest, context: ServicerContext
    ) -> a2a_pb2.SendMessageResponse:
        with _a2a_errors():
            return await send.send(self._for(context), request, request.tenant, self._push)

    async def SendStreamingMessage(
        self, request: a2a_pb2.SendMessageRequest, context: ServicerContext
    ) -> AsyncIterator[a2a_pb2.StreamResponse]:
        with _a2a_errors():
            async for response in send.stream(
                self._for(context), request, request.tenant, self._push
            ):
                yield response

    async def GetTask(
        self, request: a2a_pb2.GetTaskRequest, context: ServicerContext
    ) -> a2a_pb2.Task:
        with _a2a_errors():
            return await stored.get(self._for(context), request, request.tenant)

    async def CancelTask(
        self, request: a2a_pb2.CancelTaskRequest, context: ServicerContext
    ) -> a2a_pb2.Task:
        with _a2a_errors():
            return await stored.cancel(self._for(context), request, request.tenant)

    async def SubscribeToTask(
        self, request: a2a_pb2.SubscribeToTaskRequest, context: ServicerContext
    ) -> AsyncIterator[a2a_pb2.StreamResponse]:
        with _a2a_errors():
            async for response in stored.subscribe(self._for(context), request, request.tenant):
                yield response

    async def ListTasks(
        self, request: a2a_pb2.ListTasksRequest, context: ServicerContext
    ) -> a2a_pb2.ListTasksResponse:
        with _a2a_errors():
            return await tasklist.list_tasks(self._for(context), request, request.tenant)

    async def GetExtendedAgentCard(
        self, request: a2a_pb2.GetExtendedAgentCardRequest, context: ServicerContext
    ) -> a2a_pb2.AgentCard:
        # The public card says all there is (every caller gets the same agent),
        # and says so: capabilities.extended_agent_card is false.
        raise ExtendedAgentCardNotConfigured(
            "this agent has no extended card: its public card is all there is"
        )

    async def CreateTaskPushNotificationConfig(
        self, request: a2a_pb2.TaskPushNotificationConfig, context: ServicerContext
    ) -> a2a_pb2.TaskPushNotificationConfig:
        with _a2a_errors():
            return await self._push.create(self._for(context), request, request.tenant)

    async def GetTaskPushNotificationConfig(
        self, request: a2a_pb2.GetTaskPushNotificationConfigRequest, context: ServicerContext
    ) -> a2a_pb2.TaskPushNotificationConfig:
        with _a2a_errors():
            return await self._push.get(self._for(context), request, request.tenant)

    async def ListTaskPushNotificationConfigs(
        self, request: a2a_pb2.ListTaskPushNotificationConfigsRequest, context: ServicerContext
    ) -> a2a_pb2.ListTaskPushNotificationConfigsResponse:
        with _a2a_errors():
            return await self._push.list_configs(self._for(context), request, request.tenant)

    async def DeleteTaskPushNotificationConfig(
        self, request: a2a_pb2.DeleteTaskPushNotificationConfigRequest, context: ServicerContext
    ) -> empty_pb2.Empty:
        with _a2a_errors():
            await self._push.delete(self._for(context), request, request.tenant)
        return empty_pb2.Empty()
