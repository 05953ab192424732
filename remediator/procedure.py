"""One incident's restart procedure, step by step. Scheduling many incidents is elsewhere (scheduler.py).

`Procedure.look(incident)` is the whole procedure seen from one incident: it takes the incident's state
and runs the one step that state calls for. Each step reads what it needs, does its slow I/O (verify,
in-flight read, the argv, Alertmanager) OUTSIDE any transaction, then decides and writes in ONE short
`store.tx()` that re-checks the incident's state first (it may have been resolved or acknowledged
meanwhile). Fleet-wide guarantees (host mutex, min_ready, the restart-concurrency bound, budget,
backoff, breaker) are all re-read and decided inside that transaction, so they hold across threads and
gunicorn workers. The restart's intent (`actions` row) is written before the argv runs.

    state      step              what it does                                          next state
    ---------  ----------------  ----------------------------------------------------  ---------------------
    open       consider          gates -> host mutex -> concurrency -> verify ->       open (deferred), closed,
                                 min_ready floor -> begin                              draining or restarting
    draining   watch_drain       in-flight work done / drain deadline / progress?      restarting, open, closed
                                 (re-verifies first when the alerts resolved)
    restarting act / collect     run the argv (wrapper; exit status in a file) or       warming, open (failed),
                                 collect the result of one a previous authority began  needs_ack (unknown)
    warming    watch_warmup      /health, /v1/models, a healthy verification           closed, needs_ack
    needs_ack  watch_recovery    closes by itself when the backend answers again       closed

Silences: created when the drain (or the claim) begins, expired when the restart is over.
Time: `now` is wall time (events, restart history); `t` is monotonic (every deadline, see clock.py).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_health.exporter.observation import Verification, VerifyOutcome
from llm_health.remediator import action as act
from llm_health.remediator import inflight, lifecycle, policy
from llm_health.remediator.clock import Clocks
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.marker import file_markers
from llm_health.remediator.silence import SilenceError, create_silence, expire_silence
from llm_health.remediator.store import (
    ActionResultKind,
    Incident,
    IncidentState,
    Reads,
    Silence,
    StateStore,
    Transaction,
)

from llm_health.config import Backend, Config

log = logging.getLogger("llm_health.remediator")

S = LifecycleState
CLOSED, DRAINING, NEEDS_ACK, OBSERVED, OPEN, RESTARTING, WARMING = (
    IncidentState.CLOSED, IncidentState.DRAINING, IncidentState.NEEDS_ACK, IncidentState.OBSERVED, IncidentState.OPEN,
    IncidentState.RESTARTING, IncidentState.WARMING)
DEFERRED_HOST = "deferred_host"
DEFERRED_MIN_READY = "deferred_min_ready"
DEFERRED_CONCURRENCY = "deferred_concurrency"
SILENCE_MARGIN = 60.0          # seconds a restart's silence outlasts drain + action + warm-up
SILENCE_TIMEOUT = 3.0          # HTTP timeout towards Alertmanager (never blocks a restart for long)
VERIFY = "verify"              # probe purposes (llm_health_remediator_probes_total{purpose})
WARMUP = "warmup"

#: while set (per thread), every idle probe exporter.check sends is appended here (counted afterwards)
probe_log: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("probe_log", default=None)

Verifier = Callable[[Backend], Verification]
WarmupCheck = Callable[[Backend], tuple[bool, str]]  # -> (ready, why)
InFlightReader = Callable[[Backend], InFlight]
Runner = Callable[[Sequence[str], float, dict[str, str]], act.ActionResult]


@dataclass
class Checks:
    """The procedure's I/O towards the backend, injectable (tests record or script them)."""

    verifier: Verifier
    warmup_check: WarmupCheck
    answer_check: WarmupCheck
    in_flight: InFlightReader
    runner: Runner


#: incidents whose backend this worker is looking up in service discovery (bounded; the oldest is dropped)
MAX_UNKNOWN_TRACKED = 4096


