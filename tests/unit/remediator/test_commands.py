"""commands.plan(): what each operator command does in each operator state (the table in its doc)."""

from __future__ import annotations

import pytest

from llm_health.remediator.commands import Command, CommandFacts, Refusal, plan
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.store import AdminState, IncidentState

A, C, S = AdminState, Command, LifecycleState


def facts(admin: AdminState = A.IN_SERVICE, lifecycle: LifecycleState = S.READY, incident: IncidentState | None = None,
          ready_others: int = 2, min_ready: int = 1, force: bool = False) -> CommandFacts:
    return CommandFacts(admin, lifecycle, incident, ready_others, min_ready, force)


@pytest.mark.parametrize(("command", "admin", "target", "refused"), [
    (C.DRAIN, A.IN_SERVICE, A.DRAINED, None),
    (C.DRAIN, A.DRAINED, None, None),
    (C.DRAIN, A.RETIRED, None, Refusal.CONFLICT),
    (C.UNDRAIN, A.IN_SERVICE, None, None),
    (C.UNDRAIN, A.DRAINED, A.IN_SERVICE, None),
    (C.UNDRAIN, A.RETIRED, None, Refusal.CONFLICT),
    (C.RETIRE, A.IN_SERVICE, A.RETIRED, None),
    (C.RETIRE, A.DRAINED, A.RETIRED, None),
    (C.RETIRE, A.RETIRED, None, None),
    (C.ACTIVATE, A.IN_SERVICE, None, None),
    (C.ACTIVATE, A.DRAINED, A.IN_SERVICE, None),
    (C.ACTIVATE, A.RETIRED, A.IN_SERVICE, None),
])
def test_the_table(command: Command, admin: AdminState, target: AdminState | None, refused: Refusal | None) -> None:
    p = plan(command, facts(admin))
    assert (p.target, p.refused) == (target, refused), p.reason
    assert p.changes == (target is not None and refused is None)
    assert not p.forced


@pytest.mark.parametrize("command", [C.DRAIN, C.RETIRE])
def test_taking_a_serving_backend_out_keeps_the_floor_unless_forced(command: Command) -> None:
    p = plan(command, facts(ready_others=0, min_ready=1))
    assert p.refused == Refusal.FLOOR and p.target is None
    assert "min_ready 1" in p.reason and "--force" in p.reason
    forced = plan(command, facts(ready_others=0, min_ready=1, force=True))
    assert forced.changes and forced.forced
    assert not plan(command, facts(ready_others=1, min_ready=1, force=True)).forced   # nothing was overridden


@pytest.mark.parametrize("lifecycle", [S.ERROR, S.INITIALIZING, S.STOPPED])
def test_a_backend_that_serves_nothing_costs_no_capacity(lifecycle: LifecycleState) -> None:
    assert plan(C.DRAIN, facts(lifecycle=lifecycle, ready_others=0)).changes
    assert plan(C.RETIRE, facts(lifecycle=lifecycle, ready_others=0)).changes


def test_retiring_a_drained_backend_needs_no_floor() -> None:
    assert plan(C.RETIRE, facts(admin=A.DRAINED, ready_others=0)).changes


@pytest.mark.parametrize("incident", [IncidentState.DRAINING, IncidentState.RESTARTING, IncidentState.WARMING])
def test_retire_waits_for_a_restart_under_way_unless_forced(incident: IncidentState) -> None:
    p = plan(C.RETIRE, facts(incident=incident))
    assert p.refused == Refusal.RESTARTING
    forced = plan(C.RETIRE, facts(incident=incident, force=True))
    assert forced.target == A.RETIRED and forced.forced and not forced.close_incident


@pytest.mark.parametrize("incident", [IncidentState.OPEN, IncidentState.OBSERVED, IncidentState.NEEDS_ACK])
def test_retire_closes_a_waiting_incident(incident: IncidentState) -> None:
    p = plan(C.RETIRE, facts(incident=incident))
    assert p.changes and p.close_incident


def test_drain_leaves_an_incident_alone() -> None:
    p = plan(C.DRAIN, facts(incident=IncidentState.OPEN))
    assert p.changes and not p.close_incident


def test_restart_is_asked_for_unless_it_cannot_be_carried_out() -> None:
    asked = plan(C.RESTART, facts())
    assert asked.request_restart and asked.changes and asked.target is None
    assert plan(C.RESTART, facts(admin=A.DRAINED)).request_restart          # drain, then restart: the upgrade
    assert plan(C.RESTART, facts(admin=A.RETIRED)).refused == Refusal.CONFLICT
    assert plan(C.RESTART, CommandFacts(A.IN_SERVICE, S.READY, None, 2, 1, restart_configured=False)).refused \
        == Refusal.NOT_CONFIGURED
    assert plan(C.RESTART, facts(incident=IncidentState.WARMING)).refused == Refusal.RESTARTING
    assert plan(C.RESTART, facts(incident=IncidentState.NEEDS_ACK)).request_restart   # a person decides: go
    assert plan(C.RESTART, facts(force=True)).forced


@pytest.mark.parametrize(("change", "says"), [("7", "rollout 7"), ("", "a rollout's rollback")])
def test_a_restart_by_hand_is_refused_while_a_rollouts_restart_with_another_command_waits(change: str,
                                                                                         says: str) -> None:
    f = CommandFacts(A.IN_SERVICE, S.READY, IncidentState.OPEN, 2, 1, force=True, command_change=change)
    p = plan(C.RESTART, f)
    assert p.refused == Refusal.CONFLICT and says in p.reason and not p.request_restart
    assert plan(C.RESTART, CommandFacts(A.IN_SERVICE, S.READY, IncidentState.OPEN, 2, 1)).request_restart


def test_retiring_a_member_of_an_active_rollout_that_is_not_done_is_refused_unless_forced() -> None:
    member = "rollout 3 (running; b2 pending)"
    p = plan(C.RETIRE, CommandFacts(A.IN_SERVICE, S.READY, None, 2, 1, rollout_member=member))
    assert p.refused == Refusal.CONFLICT and member in p.reason and "wait for the rollout" in p.reason
    forced = plan(C.RETIRE, CommandFacts(A.IN_SERVICE, S.READY, None, 2, 1, force=True, rollout_member=member))
    assert forced.refused is None and forced.target == A.RETIRED
    assert plan(C.DRAIN, CommandFacts(A.IN_SERVICE, S.READY, None, 2, 1, rollout_member=member)).target == A.DRAINED
