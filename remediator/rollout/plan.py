"""A rollout's plan: which member goes next, what a member's restart came to, and when a rollout ends.

Pure: rows and facts in, decisions out; no store, no clock of its own (remediator/rollout/procedure.py
reads the facts in one transaction and writes what these say in the same one).

The order (`order`): the canaries first (the first `canary` backends, one per host in host order, so
a canary failure on one host is never hidden by a rollout of the whole host), then host by host. A
member goes next (`choose`) only while the rollout RUNS, nothing blocks it (the breaker open, an incident
of another cause on one of the rollout's hosts), every canary has passed its soak (the others wait for
them), no other member of its host is being restarted (`per_host`, 1: the authority's per-host mutex), and
at least `min_ready` other backends stay READY after it is taken out (no surge: the fleet is a fixed pool
of GPUs, a member is drained, stopped and started in place). The authority re-checks its own gates in the
claim (host mutex, floor, budget, breaker) before anything runs: this plan only asks.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llm_health.remediator import action as act
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

IS = IncidentState
M = MemberStep
RS = RolloutState


@dataclass(frozen=True)
class Candidate:
    backend: str
    host: str


def order(candidates: Sequence[Candidate], canary: int) -> list[tuple[Candidate, bool]]:
    """(member, is_canary) in the rollout's order: `canary` canaries taken one per host round-robin (hosts
    sorted), then every other member host by host (hosts sorted, names sorted within a host)."""
    by_host: dict[str, list[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: (c.host, c.backend)):
        by_host.setdefault(c.host or f"\0{c.backend}", []).append(c)
    canaries: list[Candidate] = []
    queues = [list(v) for _, v in sorted(by_host.items())]
    while len(canaries) < canary and any(queues):
        for q in queues:
            if q and len(canaries) < canary:
                canaries.append(q.pop(0))
    rest = [c for q in queues for c in q]
    return [(c, True) for c in canaries] + [(c, False) for c in rest]


class End(enum.StrEnum):
    WAITING = "waiting"
    OK = "ok"
    FAILED = "failed"
    CALLED_OFF = "called_off"      # closed before it began (its rollout no longer ran): nothing changed


CALLED_OFF = "called off"          # how the close reason of a restart that never began starts


def restart_end(inc: Incident | None, last: Action | None, since: float | None = None) -> tuple[End, str]:
    """What a member's restart (its incident) came to: OK only when the incident closed `recovered` after
    an action that exited 0 (the warm-up gate passed: /health, /v1/models, a healthy verification). An
    action asked for at `since` or later that failed fails the member at once: the authority would retry it
    after its backoff, but a new command that does not start is the rollout's failure, not a stall's."""
    if inc is None:
        return End.FAILED, "its restart's incident is gone"
    if (inc.state == IS.OPEN and last is not None and last.result not in (None, act.OK)
            and (since is None or last.started_at >= since)):
        return End.FAILED, f"restart action {last.result}" + (f" (exit {last.exit_code})" if last.exit_code else "")
    if inc.state == IS.CLOSED:
        if inc.close_reason == "recovered" and last is not None and last.result == act.OK:
            return End.OK, "restarted and warm"
        if inc.close_reason.startswith(CALLED_OFF) and (last is None or (since is not None and last.started_at < since)):
            return End.CALLED_OFF, f"never changed: incident {inc.id} {inc.close_reason}"
        got = f"action {last.result}" if last is not None and last.result else "no action ran"
        return End.FAILED, f"incident {inc.id} closed as {inc.close_reason or 'closed'} ({got})"
    if inc.state == IS.NEEDS_ACK:
        return End.FAILED, f"incident {inc.id} needs a person ({inc.last_decision or 'outcome unknown'})"
    if inc.state == IS.OBSERVED:
        return End.FAILED, f"incident {inc.id} was parked ({inc.last_decision or 'observed'}): no restart"
    return End.WAITING, f"incident {inc.id} {inc.state.value}" + (f": {inc.last_note}" if inc.last_note else "")


def applied(member: RolloutMember, commands: Mapping[str, CommandRow]) -> bool:
    """The member's backend runs (or was restarted with) this rollout's new command."""
    row = commands.get(member.backend)
    return row is not None and row.rollout_id == member.rollout_id and row.argv == member.argv


@dataclass(frozen=True)
class Choice:
    start: tuple[str, ...]         # members whose restart with the new command is asked for now
    note: str                      # why nothing (more) starts, or what starts


IN_PROGRESS = frozenset({M.RESTARTING, M.ROLLING_BACK})


def choose(rollout: Rollout, members: Sequence[RolloutMember], *, ready: Iterable[str], min_ready: int,
           blocked: str = "") -> Choice:
    """The members to restart next (see the module's doc)."""
    if rollout.state != RS.RUNNING:
        return Choice((), f"rollout {rollout.state.value}: nothing new starts")
    pending = [m for m in members if m.step == M.PENDING]
    if not pending:
        return Choice((), "every member started")
    if blocked:
        return Choice((), f"waiting: {blocked}")
    canaries_left = [m for m in members if m.canary and m.step != M.DONE]
    if canaries_left and not any(m.canary for m in pending):
        return Choice((), "waiting for the canary: " + ", ".join(f"{m.backend} {m.step.value}" for m in canaries_left))
    wave = [m for m in pending if m.canary] if canaries_left else pending
    busy_hosts = {m.host or m.backend for m in members if m.step in IN_PROGRESS}
    up = set(ready)
    start: list[str] = []
    why = ""
    for m in wave:
        host = m.host or m.backend
        if host in busy_hosts:
            why = why or f"{m.backend} waits for its host {m.host}"
            continue
        if m.backend in up:
            if len(up) - 1 < min_ready:
                why = why or (f"{m.backend} waits: only {len(up) - 1} other backend(s) would stay READY, "
                              f"min_ready {min_ready}")
                break
            up.discard(m.backend)
        start.append(m.backend)
        busy_hosts.add(host)
    if start:
        return Choice(tuple(start), "restarting " + ", ".join(start) + (f" ({why})" if why else ""))
    return Choice((), why or "waiting")


def finished(rollout: Rollout, members: Sequence[RolloutMember]) -> tuple[RolloutState, str] | None:
    """The rollout's end state once it has one (None: not yet)."""
    if rollout.state in (RS.RUNNING, RS.PAUSED):
        if members and all(m.step == M.DONE for m in members):
            return RS.SUCCEEDED, f"every member ({len(members)}) runs the new command"
        return None
    if rollout.state != RS.ROLLING_BACK:
        return None
    if any(m.step not in (M.PENDING, M.ROLLED_BACK, M.ROLLBACK_FAILED) for m in members):
        return None
    failed = [m.backend for m in members if m.step == M.ROLLBACK_FAILED]
    if failed:
        return RS.FAILED, (f"rollback incomplete: {', '.join(failed)} did not come back with its previous command; "
                           "needs a person")
    back = [m.backend for m in members if m.step == M.ROLLED_BACK]
    return RS.ROLLED_BACK, ("rolled back: " + ", ".join(back) if back else "rolled back: nothing had changed")


def overdue(member: RolloutMember, now: float, limit: float) -> bool:
    """A member's restart that has not ended within `limit` seconds of being asked for."""
    return member.changed_at is not None and now - member.changed_at > limit


def soaked(elapsed: float, counted: float, elapsed_then: float) -> float:
    """How long a canary has soaked: `elapsed` by the wall clock since its stored start, but in this process
    never more than what the wall clock said when it first measured the soak (`elapsed_then`: a new worker
    or a new leader goes on from the stored start) plus what its own monotonic clock counted since
    (`counted`). A wall clock stepped forward during the soak cannot end it early."""
    return max(0.0, min(elapsed, counted + max(0.0, elapsed_then)))
