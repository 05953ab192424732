"""Steps `claim` and `act`: record the intent, run the argv, record what it did (RESTARTING).

The claim writes the `actions` row (intent; budget and backoff count it) and moves to RESTARTING inside
the caller's transaction, the one that decided the restart. The argv then runs outside any transaction
(action.py's wrapper; its exit status goes to a file), and its result is recorded in one transaction that
checks the lease first: a deposed holder records nothing. Anything raising between the claim and the
recorded result aborts the restart into needs_ack (outcome unknown, never repeated blindly).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from llm_health.config import Backend
from llm_health.remediator import action as act
from llm_health.remediator import policy
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.capture import before_kill
from llm_health.remediator.restart.choices import (
    ActionEnd,
    Claim,
    after_action,
    claim_lifecycle,
    unknown_outcome,
)
from llm_health.remediator.restart.context import Context, NotLeading
from llm_health.remediator.restart.notes import escalate
from llm_health.remediator.restart.result import DONE, LookAgain, StepResult
from llm_health.remediator.restart.silences import silence, unsilence_safely
from llm_health.remediator.sequence import restart_argv
from llm_health.remediator.store import ActionResultKind, Incident, IncidentState, Reads, Transaction

log = logging.getLogger("llm_health.remediator")
NO_HEADROOM = "no_headroom"     # the decision and event of a restart whose headroom check never passed

S = LifecycleState
IS = IncidentState


class LeaseLost(NotLeading):
    """The authority's lease is not ours (or nearly over), or the intent was settled by someone else, when an
    action's process is about to start: it is not started."""


def claim(ctx: Context, tx: Transaction, incident_id: int, backend: Backend, d: policy.Decision, now: float) -> int:
    """Record the intent (and where the action's exit status will go) and move to RESTARTING. A restart
    that changes the backend's command (a rollout's) stores the new command in the same transaction: the
    intent and the command it runs are one fact, and every later restart of the backend runs it too."""
    inc = tx.incident(incident_id)
    if inc is not None and inc.command is not None:
        tx.set_command(backend.name, inc.command.argv, now, inc.command.rollout_id)
    action_id = tx.add_action(incident_id, backend.name, " ".join(stored_argv(tx, backend, ctx))[:2000], ctx.holder,
                              now, ctx.clocks.mono(), ctx.clocks.boot)
    files = action_files(ctx, action_id)
    if files is not None:
        tx.set_status_path(action_id, str(files.status))
    taken = claim_lifecycle(tx.lifecycle_state(backend.name))
    if taken == Claim.FROM_ERROR:
        tx.move_lifecycle(backend.name, S.INITIALIZING, now, f"restart started from ERROR: {d.reason}", incident_id)
    elif taken == Claim.TAKE_OVER:
        tx.set_lifecycle_owner(backend.name, incident_id)   # never READY yet: the restart takes it over
    if backend.workload:         # its pod comes back under a new name: remember who was there before
        tx.note_workload(incident_id, backend.workload,
                         tuple(b.name for b in ctx.config.backends if b.workload == backend.workload))
    tx.move_incident(incident_id, now, IS.RESTARTING, last_decision=policy.RESTART, last_note="")
    tx.event(now, "restarting", backend.name, incident_id, reason=d.reason, action_id=action_id)
    return action_id


def stored_argv(rd: Reads, backend: Backend, ctx: Context) -> tuple[str, ...]:
    """The argv a restart of `backend` runs now: its stored command (a rollout's) or the configured one."""
    row = rd.command(backend.name)
    return restart_argv(backend, ctx.r, row.argv if row is not None else None)


def action_files(ctx: Context, action_id: int) -> act.ActionFiles | None:
    """Where the default runner puts this action's pid, output and exit status (None for an injected
    runner that keeps no files)."""
    if ctx.action_dir is None or not getattr(ctx.io.runner, "keeps_files", False):
        return None
    return act.ActionFiles(ctx.action_dir, str(action_id))


