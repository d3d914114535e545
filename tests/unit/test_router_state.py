"""RouterState: membership, expiry and session ownership, on a fake clock."""

from __future__ import annotations

import pytest

from turnmesh.router.state import MemberSpec, Role, RouterState
from turnmesh.runtime.errors import NotFound, Unavailable

TIMEOUT = 3.0


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state(clock: FakeClock) -> RouterState:
    return RouterState(TIMEOUT, clock=clock, wall_clock=lambda: 1_700_000_000.0)


def server(member_id: str, *, accepting: bool = True, shared: bool = True) -> MemberSpec:
    """A server; by default one whose sessions can move (a shared store)."""
    return MemberSpec(
        member_id,
        Role.SERVER,
        f"{member_id}.local:50051",
        accepting=accepting,
        shared_store=shared,
    )


def worker(member_id: str, agent: str) -> MemberSpec:
    return MemberSpec(member_id, Role.WORKER, f"{member_id}.local:50052", agent_name=agent)


def owners(state: RouterState, sessions: list[str]) -> list[str]:
    return [state.route(s)[0].member_id for s in sessions]


def test_round_robin_over_two_servers(state: RouterState) -> None:
    state.register(server("s-b"))
    state.register(server("s-a"))
    # Stable order by id, whatever the registration order.
    assert owners(state, ["1", "2", "3", "4"]) == ["s-a", "s-b", "s-a", "s-b"]


def test_round_robin_over_three_servers(state: RouterState) -> None:
    for member_id in ("s-c", "s-a", "s-b"):
        state.register(server(member_id))
    assert owners(state, [str(i) for i in range(6)]) == ["s-a", "s-b", "s-c"] * 2


def test_round_robin_continues_after_a_join(state: RouterState) -> None:
    state.register(server("s-a"))
    state.register(server("s-c"))
    assert owners(state, ["1"]) == ["s-a"]
    state.register(server("s-b"))
    assert owners(state, ["2", "3", "4"]) == ["s-b", "s-c", "s-a"]


def test_route_is_sticky(state: RouterState) -> None:
    state.register(server("s-a"))
    state.register(server("s-b"))
    first, assigned = state.route("sess")
    assert assigned
    for _ in range(3):
        again, assigned = state.route("sess")
        assert (again.member_id, assigned) == (first.member_id, False)


def test_member_expires_after_timeout_and_its_sessions_move(
    state: RouterState, clock: FakeClock
) -> None:
    state.register(server("s-a"))
    state.register(server("s-b"))
    assert owners(state, ["x", "y"]) == ["s-a", "s-b"]

    clock.advance(2.0)
    assert state.heartbeat("s-b", 0, True)
    clock.advance(TIMEOUT)  # s-a silent for 5 s, s-b for 3 s: exactly the timeout
    assert state.expire() == ["s-a"]
    assert state.get("s-a") is None

    owner, assigned = state.route("x")
    assert (owner.member_id, assigned) == ("s-b", True)
    owner, assigned = state.route("y")
    assert (owner.member_id, assigned) == ("s-b", False)


def test_heartbeat_keeps_member_alive(state: RouterState, clock: FakeClock) -> None:
    state.register(server("s-a"))
    for _ in range(5):
        clock.advance(TIMEOUT - 0.5)
        assert state.heartbeat("s-a", 2, True)
    assert state.expire() == []
    record = state.get("s-a")
    assert record is not None
    assert record.inflight_turns == 2


def test_heartbeat_after_timeout_reports_unknown(state: RouterState, clock: FakeClock) -> None:
    state.register(server("s-a"))
    assert not state.heartbeat("nobody", 0, True)
    clock.advance(TIMEOUT + 0.1)
    assert not state.heartbeat("s-a", 0, True)


