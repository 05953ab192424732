"""One look at one rollout: settle its members' restarts, judge soaking canaries, roll back or go on.

Level-based like the restart reconciler: a look re-reads the rollout, its members and the fleet from the
store and does what they call for; only the store's rows outlive a look (and, per process, when a canary was
first and last measured: a soak is counted on our monotonic clock, plan.soaked). Every decision is audited.

    1. settle (one transaction): a member whose restart ended moves on (a canary starts its soak, anyone
       else is done), failed or overdue -> the rollout rolls back;
    2. gate (I/O outside any transaction): each soaking canary measured every `interval` and at the soak's
       end; a failed check rolls back; at the soak's end the summary passes it (DONE) or fails it;
    3. act (one transaction): rolling back, every changed member gets its restart with its previous
       command (one not begun yet is called off); running, the next members get theirs (plan.choose);
       the end state once there is one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.gates import gate_states
from llm_health.remediator.restart.requested import call_off
from llm_health.remediator.restart.silences import unsilence_fenced
from llm_health.remediator.restart.warmup import WARMUP_TIMEOUT
from llm_health.remediator.rollout import plan
from llm_health.remediator.rollout.gate import Bounds, GateVerdict, Measurement, Summary, final, watch
from llm_health.remediator.rollout.kinds import Kind
from llm_health.remediator.rollout.pause import hold
from llm_health.remediator.rollout.queries import Prometheus, prometheus_url
from llm_health.remediator.store import (
    CHANGED_STEPS,
    CommandChange,
    Incident,
    IncidentState,
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
    Transaction,
)

M = MemberStep
RS = RolloutState
IS = IncidentState

class GateQueries(Protocol):
    """What the gate reads (queries.Prometheus; tests inject their own)."""

    def measure(self, canary: str) -> Measurement: ...
    def summary(self, canary: str, fleet: Sequence[str], window: float) -> Summary: ...


def member_timeout(ctx: Context) -> float:
    r = ctx.r
    return r.rollout.member_timeout or (r.drain_timeout + r.action_timeout + r.warmup_timeout + 300.0)


WAITS = "waits for incident"       # a member's note while another incident holds its backend


def requester(rollout: Rollout) -> str:
    """Who a member's restart is asked for by (incidents.requested_by, the audit log)."""
    return f"rollout {rollout.id} ({rollout.by or 'unknown'})"