def carry_out(ctx: Context, incident_id: int, action_id: int, backend: Backend, *, with_silence: bool) -> StepResult:
    """Silence (optionally) and run a claimed restart. Anything raising between the claim and the
    recorded result (SQLite busy, the runner failing to start the argv, Alertmanager client errors)
    must not leave the incident RESTARTING, the lifecycle STOPPED and the host mutex held: the
    restart is aborted into needs_ack (outcome unknown, never repeated blindly)."""
    ctx.running.add(action_id, backend.name)
    try:
        with ctx.store.reader() as rd:               # before any side effect: a silence, a capture
            spare_to_start(ctx, rd, incident_id, action_id)
        if with_silence:
            silence(ctx, incident_id, backend)
        before_kill(ctx, incident_id, backend)       # bounded; never stops the restart
        argv, act_by = fit_to_start(ctx, incident_id, action_id, backend)
        env = {"LLM_HEALTH_BACKEND": backend.name, "LLM_HEALTH_INCIDENT": str(incident_id),
               "LLM_HEALTH_ACTION": str(action_id), "LLM_HEALTH_EPOCH": str(ctx.epoch())}
        if ctx.clocks.mono() > act_by:
            raise LeaseLost(f"the lease of {ctx.holder} (epoch {ctx.epoch()}) may have too little time left by "
                            "now: the action was not started")
        result = ctx.io.runner(argv, ctx.r.action_timeout, env)
        record_result(ctx, incident_id, action_id, backend.name, result)
    except Exception as exc:  # noqa: BLE001 - the state machine must always reach a resting state
        log.exception("restart of %s (incident %s, action %s) failed", backend.name, incident_id, action_id)
        abort(ctx, incident_id, action_id, backend, exc)
    finally:
        ctx.running.remove(action_id)
    return DONE


def fit_to_start(ctx: Context, incident_id: int, action_id: int, backend: Backend) -> tuple[tuple[str, ...], float]:
    """Right before the process starts, in one transaction: the lease is ours in the look's term with time
    to spare, and the intent is still open (no outcome recorded by anyone: a holder of another term may have
    settled it as interrupted); the argv it runs. Returns the argv and the monotonic time by which the
    process must have started (the lease's spare time, counted from before the check): nothing slow may sit
    between the check and the start unbounded."""
    checked = ctx.clocks.mono()
    with ctx.store.tx() as tx:
        spare = spare_to_start(ctx, tx, incident_id, action_id)
        return stored_argv(tx, backend, ctx), checked + spare


def spare_to_start(ctx: Context, rd: Reads, incident_id: int, action_id: int) -> float:
    """In `rd` (the transaction that starts it, or a read before its side effects): seconds of the lease's
    spare time (ours, in the look's term), the intent still open; else LeaseLost."""
    spare = ctx.spare_to_act(rd)
    if spare < 0.0:
        raise LeaseLost(f"the lease of {ctx.holder} (epoch {ctx.epoch()}) is lost or about to expire: the "
                        "action was not started")
    open_intent = rd.unfinished_action(incident_id)
    if open_intent is None or open_intent.id != action_id or rd.incident_in(incident_id, IS.RESTARTING) is None:
        raise LeaseLost(f"action {action_id} of incident {incident_id} was settled meanwhile (another term's "
                        "recovery): the action was not started")
    return spare


def watch_action(ctx: Context, inc: Incident, backend: Backend) -> StepResult:
    """RESTARTING and no argv of ours running: a previous authority's action. Collect its real exit
    status (the wrapper outlives us) instead of guessing; still running -> look again later."""
    row = ctx.store.unfinished_action(inc.id)
    if row is None or row.id in ctx.running or not row.status_path:
        return DONE                   # ours (a worker is on it) or nothing to collect: recover() decides
    path = Path(row.status_path)
    result = act.collect(act.ActionFiles(path.parent, path.name.removesuffix(".status")))
    if result is None:
        at = ctx.clocks.mono() + ctx.r.poll_interval
        with ctx.fenced() as tx:
            tx.look_again_at(inc.id, at)
        return LookAgain(at)
    record_result(ctx, inc.id, row.id, backend.name, result, collected=True)
    return DONE


