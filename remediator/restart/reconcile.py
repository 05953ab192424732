"""One look at one incident: the incident's state picks the step (a dispatch table), the step answers when
to look again. Level-based, as a controller-runtime reconciler: a look re-reads what it needs and does one
step; nothing is remembered between looks except in the store (and the discovery wait below).

    state       step (module)                   does                                          next state
    ----------  ------------------------------  --------------------------------------------  ---------------------
    open        consider (consider.py)          gates -> host mutex -> concurrency -> verify  open (deferred), closed,
                                                -> min_ready floor -> begin                   draining, restarting
    draining    watch_drain (draining.py)       in flight done / deadline / progress? (re-    restarting, open, closed
                                                verifies first when the alerts resolved)
    restarting  watch_action (act.py)           collect the result of an argv a previous      warming, open (failed),
                                                authority began (ours runs in its claim)      needs_ack (unknown)
    warming     watch_warmup (warmup.py)        /health, /v1/models, a healthy verification   closed, needs_ack
    warming     watch_replacement               the same, on the new pod of a ReplicaSet      closed, needs_ack
                (replacement.py)                (its pod comes back under a new name)
    needs_ack   watch_recovery (warmup.py)      closes by itself when the backend answers     closed
    open, draining of a restart an operator asked for: consider_requested, watch_requested_drain
                (requested.py): no verification, no call-off on progress
    observed    (nothing: absorbs alerts until they resolve)

An incident of a backend an operator holds (remediator/commands.py) never starts a restart: retired, it
is closed (`retired_ignored`: out of every decision); drained, an open one is parked OBSERVED
(`held_by_operator`) until the backend is undrained. A restart of ours already under way finishes.

A backend the incident names that is not in this worker's fleet is looked up in service discovery first
(`DiscoveryWait`): never closed on a missing answer, closed as "no longer configured" once an answer
that started after we missed it has come without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from llm_health import groups
from llm_health.config import Backend
from llm_health.remediator.restart.act import watch_action
from llm_health.remediator.restart.consider import consider
from llm_health.remediator.restart.context import Context
from llm_health.remediator.restart.draining import watch_drain
from llm_health.remediator.restart.notes import close, hold_off
from llm_health.remediator.restart.replacement import watch_replacement
from llm_health.remediator.restart.requested import consider_requested, watch_requested_drain
from llm_health.remediator.restart.result import DONE, LookAgain, StepResult
from llm_health.remediator.restart.warmup import watch_recovery, watch_warmup
from llm_health.remediator.store import AdminState, Incident, IncidentState

IS = IncidentState
Step = Callable[[Context, Incident, Backend], StepResult]

STEPS: dict[IncidentState, Step] = {
    IS.OPEN: consider,
    IS.DRAINING: watch_drain,
    IS.RESTARTING: watch_action,
    IS.WARMING: watch_warmup,
    IS.NEEDS_ACK: watch_recovery,
}

#: a restart an operator asked for decides and drains its own way (requested.py); the rest is shared
REQUESTED_STEPS: dict[IncidentState, Step] = {
    IS.OPEN: consider_requested,
    IS.DRAINING: watch_requested_drain,
}

#: incidents whose backend this worker is looking up in service discovery (bounded; the oldest is dropped)
MAX_UNKNOWN_TRACKED = 4096
WAITING = "waiting_for_discovery"


class Reconciler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.discovery = DiscoveryWait(ctx)

    def look(self, inc: Incident) -> StepResult:
        """The step the incident's state calls for (the caller checked that it is due)."""
        if inc.state == IS.WARMING and inc.workload:
            return watch_replacement(self.ctx, inc)     # its pod comes back under a new name
        backend = self.ctx.config.backend(inc.backend)
        if backend is None:
            waiting = self.discovery.wait(inc)
            if waiting is not None:
                return waiting
            backend = self.ctx.config.backend(inc.backend)     # the refresh may have found it
            if backend is None:
                return close(self.ctx, inc.id, inc.backend, "closed", "backend no longer configured")
        else:
            self.discovery.found(inc.id)
        # opened before the webhook's worker knew the backend (discovery found it since, in this look or
        # between two): its group labels are compared only now, at every look before a restart is under way
        why = groups.mismatch(dict(inc.labels), backend.labels, f"backend {backend.name}")
        if why is not None and not inc.restart_under_way:
            return close(self.ctx, inc.id, inc.backend, "closed", f"not this backend's alert: {why}")
        held = self.ctx.store.admin(backend.name)
        if held is not None and not inc.restart_under_way:
            who = f"{backend.name} is {held.state.value} (by {held.by or 'unknown'}: {held.reason})"
            if held.state == AdminState.RETIRED:
                return close(self.ctx, inc.id, inc.backend, "retired_ignored",
                             f"{who}: out of every decision, no restart; activate it to put it back")
            if inc.state == IS.OPEN and not inc.requested_by:    # a restart asked for by hand goes ahead
                return hold_off(self.ctx, inc.id, inc.backend, who)
        if inc.requested_by and inc.state in REQUESTED_STEPS:
            return REQUESTED_STEPS[inc.state](self.ctx, inc, backend)
        step = STEPS.get(inc.state)
        return step(self.ctx, inc, backend) if step is not None else DONE