def test_reregistering_after_a_drop_keeps_unclaimed_sessions(
    state: RouterState, clock: FakeClock
) -> None:
    state.register(server("s-a"))
    state.route("mine")
    clock.advance(TIMEOUT + 1)
    assert state.expire() == ["s-a"]
    state.register(server("s-a"))
    assert state.route("mine")[1] is False


def test_sessions_of_a_server_with_its_own_store_wait_for_it(
    state: RouterState, clock: FakeClock
) -> None:
    """Memory or SQLite: another server does not have the session, so it is
    never reassigned while its owner is away; the owner has it back."""
    state.register(server("s-a", shared=False))
    state.register(server("s-b", shared=False))
    assert owners(state, ["mine"]) == ["s-a"]
    clock.advance(TIMEOUT - 1)
    state.heartbeat("s-b", 0, True)
    clock.advance(2)
    assert state.expire() == ["s-a"]
    for _ in range(3):
        with pytest.raises(Unavailable, match="unreachable"):
            state.route("mine")
    with pytest.raises(Unavailable, match="unreachable"):
        state.route("mine", ["s-a"])
    assert state.owner_of("mine") == "s-a"
    state.register(server("s-a", shared=False))
    assert state.route("mine")[0].member_id == "s-a"


def test_reported_sessions_route_to_the_reporter(state: RouterState) -> None:
    state.register(server("s-a"))
    state.register(server("s-b"))
    assert owners(state, ["x", "y"]) == ["s-a", "s-b"]
    state.report_sessions("s-b", ["x", "z"])  # its store's lease says so
    assert owners(state, ["x", "y", "z"]) == ["s-b", "s-b", "s-b"]
    with pytest.raises(NotFound):
        state.report_sessions("ghost", ["x"])
    state.register(worker("w-1", "demo"))
    with pytest.raises(NotFound):
        state.report_sessions("w-1", ["x"])
    assert state.owner_of("x") == "s-b"


def test_orphaned_ownership_is_forgotten_after_ttl(state: RouterState, clock: FakeClock) -> None:
    state.register(server("s-a"))
    state.route("mine")
    state.unregister("s-a")
    assert state.owner_of("mine") == "s-a"
    clock.advance(10 * TIMEOUT + 1)
    state.expire()
    assert state.owner_of("mine") is None


def test_register_same_id_refreshes(state: RouterState, clock: FakeClock) -> None:
    first = state.register(server("s-a"))
    clock.advance(1)
    second = state.register(MemberSpec("s-a", Role.SERVER, "elsewhere:1", inflight_turns=4))
    assert second.registered_at == first.registered_at
    assert second.address == "elsewhere:1"
    assert second.last_seen == first.last_seen + 1
    assert [m.member_id for m in state.list_members()] == ["s-a"]


def test_unreachable_hint_drops_server_at_once(state: RouterState) -> None:
    state.register(server("s-a"))
    state.register(server("s-b"))
    assert owners(state, ["x"]) == ["s-a"]
    owner, assigned = state.route("x", unreachable=["s-a"])
    assert (owner.member_id, assigned) == ("s-b", True)
    assert state.get("s-a") is None


def test_unreachable_hint_ignores_workers_and_unknown_ids(state: RouterState) -> None:
    state.register(server("s-a"))
    state.register(worker("w-1", "demo"))
    state.route("x", unreachable=["w-1", "ghost"])
    assert state.get("w-1") is not None


def test_draining_server_keeps_its_sessions_but_gets_no_new_ones(state: RouterState) -> None:
    state.register(server("s-a"))
    state.register(server("s-b"))
    assert owners(state, ["x", "y"]) == ["s-a", "s-b"]
    assert state.heartbeat("s-a", 1, accepting=False)
    assert state.route("x") == (state.get("s-a"), False)
    assert owners(state, ["1", "2", "3"]) == ["s-b", "s-b", "s-b"]


def test_non_accepting_registration_gets_no_sessions(state: RouterState) -> None:
    state.register(server("s-a", accepting=False))
    with pytest.raises(Unavailable, match="no live session server"):
        state.route("x")