class Procedure:
    def __init__(self, store: StateStore, config: Config, checks: Checks, clocks: Clocks, holder: str,
                 still_holder: Callable[[Transaction], bool], action_dir: Path | None = None) -> None:
        self.store = store
        self.config = config
        self.r = config.remediator
        self.checks = checks
        self.clocks = clocks
        self.holder = holder
        self.still_holder = still_holder               # (tx) -> bool, inside the caller's transaction
        self.action_dir = action_dir                   # where the default runner's files go
        self.settings = policy.Settings(
            backoff=self.r.backoff, budget=self.r.budget, breaker=self.r.breaker,
            unknown_retry=max(self.r.verify_interval, self.r.poll_interval),
            unresponsive_after=self.r.unresponsive_after,
        )
        self.busy_dir = config.resolve_path(self.r.busy_dir) if self.r.busy_dir else None
        self._running: dict[int, str] = {}             # action id -> backend, whose argv runs in this process now
        self._running_lock = threading.Lock()
        self._unknown: dict[int, int] = {}             # incident id -> discovery mark when first not in the fleet
        self._unknown_lock = threading.Lock()

    def _discovery_settled(self, incident_id: int) -> bool:
        """With service discovery on, an incident's backend that is not in this worker's fleet may just not
        be seen yet (another worker, or the exporter, refreshed first): it is looked up again only after a
        refresh that STARTED after we first missed it has answered. Asks the refresher for one (it serves
        such requests at most once per discovery.extra_refresh_every: never a query per alert, and never
        here: this only asks). True once that answer is in; without discovery, True at once."""
        discovery = self.config.live_discovery()
        if discovery is None:
            return True
        with self._unknown_lock:
            mark = self._unknown.get(incident_id)
            if mark is None:
                while len(self._unknown) >= MAX_UNKNOWN_TRACKED:       # incidents closed by a webhook meanwhile
                    self._unknown.pop(next(iter(self._unknown)))
                self._unknown[incident_id] = discovery.mark()
        if mark is not None and discovery.answered_since(mark):
            with self._unknown_lock:
                self._unknown.pop(incident_id, None)
            return True
        discovery.request_refresh()
        return False

    # == the procedure: one look at one incident ===================================================
    def look(self, inc: Incident) -> None:
        """The step the incident's state calls for (the caller checked that it is due)."""
        incident_id, state = inc.id, inc.state
        backend = self.config.backend(inc.backend)
        if backend is None:
            settled = self._discovery_settled(incident_id)
            if self._discovery_unsure():
                self.wait_for_discovery(incident_id, inc.backend, state)
                return
            if not settled:
                self.wait_for_discovery(incident_id, inc.backend, state, refreshing=True)
                return
            backend = self.config.backend(inc.backend)     # the refresh may have found it
            if backend is None:
                self.close(incident_id, inc.backend, "closed", "backend no longer configured")
                return
        elif self._unknown:
            with self._unknown_lock:
                self._unknown.pop(incident_id, None)
        if state == OPEN:
            self.consider(incident_id, backend)
        elif state == DRAINING:
            self.watch_drain(incident_id, backend)
        elif state == RESTARTING:
            self.watch_action(incident_id, backend)
        elif state == WARMING:
            self.watch_warmup(incident_id, backend, float(inc.warm_deadline or 0))
        elif state == NEEDS_ACK:
            self.watch_recovery(incident_id, backend)

    def _discovery_unsure(self) -> bool:
        """Service discovery is on but has no good answer now (never since this worker started, or the
        latest refresh failed): a backend missing from it may well still exist."""
        discovery = self.config.live_discovery()
        return discovery is not None and bool(discovery.status().stale)

    def wait_for_discovery(self, incident_id: int, backend: str, state: IncidentState,
                           refreshing: bool = False) -> None:
        """The backend is unknown only because Prometheus does not answer (e.g. the remediator restarted
        while Prometheus is down), or (`refreshing`) this worker's discovery has not refreshed since it
        first missed it: never close the incident (nor leave its restart's lifecycle owned by a closed
        incident) on that; look again after poll_interval. Audited once per wait."""
        now, t = self.clocks.wall(), self.clocks.mono()
        key = "waiting_for_discovery"
        with self.store.tx() as tx:
            inc = tx.incident_in(incident_id, state)
            if inc is None:
                return
            tx.look_again_at(incident_id, t + self.r.poll_interval, note=key)
            if inc.last_note != key:
                why = ("not in this worker's fleet yet: looked up again after its next service discovery refresh"
                       if refreshing else "not in the fleet while service discovery has no good answer "
                       "(Prometheus unreachable?)")
                tx.event(now, key, backend, incident_id,
                         reason=f"{backend} is {why}: incident kept ({state}), looked at again when it answers")

    # == step: consider (gates -> host mutex -> concurrency -> verify -> floor -> begin) =============
    def consider(self, incident_id: int, backend: Backend) -> None:
        now, t = self.clocks.wall(), self.clocks.mono()
        d = policy.decide(self.facts(self.store, backend, now), None, self.settings)
        if d.kind == policy.VERIFY:
            d = self.host_gate(self.store, backend) or self.concurrency_gate(self.store, incident_id) or d
        if d.kind != policy.VERIFY:
            with self.store.tx() as tx:
                if tx.incident_in(incident_id, OPEN) is not None:
                    self.note(tx, incident_id, backend.name, d, now)
            return
        verification = self.probing(backend, VERIFY, self.checks.verifier)
        baseline = None
        if verification.outcome in (VerifyOutcome.NO_PROGRESS, VerifyOutcome.UNRESPONSIVE):
            baseline = self.in_flight_now(backend)   # read outside the transaction: what the drain starts from
        now, t = self.clocks.wall(), self.clocks.mono()
        claimed: int | None = None
        silence = False
        with self.store.tx() as tx:
            inc = tx.incident_in(incident_id, OPEN)
            if inc is None:
                return  # resolved or acknowledged while we verified
            since = self.record_verification(tx, inc, verification, now, t)
            d = policy.decide(self.facts(tx, backend, now, since), verification, self.settings)
            if d.kind == policy.RESTART:
                d = (self.host_gate(tx, backend) or self.concurrency_gate(tx, incident_id, verification)
                     or self.floor_gate(tx, backend, verification, now) or d)
            if d.kind == policy.RESTART:
                if not self.still_holder(tx):
                    return
                claimed = self.begin(tx, incident_id, backend, d, verification, baseline, now, t)
                silence = claimed is not None or tx.lifecycle_state(backend.name) == S.DRAINING
            else:
                self.note(tx, incident_id, backend.name, d, now)
        if claimed is not None:
            self.carry_out(incident_id, claimed, backend, silence=silence)
        elif silence:
            self.silence_safely(incident_id, backend)

    def facts(self, rd: Reads, backend: Backend, now: float,
              unresponsive_since: float | None = None) -> policy.Facts:
        """Everything policy.decide needs, read in `rd` (wall time; `unresponsive_since` already wall)."""
        br = rd.breaker()
        dry = self.r.dry_run
        markers = rd.markers(backend.name)
        if self.busy_dir is not None:
            markers += file_markers(self.busy_dir, backend.name, self.r.busy_file_ttl, self.r.marker_max_ttl,
                                    now=now)
        clock = {"now": now, "mono": self.clocks.mono() - (self.clocks.wall() - now), "boot": self.clocks.boot}
        return policy.Facts(
            now=now, backend=backend.name,
            restarts=rd.restart_times(backend.name, include_dry_run=dry, **clock),
            fleet_restarts=rd.restart_times(None, include_dry_run=dry, after_action=br.reset_after_action, **clock),
            breaker_open=br.open, markers=markers, has_action=bool(backend.restart), dry_run=dry,
            unresponsive_since=unresponsive_since,
        )

    def sample_gap(self) -> float:
        """Two `unresponsive` verifications further apart than this are not one unbroken run: about two
        verifications (each reading and its /health check at their deadlines) plus a retry and a poll."""
        span = (max(2, self.r.verify_readings) - 1) * self.r.verify_interval + \
            max(2, self.r.verify_readings) * 2 * self.config.exporter.read_timeout
        return 2 * span + self.settings.unknown_retry + self.r.poll_interval

    def record_verification(self, tx: Transaction, inc: Incident, verification: Any, now: float,
                            t: float) -> float | None:
        """Keep the latest verification on the incident (the agent answers from it) and the start of an
        unbroken run of `unresponsive` (monotonic): consecutive samples only, so a gap longer than
        sample_gap() (the incident deferred by its host's mutex, say, with no check at all) starts the
        run over. Returns that start as wall time for policy, or None."""
        outcome = verification.outcome
        since: float | None = None
        seen: float | None = None
        if outcome == VerifyOutcome.UNRESPONSIVE:
            prior, last = inc.unresponsive_since, inc.unresponsive_seen_at
            unbroken = prior is not None and last is not None and t - float(last) <= self.sample_gap()
            since = float(prior) if unbroken and prior is not None else t
            seen = t
        tx.record_verification(inc.id, outcome, now, since, seen)
        return None if since is None else now - (t - since)

    # -- the gates that need the fleet: per-host mutex, concurrency bound, min_ready floor ----------
    def gate_states(self, rd: Reads) -> dict[str, LifecycleState]:
        return lifecycle.gate_states(rd.lifecycles(), [b.name for b in self.config.backends])

    def host_gate(self, rd: Reads, backend: Backend) -> policy.Decision | None:
        ok, why = lifecycle.may_start(backend.name, backend.host, self.gate_states(rd),
                                      {b.name: b.host for b in self.config.backends})
        return None if ok else policy.Decision(DEFERRED_HOST, f"per-host mutex: {why}; waiting until it is "
                                               "READY or ERROR")

    def concurrency_gate(self, rd: Reads, incident_id: int, verification: Any = None) -> policy.Decision | None:
        """At most max_concurrent_restarts restarts take capacity at once (store.restarts_in_progress). A
        backend verified down serves nothing: its restart takes no slot and waits for none."""
        if verification is not None and verification.outcome == VerifyOutcome.DOWN:
            return None
        limit = max(1, self.r.max_concurrent_restarts)
        warming_until = self.clocks.mono() + self.r.warmup_timeout - self.r.restart_slot_warmup
        busy = rd.restarts_in_progress(except_incident=incident_id, warming_until=warming_until)
        if busy < limit:
            return None
        return policy.Decision(DEFERRED_CONCURRENCY, f"{busy} restarts already in progress "
                               f"(remediator.max_concurrent_restarts {limit}); waiting for one to finish")

    def floor_gate(self, rd: Reads, backend: Backend, verification: Any, now: float) -> policy.Decision | None:
        ok, why = lifecycle.may_drain(backend.name, self.gate_states(rd), self.r.min_ready,
                                      self.serves_nothing(rd, backend, verification))
        if ok:
            return None
        return policy.Decision(DEFERRED_MIN_READY, f"fleet floor: {why}; a stalled backend still counts as up, "
                               "so it waits", retry_at=now + self.settings.unknown_retry)

    @staticmethod
    def serves_nothing(rd: Reads, backend: Backend, verification: Any) -> bool:
        """Down (verified), or not READY in our lifecycle: taking it out lowers no capacity."""
        if verification is not None and verification.outcome == VerifyOutcome.DOWN:
            return True
        return rd.lifecycle_state(backend.name) != S.READY

    # == step: begin (drain a serving backend, or claim at once) ===================================
    def begin(self, tx: Transaction, incident_id: int, backend: Backend, d: policy.Decision, verification: Any,
              baseline: InFlight | None, now: float, t: float) -> int | None:
        """Drain a serving backend (returns None), or claim at once (returns the action id) when there
        is nothing to drain."""
        state = tx.lifecycle_state(backend.name)
        outcome = verification.outcome
        if state == S.READY and outcome != VerifyOutcome.DOWN:
            stalled = outcome in (VerifyOutcome.NO_PROGRESS, VerifyOutcome.UNRESPONSIVE)
            timeout = self.r.stalled_drain_timeout if stalled else self.r.drain_timeout
            baseline = baseline or InFlight(None, None, None, "not read")
            if not tx.move_lifecycle(backend.name, S.DRAINING, now,
                                     f"restart decided ({d.reason}); no new requests, waiting up to {timeout:g}s for "
                                     f"in-flight work ({baseline.describe()})", incident_id,
                                     drain_deadline=t + timeout, drain_baseline=baseline.reading):
                return None
            tx.move_incident(incident_id, now, DRAINING, last_decision=policy.RESTART, last_note="",
                             next_check_at=0.0)
            tx.event(now, "draining", backend.name, incident_id,
                     reason=f"{d.reason}; draining for up to {timeout:g}s "
                     f"({'stalled: it finishes nothing' if stalled else 'drain_timeout'})")
            return None
        if state == S.READY:
            if not tx.move_lifecycle(backend.name, S.STOPPED, now, f"already down, nothing to drain: {d.reason}",
                                     incident_id):
                return None
        return self.claim(tx, incident_id, backend, d, now)

    # == step: watch the drain ======================================================================
    def watch_drain(self, incident_id: int, backend: Backend) -> None:
        seen = self.in_flight_now(backend)
        verification = None
        if self.drain_ends(backend, seen) and self.needs_recheck(self.store, incident_id, backend):
            # the alerts resolved meanwhile, or the drain has no starting reading to tell progress from:
            # the pre-drain verification alone is not enough to act on (principle 6)
            verification = self.probing(backend, VERIFY, self.checks.verifier)
        now, t = self.clocks.wall(), self.clocks.mono()
        claimed: int | None = None
        unsilence = False
        with self.store.tx() as tx:
            inc = tx.incident_in(incident_id, DRAINING)
            r = tx.lifecycle(backend.name)
            if inc is None:
                return
            if r is None or r.state != S.DRAINING:
                # not ours to drain any more (refused or changed by hand): stop, say so, retry from scratch
                tx.move_incident(incident_id, now, OPEN, last_decision="drain_lost", last_note="")
                tx.event(now, "lifecycle_refused", backend.name, incident_id,
                         reason=f"incident {incident_id} is draining but the lifecycle is "
                         f"{r.state if r else 'missing'}; back to open")
                return
            deadline = float(r.drain_deadline or t)
            moved = inflight.moved(r.drain_baseline, seen.reading)
            if not seen.drained and not moved and t < deadline:
                tx.look_again_at(incident_id, t + self.r.poll_interval)
                return
            if moved:
                unsilence = True
                tx.move_lifecycle(backend.name, S.READY, now, f"restart called off: {moved}")
                tx.move_incident(incident_id, now, CLOSED, close_reason=policy.VERIFIED_HEALTHY,
                                 last_decision="restart_called_off")
                tx.event(now, "restart_called_off", backend.name, incident_id,
                         reason=f"{moved} ({seen.describe()}): not stalled, no restart; incident closed")
            else:
                blocked = policy.gates(self.facts(tx, backend, now), self.settings)
                why = ("in-flight work finished" if seen.drained else f"drain timeout, still {seen.describe()}")
                if blocked is not None:
                    unsilence = True
                    tx.move_lifecycle(backend.name, S.READY, now, f"restart called off: {blocked.reason}")
                    tx.move_incident(incident_id, now, OPEN, last_note="")
                    self.note(tx, incident_id, backend.name, blocked, now)
                elif verification is None and self.needs_recheck(tx, incident_id, backend):
                    # changed since we looked (e.g. the alert resolved just now): re-verify next poll
                    tx.look_again_at(incident_id, t)
                elif verification is not None:
                    claimed, unsilence = self.after_recheck(tx, inc, backend, verification, why, now, t)
                elif self.still_holder(tx):
                    if tx.move_lifecycle(backend.name, S.STOPPED, now, why, incident_id):
                        d = policy.Decision(policy.RESTART, f"verified before the drain; drained: {why}")
                        claimed = self.claim(tx, incident_id, backend, d, now)
        if unsilence:
            self.unsilence_safely(backend.name)
        if claimed is not None:
            self.carry_out(incident_id, claimed, backend, silence=False)

    def in_flight_now(self, backend: Backend) -> InFlight:
        try:
            return self.checks.in_flight(backend)
        except Exception as exc:  # noqa: BLE001 - an unreadable backend is "unknown", never "drained"
            return InFlight(None, None, None, f"reading failed: {exc!r}")

    def drain_ends(self, backend: Backend, seen: InFlight) -> bool:
        """Read-only: would this look at the drain end it without progress (drained, or deadline)?"""
        r = self.store.lifecycle(backend.name)
        if r is None or r.state != S.DRAINING:
            return False
        if inflight.moved(r.drain_baseline, seen.reading):
            return False
        return seen.drained or self.clocks.mono() >= float(r.drain_deadline or 0.0)

    @staticmethod
    def needs_recheck(rd: Reads, incident_id: int, backend: Backend) -> bool:
        """Re-verify before claiming: no alert of the incident fires any more, or the drain's starting
        reading failed (so progress during the drain could not be seen)."""
        r = rd.lifecycle(backend.name)
        return not rd.firing_alerts(incident_id) or r is None or r.drain_baseline is None

    def after_recheck(self, tx: Transaction, inc: Incident, backend: Backend, verification: Any, why: str,
                      now: float, t: float) -> tuple[int | None, bool]:
        """The drain is over and the backend was verified again: restart, or call it off. Returns
        (claimed action id, whether to remove the silence)."""
        incident_id = inc.id
        since = self.record_verification(tx, inc, verification, now, t)
        d = policy.decide(self.facts(tx, backend, now, since), verification, self.settings)
        firing = tx.firing_alerts(incident_id)
        if d.kind == policy.RESTART:
            if not self.still_holder(tx) or not tx.move_lifecycle(backend.name, S.STOPPED, now, why, incident_id):
                return None, False
            d = policy.Decision(policy.RESTART, f"re-verified at the end of the drain ({why}): {d.reason}")
            return self.claim(tx, incident_id, backend, d, now), False
        if d.kind in policy.NO_RESTART_CLOSES:
            tx.move_lifecycle(backend.name, S.READY, now, f"restart called off: {d.reason}")
            tx.move_incident(incident_id, now, CLOSED, close_reason=d.kind, last_decision=d.kind)
            tx.event(now, d.kind, backend.name, incident_id,
                     reason=f"re-verified at the end of the drain{'' if firing else ' (alerts resolved)'}: "
                     f"{d.reason}; incident closed, no restart")
            return None, True
        tx.move_lifecycle(backend.name, S.READY, now, f"restart called off: {d.reason}")
        if not firing:
            tx.move_incident(incident_id, now, CLOSED, close_reason="resolved", last_decision=d.kind)
            tx.event(now, "resolved", backend.name, incident_id,
                     reason=f"alerts resolved during the drain and the re-verification cannot confirm the "
                     f"restart ({d.reason}); incident closed, no restart")
        else:
            tx.move_incident(incident_id, now, OPEN, last_note="")
            self.note(tx, incident_id, backend.name, d, now)
        return None, True

    # == step: claim (intent first: reserves budget and backoff; never repeated) =====================
    def claim(self, tx: Transaction, incident_id: int, backend: Backend, d: policy.Decision, now: float) -> int:
        """Record the intent (and where the action's exit status will go) and move to RESTARTING."""
        action_id = tx.add_action(incident_id, backend.name, " ".join(backend.restart)[:2000], self.holder, now,
                                  self.clocks.mono(), self.clocks.boot)
        files = self.action_files(action_id)
        if files is not None:
            tx.set_status_path(action_id, str(files.status))
        st = tx.lifecycle_state(backend.name)
        if st == S.ERROR:
            tx.move_lifecycle(backend.name, S.INITIALIZING, now, f"restart started from ERROR: {d.reason}", incident_id)
        elif st == S.INITIALIZING:
            tx.set_lifecycle_owner(backend.name, incident_id)   # never READY yet: the restart takes it over
        tx.move_incident(incident_id, now, RESTARTING, last_decision=policy.RESTART, last_note="")
        tx.event(now, "restarting", backend.name, incident_id, reason=d.reason, action_id=action_id)
        return action_id

    def action_files(self, action_id: int) -> act.ActionFiles | None:
        """Where the default runner puts this action's pid, output and exit status (None for an injected
        runner that keeps no files)."""
        if self.action_dir is None or not getattr(self.checks.runner, "keeps_files", False):
            return None
        return act.ActionFiles(self.action_dir, str(action_id))

    # == step: act (run the argv; record its result) =================================================
    def carry_out(self, incident_id: int, action_id: int, backend: Backend, *, silence: bool) -> None:
        """Silence (optionally) and run a claimed restart. Anything raising between the claim and the
        recorded result (SQLite busy, the runner failing to start the argv, Alertmanager client errors)
        must not leave the incident RESTARTING, the lifecycle STOPPED and the host mutex held: the
        restart is aborted into needs_ack (outcome unknown, never repeated blindly)."""
        with self._running_lock:
            self._running[action_id] = backend.name
        try:
            if silence:
                self.silence(incident_id, backend)
            self.act(incident_id, action_id, backend)
        except Exception as exc:  # noqa: BLE001 - the state machine must always reach a resting state
            log.exception("restart of %s (incident %s, action %s) failed", backend.name, incident_id, action_id)
            self.abort(incident_id, action_id, backend, exc)
        finally:
            with self._running_lock:
                self._running.pop(action_id, None)

    def running_here(self, action_id: int) -> bool:
        with self._running_lock:
            return action_id in self._running

    def acting_on(self) -> set[str]:
        """Backends whose restart action runs in this process now."""
        with self._running_lock:
            return set(self._running.values())

    def act(self, incident_id: int, action_id: int, backend: Backend) -> None:
        env = {"LLM_HEALTH_BACKEND": backend.name, "LLM_HEALTH_INCIDENT": str(incident_id),
               "LLM_HEALTH_ACTION": str(action_id)}
        result = self.checks.runner(backend.restart, self.r.action_timeout, env)
        self.record_result(incident_id, action_id, backend.name, result)

    def watch_action(self, incident_id: int, backend: Backend) -> None:
        """RESTARTING and no argv of ours running: a previous authority's action. Collect its real exit
        status (the wrapper outlives us) instead of guessing; still running -> look again later."""
        row = self.store.unfinished_action(incident_id)
        if row is None or self.running_here(row.id) or not row.status_path:
            return                    # ours (a worker is on it) or nothing to collect: recover() decides
        path = Path(row.status_path)
        files = act.ActionFiles(path.parent, path.name.removesuffix(".status"))
        result = act.collect(files)
        if result is None:
            with self.store.tx() as tx:
                tx.look_again_at(incident_id, self.clocks.mono() + self.r.poll_interval)
            return
        self.record_result(incident_id, row.id, backend.name, result, collected=True)

    def record_result(self, incident_id: int, action_id: int, backend: str, result: act.ActionResult,
                      collected: bool = False) -> None:
        """Record what the action did and move the incident on. Only the authority that records the outcome
        acts on it: a deposed holder whose action finished late (its lease was taken, the new holder
        collected the exit status from the wrapper's file) writes a `late_result` naming what was recorded,
        and leaves the incident, the lifecycle and the silence to the new holder."""
        now, t = self.clocks.wall(), self.clocks.mono()
        with self.store.tx() as tx:
            detail: dict[str, Any] = {"action_id": action_id, "exit_code": result.exit_code,
                                      "output": result.output[-1000:]}
            if not self.still_holder(tx):
                # deposed while the action ran: the new holder collects the exit status from the wrapper's
                # file (kept for it) and carries the incident on; nothing here may move it
                tx.event(now, "late_result", backend, incident_id,
                         reason=f"action finished ({result.result}) after this authority ({self.holder}) lost "
                         "the lease: recorded nothing, the new holder collects the outcome and carries on",
                         **{**detail, "seen_here": result.result})
                return
            updated = tx.finish_action(action_id, now, result.result, result.exit_code, result.output)
            if collected:
                detail["collected"] = "exit status collected from the action's status file after a takeover"
            if not updated:
                row = tx.action(action_id)
                recorded = (f"{row.holder} recorded {row.result}"
                            + (f" (exit {row.exit_code})" if row.exit_code is not None else "")
                            if row is not None else "the action is no longer in the store")
                tx.event(now, "late_result", backend, incident_id,
                         reason=f"action finished after another authority took over: {recorded}; this "
                         f"authority saw {result.result}, recorded nothing and leaves the rest to it",
                         **{**detail, "seen_here": result.result})
                return
            if collected and tx.incident_in(incident_id, RESTARTING) is None:
                tx.event(now, "late_result", backend, incident_id,
                         reason=f"action finished ({result.result}); the incident moved on meanwhile "
                         "(acknowledged or closed): recorded only", **detail)
                return
            if result.result == act.OK:
                if tx.lifecycle_state(backend) == S.STOPPED:
                    tx.move_lifecycle(backend, S.INITIALIZING, now,
                                      f"restart action exited 0; warming up (up to {self.r.warmup_timeout:g}s)",
                                      incident_id)
                tx.move_incident(incident_id, now, WARMING, warm_deadline=t + self.r.warmup_timeout,
                                 last_decision="restarted", next_check_at=0.0)
                tx.event(now, "restarted", backend, incident_id,
                         reason=f"restart action exited 0; warming up (up to {self.r.warmup_timeout:g}s)", **detail)
            elif result.outcome_unknown:
                what = (f"timed out after {self.r.action_timeout:g}s" if result.result == act.TIMEOUT
                        else "ended without an exit status")
                tx.move_lifecycle(backend, S.ERROR, now, f"restart action {what}: outcome unknown", incident_id)
                self.escalate(tx, backend, incident_id, now, f"restart action {what}")
                tx.move_incident(incident_id, now, NEEDS_ACK, last_decision="failed")
                tx.event(now, "failed", backend, incident_id,
                         reason=f"restart action {what}: outcome unknown, not retried (acknowledge via "
                         "API, or it closes when the backend answers again)", result=result.result, **detail)
            else:
                tx.move_lifecycle(backend, S.ERROR, now, f"restart action failed (exit {result.exit_code})",
                                  incident_id)
                tx.move_incident(incident_id, now, OPEN, last_decision="failed", last_note="")
                tx.event(now, "failed", backend, incident_id,
                         reason=f"restart action failed (exit {result.exit_code}); next attempt only after "
                         "backoff", result=result.result, **detail)
        if result.result != act.OK:
            self.unsilence_safely(backend)     # nothing to warm up: its alerts must page people again
        self.forget_files(action_id)

    def forget_files(self, action_id: int) -> None:
        """The result is in the store: the action's files are not needed any more."""
        if self.action_dir is not None:
            act.ActionFiles(self.action_dir, str(action_id)).remove()

    def abort(self, incident_id: int, action_id: int, backend: Backend, exc: BaseException) -> None:
        reason = f"restart aborted by an error of the remediator ({exc.__class__.__name__}: {exc})"[:500]
        try:
            now = self.clocks.wall()
            with self.store.tx() as tx:
                done = tx.finish_action(action_id, now, ActionResultKind.ERROR, None, reason)
                restarting = tx.incident_in(incident_id, RESTARTING) is not None
                if restarting:
                    tx.move_incident(incident_id, now, NEEDS_ACK, last_decision="aborted")
                if done or restarting:
                    if tx.lifecycle_state(backend.name) != S.ERROR:
                        tx.move_lifecycle(backend.name, S.ERROR, now, f"{reason}: outcome unknown", incident_id)
                    tx.event(now, "aborted", backend.name, incident_id,
                             reason=f"{reason}; the action may or may not have run: not repeated "
                             "(acknowledge via POST /api/backends/<name>/ack, or the incident closes when "
                             "the backend answers again)", action_id=action_id)
                    self.escalate(tx, backend.name, incident_id, now, reason)
        except Exception:  # noqa: BLE001 - e.g. the database is still locked: recover() sweeps it next pass
            log.exception("could not record the aborted restart of %s; recovering on the next pass", backend.name)
            self.on_abort_unrecorded()
            return
        self.unsilence_safely(backend.name)

    def on_abort_unrecorded(self) -> None:
        """Hook: the authority sets it to run recover() again (replaced in Authority)."""

    # == step: warm up ==============================================================================
    def watch_warmup(self, incident_id: int, backend: Backend, deadline: float) -> None:
        if self.clocks.mono() > deadline:
            self.warmup_timed_out(incident_id, backend, "")
            return
        ready, why = self.probing(backend, WARMUP, self.checks.warmup_check)
        if ready:
            self.unsilence_safely(backend.name)
        now, t = self.clocks.wall(), self.clocks.mono()
        if not ready and t > deadline:       # the check itself ran past the deadline: time out now
            self.warmup_timed_out(incident_id, backend, why)
            return
        with self.store.tx() as tx:
            if tx.incident_in(incident_id, WARMING) is None:
                return
            if ready:
                if tx.lifecycle_state(backend.name) == S.INITIALIZING:
                    tx.move_lifecycle(backend.name, S.READY, now, f"warm: {why}", incident_id)
                tx.move_incident(incident_id, now, CLOSED, close_reason="recovered", last_decision="recovered")
                tx.event(now, "recovered", backend.name, incident_id, reason=why + "; incident closed")
            else:
                tx.look_again_at(incident_id, t + self.r.warmup_poll, note=why[:200])

    def warmup_timed_out(self, incident_id: int, backend: Backend, last: str) -> None:
        self.unsilence_safely(backend.name)
        now = self.clocks.wall()
        with self.store.tx() as tx:
            if tx.incident_in(incident_id, WARMING) is None:
                return
            why = f"not warm {self.r.warmup_timeout:g}s after the restart" + (f" (last check: {last})" if last else "")
            tx.move_lifecycle(backend.name, S.ERROR, now, f"warm-up timeout: {why}", incident_id)
            tx.move_incident(incident_id, now, NEEDS_ACK, last_decision="warmup_timeout")
            tx.event(now, "warmup_timeout", backend.name, incident_id, reason=f"{why}; needs a person, not restarted again")
            self.escalate(tx, backend.name, incident_id, now, f"warm-up timeout: {why}")

    def watch_recovery(self, incident_id: int, backend: Backend) -> None:
        """An incident with an unknown outcome closes by itself once the backend answers again."""
        ready, why = self.probing(backend, WARMUP, self.checks.warmup_check)
        if ready:
            self.unsilence_safely(backend.name)
        now, t = self.clocks.wall(), self.clocks.mono()
        with self.store.tx() as tx:
            if tx.incident_in(incident_id, NEEDS_ACK) is None:
                return
            if ready:
                st = tx.lifecycle_state(backend.name)
                if st in (S.ERROR, S.STOPPED):
                    tx.move_lifecycle(backend.name, S.INITIALIZING, now, f"answers again: {why}", incident_id)
                if tx.lifecycle_state(backend.name) == S.INITIALIZING:
                    tx.move_lifecycle(backend.name, S.READY, now, f"warm: {why}", incident_id)
                tx.move_incident(incident_id, now, CLOSED, close_reason="recovered", last_decision="recovered")
                tx.event(now, "recovered", backend.name, incident_id, reason=why + "; incident closed")
            else:
                tx.look_again_at(incident_id, t + self.r.warmup_poll)

    # == bookkeeping shared by the steps =============================================================
    def note(self, tx: Transaction, incident_id: int, backend: str, d: policy.Decision, now: float) -> None:
        """Record a decision that is not a restart; repeated identical deferrals are logged once."""
        if d.opens_breaker and not tx.breaker().open:
            tx.open_breaker(now, d.reason)
            tx.event(now, "breaker_open", backend, incident_id, reason=d.reason)
        if d.kind in policy.NO_RESTART_CLOSES:
            tx.move_incident(incident_id, now, CLOSED, close_reason=d.kind, last_decision=d.kind)
            tx.event(now, d.kind, backend, incident_id, reason=d.reason + "; incident closed, no restart")
            return
        if d.kind == policy.WOULD_RESTART:
            tx.add_dry_run(incident_id, backend, self.holder, now, self.clocks.mono(), self.clocks.boot)
            tx.move_incident(incident_id, now, OBSERVED, last_decision=d.kind)
            tx.event(now, d.kind, backend, incident_id, reason="dry run: " + d.reason)
            return
        if d.kind == policy.NOT_CONFIGURED:
            tx.move_incident(incident_id, now, OBSERVED, last_decision=d.kind)
            tx.event(now, d.kind, backend, incident_id, reason=d.reason)
            return
        key = d.kind + (d.reason.split(" until ")[0] if d.kind == policy.DEFERRED_MARKER else "")
        inc = tx.incident(incident_id)
        next_check = 0.0
        if d.kind in (policy.DEFERRED_UNKNOWN, DEFERRED_MIN_READY) and d.retry_at:
            next_check = self.clocks.mono() + (d.retry_at - now)     # policy answers in wall time
        tx.note_decision(incident_id, now, key, d.kind, next_check)
        if inc is None or inc.last_note != key:
            tx.event(now, d.kind, backend, incident_id, reason=d.reason, retry_at=d.retry_at)

    @staticmethod
    def escalate(tx: Transaction, backend: str, incident_id: int | None, now: float, reason: str) -> None:
        tx.bump("escalations", backend)
        tx.event(now, "escalated", backend, incident_id, reason=reason + "; needs a person (see the "
                 "status page; acknowledge via POST /api/backends/<name>/ack)")

    def close(self, incident_id: int, backend: str, kind: str, reason: str) -> None:
        """Close an incident whatever its state. A lifecycle its restart still owns (draining, stopped,
        initializing) is released to ERROR: otherwise the backend, once back in the fleet, would hold
        its host's mutex and defer its own restarts forever."""
        now = self.clocks.wall()
        with self.store.tx() as tx:
            tx.move_incident(incident_id, now, CLOSED, close_reason=reason)
            tx.event(now, kind, backend, incident_id, reason=reason)
            r = tx.lifecycle(backend)
            if r is not None and r.incident_id == incident_id and r.state != S.ERROR:
                tx.move_lifecycle(backend, S.ERROR, now, f"incident {incident_id} closed mid-restart: {reason}")

    def probing(self, backend: Backend, purpose: str, check: Callable[[Backend], Any]) -> Any:
        """Run a verifier / warm-up check and count the probes it sent (`probes` counters in SQLite)."""
        sink: list[str] = []
        token = probe_log.set(sink)
        try:
            return check(backend)
        finally:
            probe_log.reset(token)
            if sink:
                try:
                    with self.store.tx() as tx:
                        tx.bump("probes", f"{backend.name}\t{purpose}", len(sink))
                except Exception:  # noqa: BLE001 - counting must never stop the restart procedure
                    log.exception("could not count %d probe(s) to %s", len(sink), backend.name)

    # -- silences -----------------------------------------------------------------------------------
    def silence(self, incident_id: int, backend: Backend) -> None:
        """Mute the backend's alerts for the whole restart (it ends by itself if we crash). Failures are
        recorded and never hold the restart back."""
        am = self.r.alertmanager_url
        if not am:
            return
        seconds = self.r.drain_timeout + self.r.action_timeout + self.r.warmup_timeout + SILENCE_MARGIN
        try:
            sid = create_silence(am, backend.name, seconds / 60.0,
                                 f"llm-health remediator: restart of {backend.name} (incident {incident_id})",
                                 "llm-health-remediator", timeout=SILENCE_TIMEOUT)
        except SilenceError as exc:
            now = self.clocks.wall()
            with self.store.tx() as tx:
                tx.bump("silences", "create_failed")
                tx.event(now, "silence_failed", backend.name, incident_id,
                         reason=f"could not silence the restart's alerts (restart goes on): {exc}")
            return
        now = self.clocks.wall()
        with self.store.tx() as tx:
            tx.add_silence(Silence(sid, backend.name, incident_id, now, now + seconds))
            tx.bump("silences", "created")
            tx.event(now, "silence_created", backend.name, incident_id,
                     reason=f"alerts with backend={backend.name} silenced for {seconds:g}s (id {sid})", silence_id=sid)

    def unsilence(self, backend: str) -> None:
        am = self.r.alertmanager_url
        for s in self.store.active_silences(backend):
            try:
                if not am:
                    raise SilenceError("remediator.alertmanager_url is no longer set")
                known = expire_silence(am, s.id, timeout=SILENCE_TIMEOUT)
            except SilenceError as exc:
                now = self.clocks.wall()
                with self.store.tx() as tx:
                    tx.bump("silences", "expire_failed")
                    tx.event(now, "silence_expire_failed", backend, s.incident_id,
                             reason=f"could not expire silence {s.id} (it ends by itself at its end time): {exc}",
                             silence_id=s.id)
                    if now >= s.ends_at:
                        tx.end_silence(s.id, now, "ended")
                continue
            now = self.clocks.wall()
            with self.store.tx() as tx:
                tx.end_silence(s.id, now, "expired" if known else "gone")
                tx.bump("silences", "expired")
                tx.event(now, "silence_expired", backend, s.incident_id,
                         reason=f"silence {s.id} removed: the restart is over", silence_id=s.id)

    def silence_safely(self, incident_id: int, backend: Backend) -> None:
        try:
            self.silence(incident_id, backend)
        except Exception:  # noqa: BLE001 - silences never hold a restart back
            log.exception("silencing %s failed", backend.name)

    def unsilence_safely(self, backend: str) -> None:
        try:
            self.unsilence(backend)
        except Exception:  # noqa: BLE001 - the silence ends by itself at its end time
            log.exception("removing the silence of %s failed", backend)
