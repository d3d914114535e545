"""Generated from proto/turnmesh/v1 by scripts/gen_protos.py. DO NOT EDIT."""

from turnmesh.v1 import chat_upload_pb2
from turnmesh.v1 import chat_upload_pb2_grpc
from turnmesh.v1 import compat_service_pb2
from turnmesh.v1 import compat_service_pb2_grpc
from turnmesh.v1 import event_pb2
from turnmesh.v1 import event_pb2_grpc
from turnmesh.v1 import event_stream_pb2
from turnmesh.v1 import event_stream_pb2_grpc
from turnmesh.v1 import message_pb2
from turnmesh.v1 import message_pb2_grpc
from turnmesh.v1 import router_service_pb2
from turnmesh.v1 import router_service_pb2_grpc
from turnmesh.v1 import session_service_pb2
from turnmesh.v1 import session_service_pb2_grpc
from turnmesh.v1 import worker_service_pb2
from turnmesh.v1 import worker_service_pb2_grpc

from turnmesh.v1.chat_upload_pb2 import UploadChatRequest as UploadChatRequest
from turnmesh.v1.chat_upload_pb2_grpc import ChatUploadServiceStub as ChatUploadServiceStub
from turnmesh.v1.chat_upload_pb2_grpc import ChatUploadServiceServicer as ChatUploadServiceServicer
from turnmesh.v1.chat_upload_pb2_grpc import add_ChatUploadServiceServicer_to_server as add_ChatUploadServiceServicer_to_server
from turnmesh.v1.chat_upload_pb2_grpc import ChatUploadService as ChatUploadService
from turnmesh.v1.compat_service_pb2 import A2AJsonRpcRequest as A2AJsonRpcRequest
from turnmesh.v1.compat_service_pb2 import GetAgentCardRequest as GetAgentCardRequest
from turnmesh.v1.compat_service_pb2 import GetResponseRequest as GetResponseRequest
from turnmesh.v1.compat_service_pb2 import CancelResponseRequest as CancelResponseRequest
from turnmesh.v1.compat_service_pb2 import ListModelsRequest as ListModelsRequest
from turnmesh.v1.compat_service_pb2 import GetModelRequest as GetModelRequest
from turnmesh.v1.compat_service_pb2 import GetChatHealthRequest as GetChatHealthRequest
from turnmesh.v1.compat_service_pb2 import ChatHealth as ChatHealth
from turnmesh.v1.compat_service_pb2 import ChatRequest as ChatRequest
from turnmesh.v1.compat_service_pb2 import ChatToolCall as ChatToolCall
from turnmesh.v1.compat_service_pb2 import ChatInterrupt as ChatInterrupt
from turnmesh.v1.compat_service_pb2 import ChatTokensUsed as ChatTokensUsed
from turnmesh.v1.compat_service_pb2 import ChatResponse as ChatResponse
from turnmesh.v1.compat_service_pb2_grpc import CompatServiceStub as CompatServiceStub
from turnmesh.v1.compat_service_pb2_grpc import CompatServiceServicer as CompatServiceServicer
from turnmesh.v1.compat_service_pb2_grpc import add_CompatServiceServicer_to_server as add_CompatServiceServicer_to_server
from turnmesh.v1.compat_service_pb2_grpc import CompatService as CompatService
from turnmesh.v1.event_pb2 import EventType as EventType
from turnmesh.v1.event_pb2 import TokenUsage as TokenUsage
from turnmesh.v1.event_pb2 import Problem as Problem
from turnmesh.v1.event_pb2 import Event as Event
from turnmesh.v1.event_pb2 import RunOutcome as RunOutcome
from turnmesh.v1.event_pb2 import Interrupt as Interrupt
from turnmesh.v1.event_stream_pb2_grpc import EventStreamServiceStub as EventStreamServiceStub
from turnmesh.v1.event_stream_pb2_grpc import EventStreamServiceServicer as EventStreamServiceServicer
from turnmesh.v1.event_stream_pb2_grpc import add_EventStreamServiceServicer_to_server as add_EventStreamServiceServicer_to_server
from turnmesh.v1.event_stream_pb2_grpc import EventStreamService as EventStreamService
from turnmesh.v1.message_pb2 import File as File
from turnmesh.v1.message_pb2 import FileRef as FileRef
from turnmesh.v1.message_pb2 import FunctionCall as FunctionCall
from turnmesh.v1.message_pb2 import ToolCall as ToolCall
from turnmesh.v1.message_pb2 import Message as Message
from turnmesh.v1.message_pb2 import ToolDefinition as ToolDefinition
from turnmesh.v1.message_pb2 import ToolResult as ToolResult
from turnmesh.v1.message_pb2 import ResumeEntry as ResumeEntry
from turnmesh.v1.message_pb2 import Pause as Pause
from turnmesh.v1.router_service_pb2 import MemberRole as MemberRole
from turnmesh.v1.router_service_pb2 import Member as Member
from turnmesh.v1.router_service_pb2 import RegisterRequest as RegisterRequest
from turnmesh.v1.router_service_pb2 import RegisterResponse as RegisterResponse
from turnmesh.v1.router_service_pb2 import HeartbeatRequest as HeartbeatRequest
from turnmesh.v1.router_service_pb2 import HeartbeatResponse as HeartbeatResponse
from turnmesh.v1.router_service_pb2 import UnregisterRequest as UnregisterRequest
from turnmesh.v1.router_service_pb2 import UnregisterResponse as UnregisterResponse
from turnmesh.v1.router_service_pb2 import RouteRequest as RouteRequest
from turnmesh.v1.router_service_pb2 import RouteResponse as RouteResponse
from turnmesh.v1.router_service_pb2 import RemoveSessionRequest as RemoveSessionRequest
from turnmesh.v1.router_service_pb2 import RemoveSessionResponse as RemoveSessionResponse
from turnmesh.v1.router_service_pb2 import ReportSessionsRequest as ReportSessionsRequest
from turnmesh.v1.router_service_pb2 import ReportSessionsResponse as ReportSessionsResponse
from turnmesh.v1.router_service_pb2 import ListMembersRequest as ListMembersRequest
from turnmesh.v1.router_service_pb2 import ListMembersResponse as ListMembersResponse
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub as RouterServiceStub
from turnmesh.v1.router_service_pb2_grpc import RouterServiceServicer as RouterServiceServicer
from turnmesh.v1.router_service_pb2_grpc import add_RouterServiceServicer_to_server as add_RouterServiceServicer_to_server
from turnmesh.v1.router_service_pb2_grpc import RouterService as RouterService
from turnmesh.v1.session_service_pb2 import TurnPolicy as TurnPolicy
from turnmesh.v1.session_service_pb2 import DisconnectPolicy as DisconnectPolicy
from turnmesh.v1.session_service_pb2 import LifecycleState as LifecycleState
from turnmesh.v1.session_service_pb2 import TurnState as TurnState
from turnmesh.v1.session_service_pb2 import Session as Session
from turnmesh.v1.session_service_pb2 import CreateSessionRequest as CreateSessionRequest
from turnmesh.v1.session_service_pb2 import CreateSessionResponse as CreateSessionResponse
from turnmesh.v1.session_service_pb2 import ForkSessionRequest as ForkSessionRequest
from turnmesh.v1.session_service_pb2 import ForkSessionResponse as ForkSessionResponse
from turnmesh.v1.session_service_pb2 import GetSessionRequest as GetSessionRequest
from turnmesh.v1.session_service_pb2 import ListSessionsRequest as ListSessionsRequest
from turnmesh.v1.session_service_pb2 import ListSessionsResponse as ListSessionsResponse
from turnmesh.v1.session_service_pb2 import GetSessionResponse as GetSessionResponse
from turnmesh.v1.session_service_pb2 import DeleteSessionRequest as DeleteSessionRequest
from turnmesh.v1.session_service_pb2 import DeleteSessionResponse as DeleteSessionResponse
from turnmesh.v1.session_service_pb2 import GetHistoryRequest as GetHistoryRequest
from turnmesh.v1.session_service_pb2 import GetHistoryResponse as GetHistoryResponse
from turnmesh.v1.session_service_pb2 import TurnRequest as TurnRequest
from turnmesh.v1.session_service_pb2 import StartTurnRequest as StartTurnRequest
from turnmesh.v1.session_service_pb2 import StartTurnResponse as StartTurnResponse
from turnmesh.v1.session_service_pb2 import GetTurnRequest as GetTurnRequest
from turnmesh.v1.session_service_pb2 import GetTurnResponse as GetTurnResponse
from turnmesh.v1.session_service_pb2 import Turn as Turn
from turnmesh.v1.session_service_pb2 import CancelTurnRequest as CancelTurnRequest
from turnmesh.v1.session_service_pb2 import CancelTurnResponse as CancelTurnResponse
from turnmesh.v1.session_service_pb2 import SubscribeTurnRequest as SubscribeTurnRequest
from turnmesh.v1.session_service_pb2 import GetHealthRequest as GetHealthRequest
from turnmesh.v1.session_service_pb2 import GetHealthResponse as GetHealthResponse
from turnmesh.v1.session_service_pb2 import GetReadinessRequest as GetReadinessRequest
from turnmesh.v1.session_service_pb2 import GetReadinessResponse as GetReadinessResponse
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub as SessionServiceStub
from turnmesh.v1.session_service_pb2_grpc import SessionServiceServicer as SessionServiceServicer
from turnmesh.v1.session_service_pb2_grpc import add_SessionServiceServicer_to_server as add_SessionServiceServicer_to_server
from turnmesh.v1.session_service_pb2_grpc import SessionService as SessionService
from turnmesh.v1.worker_service_pb2 import RunRequest as RunRequest
from turnmesh.v1.worker_service_pb2 import RunResponse as RunResponse
from turnmesh.v1.worker_service_pb2 import RelayRequest as RelayRequest
from turnmesh.v1.worker_service_pb2 import RelayResponse as RelayResponse
from turnmesh.v1.worker_service_pb2 import RelayedEvents as RelayedEvents
from turnmesh.v1.worker_service_pb2 import GetInfoRequest as GetInfoRequest
from turnmesh.v1.worker_service_pb2 import GetInfoResponse as GetInfoResponse
from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceStub as WorkerServiceStub
from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceServicer as WorkerServiceServicer
from turnmesh.v1.worker_service_pb2_grpc import add_WorkerServiceServicer_to_server as add_WorkerServiceServicer_to_server
from turnmesh.v1.worker_service_pb2_grpc import WorkerService as WorkerService