def record_result(ctx: Context, incident_id: int, action_id: int, backend: str, result: act.ActionResult,
                  collected: bool = False) -> None:
    """Record what the action did and move the incident on. Only the authority that records the outcome
    acts on it: a deposed holder whose action finished late (its lease was taken, the new holder
    collected the exit status from the wrapper's file) writes a `late_result` naming what was recorded,
    and leaves the incident, the lifecycle and the silence to the new holder."""
    r = ctx.r
    now, t = ctx.clocks.wall(), ctx.clocks.mono()
    with ctx.store.tx() as tx:
        detail: dict[str, Any] = {"action_id": action_id, "exit_code": result.exit_code,
                                  "output": result.output[-1000:]}
        if not ctx.holds_lease(tx):
            # deposed while the action ran: the new holder collects the exit status from the wrapper's
            # file (kept for it) and carries the incident on; nothing here may move it
            tx.event(now, "late_result", backend, incident_id,
                     reason=f"action finished ({result.result}) after this authority ({ctx.holder}) lost "
                     "the lease: recorded nothing, the new holder collects the outcome and carries on",
                     **{**detail, "seen_here": result.result})
            ctx.on_abort_unrecorded()     # the new holder may be us, in a newer term: its recovery looks again
            return
        updated = tx.finish_action(action_id, now, result.result, result.exit_code, result.output)
        if collected:
            detail["collected"] = "exit status collected from the action's status file after a takeover"
        if not updated:
            _late(tx, now, backend, incident_id, action_id, result, detail)
            return
        if collected and tx.incident_in(incident_id, IS.RESTARTING) is None:
            tx.event(now, "late_result", backend, incident_id,
                     reason=f"action finished ({result.result}); the incident moved on meanwhile "
                     "(acknowledged or closed): recorded only", **detail)
            return
        configured = ctx.config.backend(backend)
        end = after_action(result, headroom=configured is not None and bool(configured.headroom))
        if end == ActionEnd.NO_HEADROOM:
            why = (f"the old process did not go away: headroom never passed within {r.headroom_wait:g}s of the "
                   "stop, nothing was started")
            tx.move_lifecycle(backend, S.ERROR, now, f"host needs attention: {why}", incident_id)
            tx.bump("host_needs_attention", backend)
            escalate(tx, backend, incident_id, now, f"host needs attention: {why}")
            tx.move_incident(incident_id, now, IS.NEEDS_ACK, last_decision=NO_HEADROOM)
            tx.event(now, NO_HEADROOM, backend, incident_id,
                     reason=f"{why}: not retried (a restart loop would only fail the same way); the host needs a "
                     "person (a reboot frees memory an unkillable process holds)", **detail)
        elif end == ActionEnd.WARM_UP:
            warming = f"restart action exited 0; warming up (up to {r.warmup_timeout:g}s)"
            if tx.lifecycle_state(backend) == S.STOPPED:
                tx.move_lifecycle(backend, S.INITIALIZING, now, warming, incident_id)
            tx.move_incident(incident_id, now, IS.WARMING, warm_deadline=t + r.warmup_timeout,
                             last_decision="restarted", next_check_at=0.0)
            tx.event(now, "restarted", backend, incident_id, reason=warming, **detail)
        elif end == ActionEnd.UNKNOWN:
            what = unknown_outcome(result, r.action_timeout)
            tx.move_lifecycle(backend, S.ERROR, now, f"restart action {what}: outcome unknown", incident_id)
            escalate(tx, backend, incident_id, now, f"restart action {what}")
            tx.move_incident(incident_id, now, IS.NEEDS_ACK, last_decision="failed")
            tx.event(now, "failed", backend, incident_id,
                     reason=f"restart action {what}: outcome unknown, not retried (acknowledge via "
                     "API, or it closes when the backend answers again)", result=result.result, **detail)
        else:
            tx.move_lifecycle(backend, S.ERROR, now, f"restart action failed (exit {result.exit_code})", incident_id)
            inc = tx.incident(incident_id)
            if inc is not None and inc.command is not None:
                # a planned restart (a rollout's): never retried here, the rollout decides (it rolls back)
                why = f"planned restart failed (exit {result.exit_code})"
                tx.move_incident(incident_id, now, IS.CLOSED, close_reason=why, last_decision="failed")
                tx.event(now, "failed", backend, incident_id, reason=f"{why}: not retried, its rollout decides what "
                         "comes next", result=result.result, **detail)
            else:
                tx.move_incident(incident_id, now, IS.OPEN, last_decision="failed", last_note="")
                tx.event(now, "failed", backend, incident_id,
                         reason=f"restart action failed (exit {result.exit_code}); next attempt only after "
                         "backoff", result=result.result, **detail)
    if result.result != act.OK:
        unsilence_safely(ctx, backend)     # nothing to warm up: its alerts must page people again
    if ctx.action_dir is not None:         # the result is in the store: the action's files are not needed
        act.ActionFiles(ctx.action_dir, str(action_id)).remove()