def test_no_server_is_unavailable(state: RouterState) -> None:
    with pytest.raises(Unavailable, match="no live session server"):
        state.route("x")
    state.register(worker("w-1", "demo"))  # workers never own sessions
    with pytest.raises(Unavailable):
        state.route("x")


def test_all_servers_expired_is_unavailable(state: RouterState, clock: FakeClock) -> None:
    state.register(server("s-a"))
    state.route("x")
    clock.advance(TIMEOUT + 1)
    with pytest.raises(Unavailable):
        state.route("x")


def test_unregister_moves_sessions_on_next_route(state: RouterState) -> None:
    state.register(server("s-a"))
    state.register(server("s-b"))
    assert owners(state, ["x"]) == ["s-a"]
    assert state.unregister("s-a")
    assert not state.unregister("s-a")
    assert state.route("x")[0].member_id == "s-b"


def test_remove_session_forgets_owner(state: RouterState) -> None:
    state.register(server("s-a"))
    state.register(server("s-b"))
    state.route("x")
    assert state.remove_session("x")
    assert not state.remove_session("x")
    owner, assigned = state.route("x")
    assert (owner.member_id, assigned) == ("s-b", True)


def test_list_members_filters_by_role_and_agent(state: RouterState, clock: FakeClock) -> None:
    state.register(server("s-a"))
    state.register(worker("w-2", "assistant"))
    state.register(worker("w-1", "demo"))
    state.register(worker("w-3", "demo"))

    def ids(role: Role | None = None, agent: str | None = None) -> list[str]:
        return [m.member_id for m in state.list_members(role, agent)]

    assert ids() == ["s-a", "w-1", "w-2", "w-3"]
    assert ids(Role.SERVER) == ["s-a"]
    assert ids(Role.WORKER) == ["w-1", "w-2", "w-3"]
    assert ids(Role.WORKER, "demo") == ["w-1", "w-3"]
    assert ids(agent="assistant") == ["w-2"]
    assert ids(Role.WORKER, "unknown") == []

    clock.advance(TIMEOUT - 1)
    state.heartbeat("w-3", 0, True)
    clock.advance(2)
    assert ids() == ["w-3"]  # list_members expires first


def test_the_member_list_is_learning_while_members_rejoin(
    state: RouterState, clock: FakeClock
) -> None:
    assert not state.learning()
    assert state.learning("server-not-yet-back")  # a caller it does not know yet
    state.register(server("s-a"), rejoining=True)  # a restart: others will follow
    assert state.learning()
    for _ in range(2):
        clock.advance(TIMEOUT / 2 + 0.1)
        assert state.heartbeat("s-a", 0, True)
    assert not state.learning()
    assert not state.learning("s-a")


def test_a_live_server_replaced_at_its_address_is_dropped_at_once(state: RouterState) -> None:
    """Restarted on its port (by `turnmesh up`) before it missed a heartbeat:
    the old process is dead for sure, and new sessions go to the new one."""
    state.register(server("s-old", shared=False))
    state.route("mine")
    state.register(MemberSpec("s-new", Role.SERVER, "s-old.local:50051"))
    assert [m.member_id for m in state.list_members(Role.SERVER)] == ["s-new"]
    assert state.owner_of("mine") is None
    assert state.route("fresh")[0].member_id == "s-new"


def test_a_store_of_its_own_does_not_take_back_a_session_made_again_elsewhere(
    state: RouterState, clock: FakeClock
) -> None:
    state.register(server("s-a", shared=False))
    state.register(server("s-b", shared=False))
    state.report_sessions("s-b", ["x"])
    state.report_sessions("s-a", ["x"])  # s-b is live and owns it: it stays there
    assert state.owner_of("x") == "s-b"
    state.register(server("s-c"))  # a shared store: its lease proves it
    state.report_sessions("s-c", ["x"])
    assert state.owner_of("x") == "s-c"
