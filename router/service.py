"""turnmesh.v1.RouterService over RouterState: validation and proto mapping.

Handlers raise turnmesh errors; the ErrorMappingInterceptor turns them into
statuses. Membership changes are logged by RouterState, the one place that
also sees the drops that happen inside Route, Heartbeat and ListMembers.
"""

from __future__ import annotations

from datetime import timedelta

from google.protobuf import duration_pb2, timestamp_pb2

from turnmesh.router.state import MemberRecord, MemberSpec, Role, RouterState
from turnmesh.runtime.errors import FieldViolation, InvalidArgument, UnknownMember
from turnmesh.runtime.handlers import ServicerContext
from turnmesh.runtime.principals import SCOPED_ID_PATTERN
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import router_service_pb2_grpc

MAX_ID_LENGTH = 256
MAX_ADDRESS_LENGTH = 1024
MAX_UNREACHABLE = 64
MAX_REPORTED_SESSIONS = 10_000

_ROLES: dict[int, Role] = {role.value: role for role in Role}


class RouterServicer(router_service_pb2_grpc.RouterServiceServicer):
    def __init__(self, state: RouterState, *, heartbeat_interval: float) -> None:
        if not 0 < heartbeat_interval < state.heartbeat_timeout:
            raise ValueError("heartbeat_interval must be positive and below the timeout")
        self.state = state
        self._interval = _duration(heartbeat_interval)
        self._timeout = _duration(state.heartbeat_timeout)

    async def Register(
        self, request: rpb.RegisterRequest, context: ServicerContext
    ) -> rpb.RegisterResponse:
        m = request.member
        violations = _check_member_id("member.member_id", m.member_id)
        if m.role not in _ROLES:
            violations.append(FieldViolation("member.role", "must be SERVER or WORKER"))
        elif m.role == rpb.MEMBER_ROLE_WORKER and not m.agent_name:
            violations.append(FieldViolation("member.agent_name", "required for workers"))
        violations += _check_address("member.address", m.address)
        if len(m.agent_name) > MAX_ID_LENGTH:
            violations.append(FieldViolation("member.agent_name", "too long"))
        if m.inflight_turns < 0:
            violations.append(FieldViolation("member.inflight_turns", "must not be negative"))
        _raise_if(violations)
        record = self.state.register(
            MemberSpec(
                member_id=m.member_id,
                role=_ROLES[m.role],
                address=m.address,
                agent_name=m.agent_name,
                inflight_turns=m.inflight_turns,
                accepting=m.accepting,
                shared_store=m.shared_store,
            ),
            rejoining=request.rejoining,
        )
        return rpb.RegisterResponse(
            member=to_proto(record),
            heartbeat_interval=self._interval,
            heartbeat_timeout=self._timeout,
        )

    async def Heartbeat(
        self, request: rpb.HeartbeatRequest, context: ServicerContext
    ) -> rpb.HeartbeatResponse:
        violations = _check_member_id("member_id", request.member_id)
        if request.inflight_turns < 0:
            violations.append(FieldViolation("inflight_turns", "must not be negative"))
        _raise_if(violations)
        if not self.state.heartbeat(request.member_id, request.inflight_turns, request.accepting):
            raise UnknownMember("unknown member; register again")
        return rpb.HeartbeatResponse()

    async def Unregister(
        self, request: rpb.UnregisterRequest, context: ServicerContext
    ) -> rpb.UnregisterResponse:
        _raise_if(_check_member_id("member_id", request.member_id))
        # Idempotent: a member leaving after it was dropped is not an error.
        self.state.unregister(request.member_id)
        return rpb.UnregisterResponse()

    async def Route(self, request: rpb.RouteRequest, context: ServicerContext) -> rpb.RouteResponse:
        violations = _check_session_id("session_id", request.session_id)
        if len(request.unreachable_member_ids) > MAX_UNREACHABLE:
            violations.append(
                FieldViolation("unreachable_member_ids", f"at most {MAX_UNREACHABLE}")
            )
        _raise_if(violations)
        owner, assigned = self.state.route(
            request.session_id,
            list(request.unreachable_member_ids),
            lookup_only=request.lookup_only,
            caller=request.caller_member_id,
        )
        return rpb.RouteResponse(owner=to_proto(owner), assigned=assigned)

    async def RemoveSession(
        self, request: rpb.RemoveSessionRequest, context: ServicerContext
    ) -> rpb.RemoveSessionResponse:
        _raise_if(_check_session_id("session_id", request.session_id))
        self.state.remove_session(request.session_id)  # idempotent
        return rpb.RemoveSessionResponse()

    async def ReportSessions(
        self, request: rpb.ReportSessionsRequest, context: ServicerContext
    ) -> rpb.ReportSessionsResponse:
        violations = _check_member_id("member_id", request.member_id)
        if len(request.session_ids) > MAX_REPORTED_SESSIONS:
            violations.append(
                FieldViolation("session_ids", f"at most {MAX_REPORTED_SESSIONS} a call")
            )
        else:
            for index, session_id in enumerate(request.session_ids):
                violations += _check_session_id(f"session_ids[{index}]", session_id)
        _raise_if(violations[:20])
        self.state.report_sessions(request.member_id, request.session_ids)
        return rpb.ReportSessionsResponse()

    async def ListMembers(
        self, request: rpb.ListMembersRequest, context: ServicerContext
    ) -> rpb.ListMembersResponse:
        role: Role | None = None
        if request.role != rpb.MEMBER_ROLE_UNSPECIFIED:
            if request.role not in _ROLES:
                raise InvalidArgument([FieldViolation("role", "unknown role")])
            role = _ROLES[request.role]
        members = self.state.list_members(role, request.agent_name or None)
        return rpb.ListMembersResponse(
            members=[to_proto(m) for m in members],
            learning=self.state.learning(request.caller_member_id),
        )


def to_proto(record: MemberRecord) -> rpb.Member:
    return rpb.Member(
        member_id=record.member_id,
        role=rpb.MemberRole.ValueType(record.role.value),
        address=record.address,
        agent_name=record.agent_name,
        inflight_turns=record.inflight_turns,
        registered_at=_timestamp(record.registered_at),
        last_heartbeat=_timestamp(record.last_heartbeat),
        accepting=record.accepting,
        shared_store=record.shared_store,
    )


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(round(seconds * 1e9))
    return ts


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=seconds))
    return d


def _check_member_id(field: str, value: str) -> list[FieldViolation]:
    if not value:
        return [FieldViolation(field, "required")]
    if len(value) > MAX_ID_LENGTH:
        return [FieldViolation(field, f"at most {MAX_ID_LENGTH} characters")]
    return []


def _check_session_id(field: str, value: str) -> list[FieldViolation]:
    if not value:
        return [FieldViolation(field, "required")]
    if not SCOPED_ID_PATTERN.fullmatch(value):
        return [FieldViolation(field, "must be a session id, scoped (PRINCIPAL/ID) or not")]
    return []


def _check_address(field: str, value: str) -> list[FieldViolation]:
    if not value:
        return [FieldViolation(field, "required")]
    if len(value) > MAX_ADDRESS_LENGTH:
        return [FieldViolation(field, "too long")]
    host, sep, port = value.rpartition(":")
    # Peers dial this address, so catch a missing port here, not at first use.
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return [FieldViolation(field, "must be host:port")]
    return []


def _raise_if(violations: list[FieldViolation]) -> None:
    if violations:
        raise InvalidArgument(violations)