class DiscoveryWait:
    """With service discovery on, an incident's backend that is not in this worker's fleet may just not be
    seen yet (another worker, or the exporter, refreshed first): it is looked up again only after a refresh
    that STARTED after we first missed it has answered. The refresher is asked for one (it serves such
    requests at most once per discovery.extra_refresh_every: never a query per alert, and never here: this
    only asks)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._unknown: dict[int, int] = {}          # incident id -> discovery mark when first not in the fleet
        self._lock = threading.Lock()

    def wait(self, inc: Incident) -> StepResult | None:
        """None once the backend may be judged missing (or found); else the wait's answer."""
        settled = self._settled(inc.id)
        if self._unsure():
            return self._keep(inc)
        if not settled:
            return self._keep(inc, refreshing=True)
        return None

    def found(self, incident_id: int) -> None:
        if self._unknown:
            with self._lock:
                self._unknown.pop(incident_id, None)

    def _settled(self, incident_id: int) -> bool:
        """True once a refresh that started after we first missed the backend has answered; without
        discovery, True at once."""
        discovery = self.ctx.config.live_discovery()
        if discovery is None:
            return True
        with self._lock:
            mark = self._unknown.get(incident_id)
            if mark is None:
                while len(self._unknown) >= MAX_UNKNOWN_TRACKED:       # incidents closed by a webhook meanwhile
                    self._unknown.pop(next(iter(self._unknown)))
                self._unknown[incident_id] = discovery.mark()
        if mark is not None and discovery.answered_since(mark):
            with self._lock:
                self._unknown.pop(incident_id, None)
            return True
        discovery.request_refresh()
        return False

    def _unsure(self) -> bool:
        """Service discovery is on but has no good answer now (never since this worker started, or the
        latest refresh failed): a backend missing from it may well still exist."""
        discovery = self.ctx.config.live_discovery()
        return discovery is not None and bool(discovery.status().stale)

    def _keep(self, inc: Incident, refreshing: bool = False) -> StepResult:
        """The backend is unknown only because Prometheus does not answer (e.g. the remediator restarted
        while Prometheus is down), or (`refreshing`) this worker's discovery has not refreshed since it
        first missed it: never close the incident (nor leave its restart's lifecycle owned by a closed
        incident) on that; look again after poll_interval. Audited once per wait."""
        ctx = self.ctx
        now, t = ctx.clocks.wall(), ctx.clocks.mono()
        with ctx.fenced() as tx:
            current = tx.incident_in(inc.id, inc.state)
            if current is None:
                return DONE
            tx.look_again_at(inc.id, t + ctx.r.poll_interval, note=WAITING)
            if current.last_note != WAITING:
                why = ("not in this worker's fleet yet: looked up again after its next service discovery refresh"
                       if refreshing else "not in the fleet while service discovery has no good answer "
                       "(Prometheus unreachable?)")
                tx.event(now, WAITING, inc.backend, inc.id,
                         reason=f"{inc.backend} is {why}: incident kept ({inc.state}), looked at again when it answers")
        return LookAgain(t + ctx.r.poll_interval)
