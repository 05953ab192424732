"""What a previous holder left unfinished: the first thing a new holder does (kured's "recovery first").

Actions another (dead) holder started and never finished get their result COLLECTED when it can still be
known: the action's wrapper outlives the authority and writes the exit status to a file (action.py); one
still running is left to the RESTARTING step (restart/act.py watch_action). Only an action whose outcome
cannot be known (no status, wrapper gone; or an injected runner) is `interrupted`: counted (it is already
in the budget), never repeated, its backend to ERROR (needs a person). A drain in progress simply resumes.
Our own unfinished rows are swept too: one of ours that no worker is running is a restart whose
bookkeeping failed (restart/act.py abort could not write).
"""

from __future__ import annotations

import threading
from pathlib import Path

from llm_health.remediator import action as act
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.act import record_result
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.notes import escalate
from llm_health.remediator.restart.silences import unsilence_safely
from llm_health.remediator.store import Action, ActionResultKind, IncidentState

S = LifecycleState


class Recovery:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._done = False
        self._lock = threading.Lock()

    def again(self) -> None:
        """Run recover() before the next pass (a new term of the lease; an abort that was not recorded)."""
        self._done = False

    def if_needed(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True         # before it runs: an again() asked for meanwhile is kept
            try:
                self.recover()
            except BaseException:
                self._done = False
                raise

    def recover(self) -> None:
        ctx = self.ctx
        now = ctx.clocks.wall()
        interrupted: set[str] = set()
        collected: list[tuple[Action, act.ActionResult]] = []
        with ctx.fenced() as tx:
            for a in tx.unfinished_actions():
                if a.id in ctx.running:
                    continue
                if a.status_path:
                    path = Path(a.status_path)
                    result = act.collect(act.ActionFiles(path.parent, path.name.removesuffix(".status")))
                    if result is None:
                        continue                       # still running: collected when it ends
                    if not result.outcome_unknown or result.result == act.TIMEOUT:
                        collected.append((a, result))
                        continue
                tx.finish_action(a.id, now, ActionResultKind.INTERRUPTED)
                if tx.incident_in(a.incident_id, IncidentState.RESTARTING) is not None:
                    tx.move_incident(a.incident_id, now, IncidentState.NEEDS_ACK, last_decision="interrupted")
                tx.event(now, "interrupted", a.backend, a.incident_id,
                         reason="the remediator stopped while this restart was running and its exit status "
                         "cannot be known: it may have happened; not repeated (acknowledge via POST "
                         "/api/backends/<name>/ack, or the incident closes when the backend answers again "
                         "or the alert resolves)",
                         action_id=a.id, holder=a.holder, own=a.holder == ctx.holder)
                if tx.lifecycle_state(a.backend) != S.ERROR:
                    tx.move_lifecycle(a.backend, S.ERROR, now, "interrupted mid-restart: outcome unknown",
                                      a.incident_id)
                escalate(tx, a.backend, a.incident_id, now, "restart interrupted: outcome unknown")
                interrupted.add(a.backend)
        for a, result in collected:
            record_result(ctx, a.incident_id, a.id, a.backend, result, collected=True)
        for backend in sorted(interrupted):
            unsilence_safely(ctx, backend)      # ERROR: its alerts must reach people again
