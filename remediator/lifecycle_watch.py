"""Backends outside any restart: a backend seen for the first time, and one left in ERROR.

They are keys of the scheduler too (the same key as their incidents: the backend's name), each looked at in
its own worker, so one hung or dripping backend never holds its neighbours' checks:

* first seen (INITIALIZING, not owned by a restart): READY once it passes the same warm-up gate as a
  restarted backend (/health, /v1/models, and a healthy verification: engine progress, or, idle, one
  counted one-token request), ERROR (escalated) when it has not after warmup_timeout; looked at every
  `warmup_poll`. Each backend is its own key, so a first start of the remediator checks the fleet
  max_concurrent_incidents at a time, never one after another;
* ERROR without an active incident (acknowledged, or never one): READY again once warm (the full warm-up
  check, which may send a counted probe); looked at most every max(ERROR_LOOK_MIN, warmup_poll x
  ERROR_LOOK_POLLS).

A retired backend (remediator/commands.py) is never looked at: it is out of every decision.

Every check has a total deadline, and what it found is written only if nothing took the backend meanwhile.
"""

from __future__ import annotations

import logging

from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.restart.choices import outside_restart
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.notes import escalate
from llm_health.remediator.store import AdminState

log = logging.getLogger("llm_health.remediator")

S = LifecycleState
WATCHED = (S.INITIALIZING, S.ERROR)
ERROR_LOOK_MIN = 30.0          # an ERROR backend gets a full warm-up check at most this often ...
ERROR_LOOK_POLLS = 6           # ... or every warmup_poll * this, whichever is longer


class LifecycleWatch:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._next_look: dict[str, float] = {}   # backend -> when (monotonic) to check its lifecycle again

    def due(self) -> list[str]:
        """Backends no restart of ours is carrying whose lifecycle wants a look now, the longest waiting
        first. A configured backend without a lifecycle row gets one here (INITIALIZING)."""
        ctx = self.ctx
        now, t = ctx.clocks.wall(), ctx.clocks.mono()
        rows = ctx.store.lifecycles()
        missing = [b.name for b in ctx.config.backends if b.name not in rows]
        if missing:
            with ctx.fenced() as tx:
                for name in missing:
                    tx.ensure_lifecycle(name, now)
            rows = ctx.store.lifecycles()
        active = {i.backend: i for i in ctx.store.active_incidents()}
        retired = {name for name, a in ctx.store.admins().items() if a.state == AdminState.RETIRED}
        due: list[str] = []
        for b in ctx.config.backends:
            r = rows.get(b.name)
            if r is None or r.owned or r.state not in WATCHED or b.name in retired:
                continue
            inc = active.get(b.name)
            if inc is not None and (inc.restart_under_way or r.state == S.ERROR):
                continue
            if self._next_look.get(b.name, float("-inf")) <= t:
                due.append(b.name)
        return sorted(due, key=lambda name: self._next_look.get(name, float("-inf")))

    def look(self, name: str) -> None:
        """One backend outside any restart (see the module's doc)."""
        ctx = self.ctx
        b = ctx.config.backend(name)
        if b is None:
            return
        r = ctx.store.lifecycle(name)
        inc = ctx.store.active_incident(name)
        if r is None or r.owned or (inc is not None and inc.restart_under_way):
            return
        st = r.state
        if st not in WATCHED or (st == S.ERROR and inc is not None) or \
                self._next_look.get(name, float("-inf")) > ctx.clocks.mono():
            return
        poll = ctx.r.warmup_poll
        pause = poll if st == S.INITIALIZING else max(ERROR_LOOK_MIN, poll * ERROR_LOOK_POLLS)
        try:
            ready, why = ctx.io.warmup_check(b) if st == S.ERROR else ctx.io.first_seen_check(b)
        except Exception as exc:  # noqa: BLE001 - one broken backend never starves the others
            log.exception("lifecycle check of %s failed", name)
            ready, why = False, f"check raised {exc.__class__.__name__}: {exc}"[:300]
        now, t = ctx.clocks.wall(), ctx.clocks.mono()
        moves, escalating = outside_restart(st, ready, r.since, now, ctx.r.warmup_timeout)
        reasons = {S.INITIALIZING: f"out of ERROR: {why}", S.READY: why,
                   S.ERROR: f"not answering {ctx.r.warmup_timeout:g}s after it was first seen: {why}"}
        with ctx.fenced() as tx:
            self._next_look[name] = t + pause   # only once the lease check passed: a deposed look delays nothing
            current = tx.lifecycle(name)
            if current is None or current.state != st or current.owned:
                return
            for target in moves:
                tx.move_lifecycle(name, target, now, reasons[target])
            if escalating:
                escalate(tx, name, None, now, f"{name} never became ready: {why}")