def _late(tx: Transaction, now: float, backend: str, incident_id: int, action_id: int, result: act.ActionResult,
          detail: dict[str, Any]) -> None:
    """Another authority recorded this action's result first: say what it recorded, change nothing."""
    row = tx.action(action_id)
    recorded = (f"{row.holder} recorded {row.result}" + (f" (exit {row.exit_code})" if row.exit_code is not None
                                                         else "")
                if row is not None else "the action is no longer in the store")
    tx.event(now, "late_result", backend, incident_id,
             reason=f"action finished after another authority took over: {recorded}; this "
             f"authority saw {result.result}, recorded nothing and leaves the rest to it",
             **{**detail, "seen_here": result.result})


def abort(ctx: Context, incident_id: int, action_id: int, backend: Backend, exc: BaseException) -> None:
    reason = f"restart aborted by an error of the remediator ({exc.__class__.__name__}: {exc})"[:500]
    try:
        now = ctx.clocks.wall()
        with ctx.store.tx() as tx:
            if not ctx.holds_lease(tx):
                # another term: the new holder finds the intent without an outcome and decides (needs_ack)
                tx.event(now, "late_result", backend.name, incident_id, action_id=action_id,
                         reason=f"{reason}; this authority ({ctx.holder}) lost the lease: recorded nothing, "
                         "the new holder finds the intent without an outcome")
                ctx.on_abort_unrecorded()     # ours again later (a new term): its recovery looks at the intent
                return
            done = tx.finish_action(action_id, now, ActionResultKind.ERROR, None, reason)
            restarting = tx.incident_in(incident_id, IS.RESTARTING) is not None
            if restarting:
                tx.move_incident(incident_id, now, IS.NEEDS_ACK, last_decision="aborted")
            if done or restarting:
                if tx.lifecycle_state(backend.name) != S.ERROR:
                    tx.move_lifecycle(backend.name, S.ERROR, now, f"{reason}: outcome unknown", incident_id)
                tx.event(now, "aborted", backend.name, incident_id,
                         reason=f"{reason}; the action may or may not have run: not repeated "
                         "(acknowledge via POST /api/backends/<name>/ack, or the incident closes when "
                         "the backend answers again)", action_id=action_id)
                escalate(tx, backend.name, incident_id, now, reason)
    except Exception:  # noqa: BLE001 - e.g. the database is still locked: recover() sweeps it next pass
        log.exception("could not record the aborted restart of %s; recovering on the next pass", backend.name)
        ctx.on_abort_unrecorded()
        return
    unsilence_safely(ctx, backend.name)
