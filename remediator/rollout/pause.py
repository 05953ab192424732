"""A paused rollout: no member starts. A member whose restart with the new command was asked for and has
not begun (its incident open, or draining: held by a gate of the authority, the breaker, a floor) goes back
to pending: its restart is called off (a drain ends, the backend serves again) and asked for again when the
rollout is resumed. What already runs (restarting, warming up, a soaking canary) finishes.

The claim checks the pause too, in its own transaction (restart/requested.py `paused_rollout`), so a claim
between the pause and this look waits as well."""

from __future__ import annotations

from collections.abc import Sequence

from llm_health.remediator.restart.requested import call_off
from llm_health.remediator.rollout import plan
from llm_health.remediator.rollout.kinds import Kind
from llm_health.remediator.store import (
    IncidentState,
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
    Transaction,
)

IS = IncidentState
M = MemberStep


def hold(tx: Transaction, r: Rollout, members: Sequence[RolloutMember], now: float) -> list[str]:
    """Put back to pending every member of the paused rollout `r` whose restart has not begun; the backends
    whose silences (a drain's) are to end after the transaction."""
    if r.state != RolloutState.PAUSED:
        return []
    commands = tx.commands()
    held: list[str] = []
    for m in members:
        if m.step != M.RESTARTING or m.incident_id is None or plan.applied(m, commands):
            continue
        own = tx.incident(m.incident_id)
        if (own is None or own.state not in (IS.OPEN, IS.DRAINING) or own.command is None
                or own.command.rollout_id != r.id):
            continue
        why = f"{plan.CALLED_OFF}: rollout {r.id} paused before this restart with the new command began"
        call_off(tx, own, m.backend, why, now, Kind.CALLED_OFF, rollout_id=r.id, by=r.by)
        tx.update_member(r.id, m.backend, step=M.PENDING, incident_id=None, changed_at=None,
                         note="paused before its restart began: asked for again when the rollout is resumed")
        held.append(m.backend)
    return held