__all__ = [
    "A2AJsonRpcRequest",
    "CancelResponseRequest",
    "CancelTurnRequest",
    "CancelTurnResponse",
    "ChatHealth",
    "ChatInterrupt",
    "ChatRequest",
    "ChatResponse",
    "ChatTokensUsed",
    "ChatToolCall",
    "ChatUploadService",
    "ChatUploadServiceServicer",
    "ChatUploadServiceStub",
    "CompatService",
    "CompatServiceServicer",
    "CompatServiceStub",
    "CreateSessionRequest",
    "CreateSessionResponse",
    "DeleteSessionRequest",
    "DeleteSessionResponse",
    "DisconnectPolicy",
    "Event",
    "EventStreamService",
    "EventStreamServiceServicer",
    "EventStreamServiceStub",
    "EventType",
    "File",
    "FileRef",
    "ForkSessionRequest",
    "ForkSessionResponse",
    "FunctionCall",
    "GetAgentCardRequest",
    "GetChatHealthRequest",
    "GetHealthRequest",
    "GetHealthResponse",
    "GetHistoryRequest",
    "GetHistoryResponse",
    "GetInfoRequest",
    "GetInfoResponse",
    "GetModelRequest",
    "GetReadinessRequest",
    "GetReadinessResponse",
    "GetResponseRequest",
    "GetSessionRequest",
    "GetSessionResponse",
    "GetTurnRequest",
    "GetTurnResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "Interrupt",
    "LifecycleState",
    "ListMembersRequest",
    "ListMembersResponse",
    "ListModelsRequest",
    "ListSessionsRequest",
    "ListSessionsResponse",
    "Member",
    "MemberRole",
    "Message",
    "Pause",
    "Problem",
    "RegisterRequest",
    "RegisterResponse",
    "RelayRequest",
    "RelayResponse",
    "RelayedEvents",
    "RemoveSessionRequest",
    "RemoveSessionResponse",
    "ReportSessionsRequest",
    "ReportSessionsResponse",
    "ResumeEntry",
    "RouteRequest",
    "RouteResponse",
    "RouterService",
    "RouterServiceServicer",
    "RouterServiceStub",
    "RunOutcome",
    "RunRequest",
    "RunResponse",
    "Session",
    "SessionService",
    "SessionServiceServicer",
    "SessionServiceStub",
    "StartTurnRequest",
    "StartTurnResponse",
    "SubscribeTurnRequest",
    "TokenUsage",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
    "Turn",
    "TurnPolicy",
    "TurnRequest",
    "TurnState",
    "UnregisterRequest",
    "UnregisterResponse",
    "UploadChatRequest",
    "WorkerService",
    "WorkerServiceServicer",
    "WorkerServiceStub",
    "add_ChatUploadServiceServicer_to_server",
    "add_CompatServiceServicer_to_server",
    "add_EventStreamServiceServicer_to_server",
    "add_RouterServiceServicer_to_server",
    "add_SessionServiceServicer_to_server",
    "add_WorkerServiceServicer_to_server",
    "chat_upload_pb2",
    "chat_upload_pb2_grpc",
    "compat_service_pb2",
    "compat_service_pb2_grpc",
    "event_pb2",
    "event_pb2_grpc",
    "event_stream_pb2",
    "event_stream_pb2_grpc",
    "message_pb2",
    "message_pb2_grpc",
    "router_service_pb2",
    "router_service_pb2_grpc",
    "session_service_pb2",
    "session_service_pb2_grpc",
    "worker_service_pb2",
    "worker_service_pb2_grpc",
]