class Procedure:
    def __init__(self, ctx: Context, gate: GateQueries | None = None) -> None:
        self.ctx = ctx
        self._gate = gate
        self._measured: dict[tuple[int, str], float] = {}      # (rollout, canary) -> monotonic
        self._soak_from: dict[tuple[int, str], tuple[float, float]] = {}   # -> first measured: mono, wall elapsed
        self._lock = threading.Lock()
        self._unsilence: set[str] = set()                        # called off in this look: silences to end

    @property
    def gate(self) -> GateQueries:
        if self._gate is None:
            ro = self.ctx.r.rollout
            # a summary is 8 queries; each one within query_timeout, all of them within the budget
            self._gate = Prometheus(prometheus_url(self.ctx.config), timeout=ro.query_timeout, budget=8 * ro.query_timeout)
        return self._gate

    def look(self, rollout_id: int) -> float | None:
        """One look; seconds until the next (None: the rollout is over)."""
        ctx = self.ctx
        with ctx.store.tx() as tx:
            r = tx.rollout(rollout_id)
            if r is None or not r.active or not ctx.holds_lease(tx):
                return None
            self._settle(tx, r, tx.rollout_members(rollout_id), ctx.clocks.wall())
        self._judge(rollout_id)
        with ctx.store.tx() as tx:
            r = tx.rollout(rollout_id)
            if r is None or not r.active or not ctx.holds_lease(tx):
                return None
            now = ctx.clocks.wall()
            end: tuple[RolloutState, str] | None = None
            members = tx.rollout_members(rollout_id)
            if r.state == RS.ROLLING_BACK:
                self._roll_back(tx, r, members, now)
            else:
                self._unsilence.update(hold(tx, r, members, now))     # paused: what has not begun waits
                self._go_on(tx, r, members, now)
            members = tx.rollout_members(rollout_id)
            end = plan.finished(r, members)
            if end is not None:
                state, why = end
                tx.move_rollout(r.id, now, state, why)
                kind = {RS.SUCCEEDED: Kind.SUCCEEDED, RS.ROLLED_BACK: Kind.ROLLED_BACK}.get(state, Kind.FAILED)
                tx.event(now, kind, "", reason=f"rollout {r.id} {state.value}: {why}", rollout_id=r.id, by=r.by)
        self._end_silences()
        if end is None:
            return max(ctx.r.poll_interval, 0.1)
        with self._lock:                                # the gate's timings of a rollout that is over
            for key in [k for k in (*self._measured, *self._soak_from) if k[0] == rollout_id]:
                self._measured.pop(key, None)
                self._soak_from.pop(key, None)
        return None

    def _end_silences(self) -> None:
        with self._lock:
            names, self._unsilence = self._unsilence, set()
        for name in sorted(names):
            unsilence_fenced(self.ctx, name)     # a holder deposed since expires none (the new one's among them)

    # -- 1. settle ---------------------------------------------------------------------------------------
    def _settle(self, tx: Transaction, r: Rollout, members: list[RolloutMember], now: float) -> None:
        limit = member_timeout(self.ctx)
        for m in members:
            if m.step not in (M.RESTARTING, M.ROLLING_BACK) or m.incident_id is None:
                continue
            inc = tx.incident(m.incident_id)
            end, why = plan.restart_end(inc, tx.latest_action(m.incident_id), m.changed_at)
            if end == plan.End.WAITING and plan.overdue(m, now, limit):
                end, why = plan.End.FAILED, f"not over {limit:g}s after it was asked for ({why})"
                if (m.step == M.ROLLING_BACK and inc is not None and inc.state in (IS.OPEN, IS.DRAINING)):
                    self._call_off(tx, r, m, inc, now)   # never runs after a person was told to repair it
            if end == plan.End.WAITING:
                if m.note != why:
                    tx.update_member(r.id, m.backend, note=why)
                continue
            if end == plan.End.CALLED_OFF:     # the claim's own check called it off: nothing ran
                tx.update_member(r.id, m.backend, step=M.ROLLED_BACK, changed_at=now, note=why)
                continue
            if m.step == M.ROLLING_BACK:
                step = M.ROLLED_BACK if end == plan.End.OK else M.ROLLBACK_FAILED
                tx.update_member(r.id, m.backend, step=step, changed_at=now, note=why)
                tx.event(now, Kind.ROLLED_BACK_MEMBER if end == plan.End.OK else Kind.MEMBER_FAILED, m.backend,
                         m.incident_id, reason=f"rollout {r.id}: {m.backend} "
                         f"{'back on its previous command' if end == plan.End.OK else 'rollback failed'}: {why}",
                         rollout_id=r.id, by=r.by)
            elif end == plan.End.OK and m.canary:
                tx.update_member(r.id, m.backend, step=M.SOAKING, changed_at=now, soak_started_at=now, query_errors=0,
                                 inconclusive=0, note=f"soaking {r.soak:g}s")
                tx.event(now, Kind.SOAK_STARTED, m.backend, m.incident_id, reason=f"rollout {r.id}: canary "
                         f"{m.backend} restarted with the new command and warm; soaking {r.soak:g}s", rollout_id=r.id, by=r.by)
            elif end == plan.End.OK:
                tx.update_member(r.id, m.backend, step=M.DONE, changed_at=now, note=why)
                tx.event(now, Kind.MEMBER_DONE, m.backend, m.incident_id,
                         reason=f"rollout {r.id}: {m.backend} runs the new command", rollout_id=r.id, by=r.by)
            else:
                self._fail(tx, r, m, now, why)
                r = tx.rollout(r.id) or r

    def _fail(self, tx: Transaction, r: Rollout, m: RolloutMember, now: float, why: str,
              kind: Kind = Kind.MEMBER_FAILED) -> None:
        tx.update_member(r.id, m.backend, step=M.FAILED, changed_at=now, note=why)
        tx.event(now, kind, m.backend, m.incident_id, reason=f"rollout {r.id}: {m.backend}: {why}", rollout_id=r.id, by=r.by)
        if r.state in (RS.RUNNING, RS.PAUSED):
            note = f"{m.backend}: {why}"
            tx.move_rollout(r.id, now, RS.ROLLING_BACK, f"rolling back: {note}")
            tx.event(now, Kind.ROLLING_BACK, "", reason=f"rollout {r.id} rolls back the changed members: {note}",
                     rollout_id=r.id, by=r.by)

    # -- 2. the gate -------------------------------------------------------------------------------------
    def _judge(self, rollout_id: int) -> None:
        ctx = self.ctx
        with ctx.store.reader() as rd:
            r = rd.rollout(rollout_id)
            if r is None or r.state not in (RS.RUNNING, RS.PAUSED):
                return
            members = rd.rollout_members(rollout_id)
        bounds = Bounds.from_dict(r.gate)
        fleet = [m.backend for m in members if m.step == M.PENDING and not m.canary]
        for m in members:
            if m.step != M.SOAKING or m.soak_started_at is None:
                continue
            key = (r.id, m.backend)
            t = ctx.clocks.mono()
            wall_elapsed = ctx.clocks.wall() - m.soak_started_at
            with self._lock:
                t0, then = self._soak_from.setdefault(key, (t, wall_elapsed))    # this process' first look
                elapsed = plan.soaked(wall_elapsed, t - t0, then)
                last = self._measured.get(key)
                if last is not None and t - last < bounds.interval and elapsed < r.soak:
                    continue          # measured at its interval, and at the soak's end whatever the interval
                self._measured[key] = t
            check = watch(bounds, self.gate.measure(m.backend), m.query_errors, m.inconclusive)
            verdict, reason, passed = check.verdict, check.reason, ""
            if verdict != GateVerdict.FAIL and elapsed >= r.soak:
                summary = self.gate.summary(m.backend, fleet, r.soak)
                if summary.error:
                    # counted from before this measurement: a verdict query that answers must not hide
                    # summary queries that keep failing
                    check = watch(bounds, Measurement(error=summary.error), m.query_errors, check.inconclusive)
                    verdict, reason = check.verdict, check.reason
                else:
                    verdict, reason = final(bounds, summary)
                    passed = reason
            self._record(r.id, m.backend, verdict, reason, check.query_errors, check.inconclusive, passed)

    def _record(self, rollout_id: int, backend: str, verdict: GateVerdict, reason: str, query_errors: int,
                inconclusive: int, passed: str) -> None:
        ctx = self.ctx
        with ctx.store.tx() as tx:
            r = tx.rollout(rollout_id)
            m = next((x for x in tx.rollout_members(rollout_id) if x.backend == backend), None)
            if r is None or m is None or m.step != M.SOAKING or not ctx.holds_lease(tx):
                return
            now = ctx.clocks.wall()
            if verdict == GateVerdict.FAIL:
                self._fail(tx, r, m, now, f"gate failed: {reason}", Kind.GATE_FAILED)
            elif verdict == GateVerdict.PASS:
                tx.update_member(r.id, backend, step=M.DONE, changed_at=now, note=f"gate passed: {passed}")
                tx.event(now, Kind.GATE_PASSED, backend, m.incident_id,
                         reason=f"rollout {r.id}: canary {backend} passed its {r.soak:g}s soak: {passed}",
                         rollout_id=r.id, by=r.by)
            else:
                tx.update_member(r.id, backend, query_errors=query_errors, inconclusive=inconclusive,
                                 note=f"soaking: {reason}")
                if reason != m.note.removeprefix("soaking: "):
                    tx.event_unless_recent(now, Kind.GATE, backend, f"rollout {r.id}: canary {backend}: {reason}",
                                           within=max(60.0, r.soak), rollout_id=r.id, by=r.by)

    # -- 3. act ------------------------------------------------------------------------------------------
    def _roll_back(self, tx: Transaction, r: Rollout, members: list[RolloutMember], now: float) -> None:
        """Every changed member back to its previous command, one per host at a time (the host mutex would
        serialise them anyway, and a member's deadline must not run while it waits for its host). A member
        whose restart with the new command has not begun (its incident open or draining, the command not
        stored) is called off in this transaction: it never runs later."""
        commands = tx.commands()
        limit = member_timeout(self.ctx)
        busy_hosts = {m.host or m.backend for m in members if m.step in plan.IN_PROGRESS}
        for m in members:
            if m.step not in CHANGED_STEPS:
                continue
            changed = plan.applied(m, commands)
            own = tx.incident(m.incident_id) if m.incident_id is not None else None
            if (own is not None and not changed and own.state in (IS.OPEN, IS.DRAINING) and own.command is not None
                    and own.command.rollout_id == r.id):
                self._call_off(tx, r, m, own, now)
                continue
            if m.step == M.RESTARTING:
                continue                       # under way: settled when it ends, then rolled back
            if not changed:
                tx.update_member(r.id, m.backend, step=M.ROLLED_BACK, changed_at=now,
                                 note=f"never changed ({m.note})" if m.note else "never changed")
                continue
            host = m.host or m.backend
            if host in busy_hosts:
                why = f"waits for its host {m.host}: one rollback per host at a time"
                if m.note != why:
                    tx.update_member(r.id, m.backend, note=why)
                continue
            active = tx.active_incident(m.backend)
            # its own incident, still open, or waiting for a person because the new version never warmed up:
            # the rollback takes it over with the previous command. Not one that needs a person for another
            # reason (an action whose outcome is unknown, a host whose old process did not go away)
            mine = active is not None and active.id == m.incident_id and (
                active.state == IS.OPEN or (active.state == IS.NEEDS_ACK and active.last_decision == WARMUP_TIMEOUT))
            if active is not None and not mine:
                why = f"waits for incident {active.id} ({active.state.value}) before its rollback"
                if not m.note.startswith(WAITS):
                    tx.update_member(r.id, m.backend, note=why, changed_at=now)   # the wait's deadline starts
                elif plan.overdue(m, now, limit):
                    why = (f"could not be rolled back: incident {active.id} ({active.state.value}) held it for "
                           f"over {limit:g}s")
                    tx.update_member(r.id, m.backend, step=M.ROLLBACK_FAILED, changed_at=now, note=why)
                    tx.event(now, Kind.MEMBER_FAILED, m.backend, active.id, reason=f"rollout {r.id}: {m.backend} {why}",
                             rollout_id=r.id, by=r.by)
                elif m.note != why:
                    tx.update_member(r.id, m.backend, note=why)
                continue
            incident_id = tx.request_restart(m.backend, now, requester(r), False, CommandChange(m.previous, None))
            busy_hosts.add(host)
            tx.update_member(r.id, m.backend, step=M.ROLLING_BACK, incident_id=incident_id, changed_at=now,
                             note="restarting with its previous command")
            previous = " ".join(m.previous) if m.previous is not None else "the configured command"
            tx.event(now, Kind.ROLLBACK_RESTART, m.backend, incident_id, reason=f"rollout {r.id}: {m.backend} "
                     f"restarts with its previous command ({previous[:300]}); incident {incident_id}", rollout_id=r.id,
                     by=r.by)

    def _call_off(self, tx: Transaction, r: Rollout, m: RolloutMember, inc: Incident, now: float) -> None:
        why = f"{plan.CALLED_OFF}: rollout {r.id} rolls back before this restart with the new command began"
        call_off(tx, inc, m.backend, why, now, Kind.CALLED_OFF, rollout_id=r.id, by=r.by)
        self._unsilence.add(m.backend)                 # its alerts page people again (after the transaction)
        tx.update_member(r.id, m.backend, step=M.ROLLED_BACK, changed_at=now, note="never changed: its restart was "
                         "called off before it began")

    def _go_on(self, tx: Transaction, r: Rollout, members: list[RolloutMember], now: float) -> None:
        ctx = self.ctx
        states = gate_states(ctx, tx)
        ready = [name for name, st in states.items() if st == LifecycleState.READY]
        choice = plan.choose(r, members, ready=ready, min_ready=ctx.r.min_ready, blocked=self._blocked(tx, members))
        by_name = {m.backend: m for m in members}
        for name in choice.start:
            m = by_name[name]
            if ctx.config.backend(name) is None:
                self._fail(tx, r, m, now, "no longer configured")
                return
            incident_id = tx.request_restart(name, now, requester(r), False, CommandChange(m.argv, r.id))
            tx.update_member(r.id, name, step=M.RESTARTING, incident_id=incident_id, changed_at=now,
                             note=f"restarting with the new command (incident {incident_id})")
            tx.event(now, Kind.MEMBER_RESTART, name, incident_id, reason=f"rollout {r.id}: "
                     f"{'canary ' if m.canary else ''}{name} restarts with the new command ({' '.join(m.argv)[:300]}); "
                     f"incident {incident_id}", rollout_id=r.id, by=r.by)
        if r.state == RS.RUNNING and choice.note != r.note:
            tx.note_rollout(r.id, now, choice.note)

    def _blocked(self, tx: Transaction, members: Sequence[RolloutMember]) -> str:
        """Why no member may start now ('' = nothing): the breaker open, or an incident not of this rollout
        on one of its hosts (a rollout never adds a restart where something is already wrong)."""
        br = tx.breaker()
        if br.open:
            return f"the breaker is open ({br.reason}); reset it first"
        ours = {m.incident_id for m in members if m.incident_id is not None}
        hosts = {m.host for m in members if m.host}
        names = {m.backend for m in members}
        for inc in tx.active_incidents():
            if inc.id in ours:
                continue
            b = self.ctx.config.backend(inc.backend)
            host = b.host if b is not None else ""
            if inc.backend in names or (host and host in hosts):
                where = f"on host {host}" if host else "a member"
                return f"incident {inc.id} of {inc.backend} ({inc.state.value}) {where} is open"
        return ""
