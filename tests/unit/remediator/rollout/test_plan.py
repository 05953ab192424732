"""A rollout's plan (remediator/rollout/plan.py): the order, the next members, a member's end, the end state."""

from __future__ import annotations

from dataclasses import replace

from llm_health.remediator import action as act
from llm_health.remediator.rollout import plan
from llm_health.remediator.store import (
    Action,
    CommandRow,
    Incident,
    IncidentState,
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
)

M = MemberStep
R = Rollout(id=7, state=RolloutState.RUNNING, argv=("deploy",), canary=1, per_host=1, soak=60, gate={}, by="ops",
            reason="r", created_at=0, updated_at=0)


def member(name: str, host: str, position: int, step: MemberStep = M.PENDING, canary: bool = False) -> RolloutMember:
    return RolloutMember(rollout_id=7, backend=name, host=host, position=position, canary=canary, step=step,
                         argv=("deploy", name), previous=None)


def fleet(*steps: MemberStep) -> list[RolloutMember]:
    names = [("a1", "n1"), ("b1", "n2"), ("a2", "n1"), ("b2", "n2")]
    return [member(n, h, i, s, canary=i == 0) for i, ((n, h), s) in enumerate(zip(names, steps, strict=True))]


def test_order_takes_canaries_one_per_host_then_host_by_host() -> None:
    c = [plan.Candidate(n, h) for n, h in (("b2", "n2"), ("a1", "n1"), ("b1", "n2"), ("a2", "n1"), ("x", ""))]
    got = [(m.backend, canary) for m, canary in plan.order(c, 2)]
    assert got == [("x", True), ("a1", True), ("a2", False), ("b1", False), ("b2", False)]
    assert [m.backend for m, canary in plan.order(c, 0) if canary] == []


def test_the_canary_goes_alone_then_one_per_host_above_the_floor() -> None:
    ready = ["a1", "b1", "a2", "b2"]
    assert plan.choose(R, fleet(M.PENDING, M.PENDING, M.PENDING, M.PENDING), ready=ready, min_ready=2).start == ("a1",)
    waiting = plan.choose(R, fleet(M.SOAKING, M.PENDING, M.PENDING, M.PENDING), ready=ready, min_ready=2)
    assert waiting.start == () and "waiting for the canary: a1 soaking" in waiting.note
    after = plan.choose(R, fleet(M.DONE, M.PENDING, M.PENDING, M.PENDING), ready=ready, min_ready=2)
    assert after.start == ("b1", "a2")                       # one per host, two stay READY
    floor = plan.choose(R, fleet(M.DONE, M.PENDING, M.PENDING, M.PENDING), ready=ready, min_ready=3)
    assert floor.start == ("b1",) and "min_ready 3" in floor.note
    busy = plan.choose(R, fleet(M.DONE, M.RESTARTING, M.PENDING, M.PENDING), ready=["a1", "a2", "b2"], min_ready=1)
    assert busy.start == ("a2",) and "b2 waits for its host n2" in busy.note


def test_a_down_member_costs_no_capacity() -> None:
    got = plan.choose(R, fleet(M.DONE, M.PENDING, M.PENDING, M.PENDING), ready=["a1", "a2"], min_ready=2)
    assert got.start == ("b1",)                              # b1 is not READY: taking it costs nothing
    assert "a2 waits" in got.note


def test_nothing_starts_blocked_paused_or_rolling_back() -> None:
    members = fleet(M.PENDING, M.PENDING, M.PENDING, M.PENDING)
    blocked = plan.choose(R, members, ready=["a1", "b1", "a2", "b2"], min_ready=0, blocked="the breaker is open")
    assert blocked.start == () and "the breaker is open" in blocked.note
    for state in (RolloutState.PAUSED, RolloutState.ROLLING_BACK):
        assert plan.choose(replace(R, state=state), members, ready=["a1"], min_ready=0).start == ()


def incident(state: IncidentState, close_reason: str = "") -> Incident:
    return Incident(id=3, backend="a1", state=state, opened_at=0, updated_at=0, close_reason=close_reason)


def action(result: str | None, started_at: float = 10.0) -> Action:
    return Action(id=1, incident_id=3, backend="a1", argv="deploy", holder="h", started_at=started_at, result=result)


def test_a_restart_ends_ok_only_when_recovered_after_an_action_that_exited_0() -> None:
    assert plan.restart_end(incident(IncidentState.CLOSED, "recovered"), action(act.OK))[0] == plan.End.OK
    end, why = plan.restart_end(incident(IncidentState.CLOSED, "resolved"), action(None))
    assert end == plan.End.FAILED and "closed as resolved" in why
    assert plan.restart_end(incident(IncidentState.NEEDS_ACK), action(act.TIMEOUT))[0] == plan.End.FAILED
    assert plan.restart_end(incident(IncidentState.WARMING), action(act.OK))[0] == plan.End.WAITING
    assert plan.restart_end(None, None)[0] == plan.End.FAILED


def test_a_failed_action_fails_at_once_but_an_older_one_does_not() -> None:
    assert plan.restart_end(incident(IncidentState.OPEN), action(act.FAILED, 10), since=5)[0] == plan.End.FAILED
    assert plan.restart_end(incident(IncidentState.OPEN), action(act.FAILED, 1), since=5)[0] == plan.End.WAITING


def test_applied_means_this_rollouts_command_is_stored() -> None:
    m = member("a1", "n1", 0)
    assert plan.applied(m, {"a1": CommandRow("a1", ("deploy", "a1"), 1.0, 7)})
    assert not plan.applied(m, {"a1": CommandRow("a1", ("deploy", "a1"), 1.0, 6)})
    assert not plan.applied(m, {})


def test_the_end_states() -> None:
    assert plan.finished(R, fleet(M.DONE, M.DONE, M.DONE, M.DONE))[0] == RolloutState.SUCCEEDED  # type: ignore[index]
    assert plan.finished(R, fleet(M.DONE, M.DONE, M.DONE, M.PENDING)) is None
    back = replace(R, state=RolloutState.ROLLING_BACK)
    assert plan.finished(back, fleet(M.ROLLED_BACK, M.PENDING, M.PENDING, M.PENDING))[0] == RolloutState.ROLLED_BACK  # type: ignore[index]
    assert plan.finished(back, fleet(M.ROLLING_BACK, M.PENDING, M.PENDING, M.PENDING)) is None
    end = plan.finished(back, fleet(M.ROLLBACK_FAILED, M.ROLLED_BACK, M.PENDING, M.PENDING))
    assert end is not None and end[0] == RolloutState.FAILED and "needs a person" in end[1]


def test_a_restart_called_off_before_it_began_changed_nothing() -> None:
    off = replace(incident(IncidentState.CLOSED, "called off: rollout 7 is rolling_back"), id=3)
    assert plan.restart_end(off, None, since=5)[0] == plan.End.CALLED_OFF
    assert plan.restart_end(off, action(act.OK, 1), since=5)[0] == plan.End.CALLED_OFF    # an older action
    assert plan.restart_end(off, action(act.OK, 10), since=5)[0] == plan.End.FAILED       # one of its own ran


def test_a_soak_advances_on_the_monotonic_clock_of_the_process_that_measures_it() -> None:
    assert plan.soaked(30.0, 29.5, 0.5) == 30.0                 # wall and monotonic agree
    assert plan.soaked(630.0, 31.5, 0.5) == 32.0                # the wall clock stepped: monotonic holds
    assert plan.soaked(600.0, 20.0, 580.0) == 600.0             # a new worker goes on from the stored start
    assert plan.soaked(-5.0, 10.0, -15.0) == 0.0                # a clock behind: no soak yet
