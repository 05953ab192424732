"""The one restart authority: a thread that holds a lease row in SQLite and carries incidents through.

Every gunicorn worker runs an `Authority`; only the lease holder acts. On top of the lease, every
claim (OPEN -> RESTARTING) is an atomic state transition inside BEGIN IMMEDIATE that also records the
intent (an `actions` row, which is what the budget and backoff count) BEFORE the argv runs, so two
authorities, or one that crashed mid-restart, can never repeat a restart.

The restart procedure is a sequence of explicit steps, each a method, so that draining, silences,
load-balancer agent state and per-host mutexes can slot in between later:

    consider (gates) -> verify -> claim (intent) -> act -> warm up -> recovered | needs_ack
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from llm_health.config import Backend, Config
from remediator import action as act
from remediator import policy
from remediator.marker import file_markers
from remediator.store import CLOSED, NEEDS_ACK, OBSERVED, OPEN, RESTARTING, WARMING, Store

log = logging.getLogger("llm_health.remediator")

LEASE = "authority"


@dataclass(frozen=True)
class SimpleVerification:
    outcome: str
    reason: str
    in_flight: int | None = None


Verifier = Callable[[Backend], Any]                  # -> object with .outcome and .reason
WarmupCheck = Callable[[Backend], tuple[bool, str]]  # -> (ready, why)
Runner = Callable[[Sequence[str], float, dict[str, str]], act.ActionResult]


def default_verifier(config: Config) -> Verifier:
    """exporter.check.verify with the configured readings; any error is `unknown` (fail closed)."""
    r = config.remediator

    def verify_backend(backend: Backend) -> Any:
        try:
            from exporter.check import verify
        except ImportError as exc:
            return SimpleVerification("unknown", f"verifier unavailable: {exc}")
        try:
            return verify(
                backend.url, readings=max(2, r.verify_readings), interval=r.verify_interval,
                read_timeout=config.exporter.read_timeout, probe_timeout=config.exporter.probe_timeout,
                sleep=time.sleep, clock=time.time, model=backend.model,
            )
        except Exception as exc:  # noqa: BLE001 - a broken verifier must never mean "restart"
            return SimpleVerification("unknown", f"verification raised {exc!r}")

    return verify_backend


def default_warmup_check(config: Config, verifier: Verifier) -> WarmupCheck:
    """Ready = /health 200, /v1/models 200 (listing the configured model), and a healthy verification."""
    timeout = config.exporter.read_timeout

    def check(backend: Backend) -> tuple[bool, str]:
        try:
            health = requests.get(f"{backend.url}/health", timeout=timeout)
            if health.status_code != 200:
                return False, f"/health answered {health.status_code}"
            models = requests.get(f"{backend.url}/v1/models", timeout=timeout)
            if models.status_code != 200:
                return False, f"/v1/models answered {models.status_code}"
            if backend.model:
                ids = [m.get("id") for m in models.json().get("data", []) if isinstance(m, dict)]
                if backend.model not in ids:
                    return False, f"/v1/models does not list {backend.model!r} yet"
        except (requests.RequestException, ValueError, AttributeError) as exc:
            return False, f"not answering: {exc.__class__.__name__}"
        v = verifier(backend)
        outcome = str(getattr(v, "outcome", "unknown"))
        if outcome in policy.HEALTHY_OUTCOMES:
            return True, f"answers again: /health, /v1/models, verify {outcome}"
        return False, f"verify {outcome}: {getattr(v, 'reason', '')}"

    return check


def _runner(argv: Sequence[str], timeout: float, env: dict[str, str]) -> act.ActionResult:
    return act.run_action(argv, timeout, env)


class Authority:
    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        verifier: Verifier | None = None,
        warmup_check: WarmupCheck | None = None,
        clock: Callable[[], float] = time.time,
        runner: Runner = _runner,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.r = config.remediator
        self.verifier = verifier or default_verifier(config)
        self.warmup_check = warmup_check or default_warmup_check(config, self.verifier)
        self.clock = clock
        self.runner = runner
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.settings = policy.Settings(
            backoff=self.r.backoff, budget=self.r.budget, breaker=self.r.breaker,
            unknown_retry=max(self.r.verify_interval, self.r.poll_interval),
        )
        self.lease_ttl = max(5.0, 10 * self.r.poll_interval)
        self.busy_dir = config.resolve_path(self.r.busy_dir) if self.r.busy_dir else None
        self._stop = threading.Event()
        self._holding = threading.Event()
        self._recovered = False
        self._threads: list[threading.Thread] = []

    # -- thread lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for target, name in ((self._lease_loop, "lease"), (self._work_loop, "authority")):
            t = threading.Thread(target=target, name=f"remediator-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _lease_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.renew_lease()
            except Exception:  # noqa: BLE001 - keep the authority alive; log and retry
                log.exception("lease renewal failed")
                self._holding.clear()
            self._stop.wait(self.lease_ttl / 4)

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001
                log.exception("authority tick failed")
            self._stop.wait(self.r.poll_interval)

    # -- the lease ----------------------------------------------------------------------------------
    def renew_lease(self) -> bool:
        now = self.clock()
        with self.store.tx() as c:
            row = c.execute("SELECT holder, expires_at FROM lease WHERE name = ?", (LEASE,)).fetchone()
            if row is None or row["holder"] == self.holder or float(row["expires_at"]) < now:
                c.execute("INSERT INTO lease (name, holder, expires_at) VALUES (?,?,?) ON CONFLICT(name) "
                          "DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at",
                          (LEASE, self.holder, now + self.lease_ttl))
                if row is None or row["holder"] != self.holder:
                    self._recovered = False  # newly ours: look for restarts a previous holder left unfinished
                    Store.event(c, now, "lease_acquired", reason=f"{self.holder} is the restart authority",
                                previous=row["holder"] if row else None)
                self._holding.set()
                return True
        self._holding.clear()
        return False

    def _still_holder(self, c: Any, now: float) -> bool:
        row = c.execute("SELECT holder, expires_at FROM lease WHERE name = ?", (LEASE,)).fetchone()
        return row is not None and row["holder"] == self.holder and float(row["expires_at"]) >= now

    # -- one pass over the active incidents ---------------------------------------------------------
    def tick(self) -> None:
        if not self._holding.is_set():
            return
        if not self._recovered:
            self.recover()
            self._recovered = True
        for inc in self.store.active_incidents():
            if self._stop.is_set() or not self._holding.is_set():
                return
            if float(inc["next_check_at"]) > self.clock():
                continue
            backend = self.config.backend(inc["backend"])
            if backend is None:
                self._close(int(inc["id"]), inc["backend"], "closed", "backend no longer configured")
                continue
            state = inc["state"]
            if state == OPEN:
                self.consider(int(inc["id"]), backend)
            elif state == WARMING:
                self.watch_warmup(int(inc["id"]), backend, float(inc["warm_deadline"] or 0))
            elif state == NEEDS_ACK:
                self.watch_recovery(int(inc["id"]), backend)

    def recover(self) -> None:
        """After taking the lease: actions another (dead) holder started and never finished may have
        restarted the backend. Count them (they are already in the budget) and never repeat them."""
        now = self.clock()
        with self.store.tx() as c:
            rows = c.execute("SELECT * FROM actions WHERE result IS NULL AND holder != ?",
                             (self.holder,)).fetchall()
            for a in rows:
                c.execute("UPDATE actions SET result = 'interrupted', finished_at = ? WHERE id = ?", (now, a["id"]))
                inc = c.execute("SELECT * FROM incidents WHERE id = ?", (a["incident_id"],)).fetchone()
                if inc is not None and inc["state"] == RESTARTING:
                    Store.set_state(c, int(inc["id"]), now, NEEDS_ACK, last_decision="interrupted")
                Store.event(c, now, "interrupted", a["backend"], a["incident_id"],
                            reason="the remediator stopped while this restart was running: it may have "
                            "happened; not repeated (acknowledge via POST /api/backends/<name>/ack, or "
                            "the incident closes when the backend answers again or the alert resolves)",
                            action_id=a["id"], holder=a["holder"])

    # -- step 1: gates, verification, claim ---------------------------------------------------------
    def facts(self, c: Any, backend: Backend, now: float) -> policy.Facts:
        br = Store.breaker(c)
        dry = self.r.dry_run
        markers = Store.api_markers(c, backend.name)
        if self.busy_dir is not None:
            markers += file_markers(self.busy_dir, backend.name, self.r.busy_file_ttl)
        return policy.Facts(
            now=now, backend=backend.name,
            restarts=Store.restart_times(c, backend.name, include_dry_run=dry),
            fleet_restarts=Store.restart_times(c, None, since=float(br["reset_at"]), include_dry_run=dry),
            breaker_open=bool(br["open"]), markers=markers, has_action=bool(backend.restart), dry_run=dry,
        )

    def consider(self, incident_id: int, backend: Backend) -> None:
        now = self.clock()
        d = policy.decide(self.facts(self.store.conn(), backend, now), None, self.settings)
        if d.kind != policy.VERIFY:
            with self.store.tx() as c:
                inc = c.execute("SELECT state FROM incidents WHERE id = ?", (incident_id,)).fetchone()
                if inc is not None and inc["state"] == OPEN:
                    self._note(c, incident_id, backend.name, d, now)
            return
        verification = self.verifier(backend)
        now = self.clock()
        claimed: int | None = None
        with self.store.tx() as c:
            inc = c.execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone()
            if inc is None or inc["state"] != OPEN:
                return  # resolved or acknowledged while we verified
            d = policy.decide(self.facts(c, backend, now), verification, self.settings)
            if d.kind == policy.RESTART:
                if not self._still_holder(c, now):
                    return
                claimed = self.claim(c, incident_id, backend, d, now)
            else:
                self._note(c, incident_id, backend.name, d, now)
        if claimed is not None:
            self.act(incident_id, claimed, backend)

    def claim(self, c: Any, incident_id: int, backend: Backend, d: policy.Decision, now: float) -> int:
        """Record the intent (reserves budget and backoff) and move the incident to RESTARTING."""
        cur = c.execute(
            "INSERT INTO actions (incident_id, backend, argv, holder, started_at) VALUES (?,?,?,?,?)",
            (incident_id, backend.name, " ".join(backend.restart)[:2000], self.holder, now),
        )
        action_id = int(cur.lastrowid or 0)
        Store.set_state(c, incident_id, now, RESTARTING, last_decision=policy.RESTART, last_note="")
        Store.event(c, now, "restarting", backend.name, incident_id, reason=d.reason, action_id=action_id)
        return action_id

    def _note(self, c: Any, incident_id: int, backend: str, d: policy.Decision, now: float) -> None:
        """Record a decision that is not a restart; repeated identical deferrals are logged once."""
        if d.opens_breaker and not Store.breaker(c)["open"]:
            c.execute("UPDATE breaker SET open = 1, opened_at = ?, reason = ? WHERE id = 1", (now, d.reason))
            Store.event(c, now, "breaker_open", backend, incident_id, reason=d.reason)
        if d.kind in (policy.VERIFIED_HEALTHY, policy.RESTARTED_BY_OTHER):
            Store.set_state(c, incident_id, now, CLOSED, close_reason=d.kind, last_decision=d.kind)
            Store.event(c, now, d.kind, backend, incident_id, reason=d.reason + "; incident closed, no restart")
            return
        if d.kind == policy.WOULD_RESTART:
            c.execute("INSERT INTO actions (incident_id, backend, argv, holder, started_at, finished_at, result) "
                      "VALUES (?,?,?,?,?,?, 'dry_run')", (incident_id, backend, "", self.holder, now, now))
            Store.set_state(c, incident_id, now, OBSERVED, last_decision=d.kind)
            Store.event(c, now, d.kind, backend, incident_id, reason="dry run: " + d.reason)
            return
        if d.kind == policy.NOT_CONFIGURED:
            Store.set_state(c, incident_id, now, OBSERVED, last_decision=d.kind)
            Store.event(c, now, d.kind, backend, incident_id, reason=d.reason)
            return
        key = d.kind + (d.reason.split(" until ")[0] if d.kind == policy.DEFERRED_MARKER else "")
        inc = c.execute("SELECT last_note FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        next_check = d.retry_at if d.kind == policy.DEFERRED_UNKNOWN and d.retry_at else 0.0
        c.execute("UPDATE incidents SET last_note = ?, last_decision = ?, next_check_at = ?, updated_at = ? "
                  "WHERE id = ?", (key, d.kind, next_check, now, incident_id))
        if inc is None or inc["last_note"] != key:
            Store.event(c, now, d.kind, backend, incident_id, reason=d.reason, retry_at=d.retry_at)

    # -- step 2: the action ---------------------------------------------------------------------
    def act(self, incident_id: int, action_id: int, backend: Backend) -> None:
        env = {"LLM_HEALTH_BACKEND": backend.name, "LLM_HEALTH_INCIDENT": str(incident_id),
               "LLM_HEALTH_ACTION": str(action_id)}
        result = self.runner(backend.restart, self.r.action_timeout, env)
        now = self.clock()
        with self.store.tx() as c:
            updated = c.execute(
                "UPDATE actions SET result = ?, exit_code = ?, output = ?, finished_at = ? "
                "WHERE id = ? AND result IS NULL", (result.result, result.exit_code, result.output, now, action_id),
            ).rowcount
            detail = {"action_id": action_id, "exit_code": result.exit_code, "output": result.output[-1000:]}
            if not updated:
                Store.event(c, now, "late_result", backend.name, incident_id,
                            reason=f"action finished ({result.result}) after another authority took over",
                            **detail)
                return
            if result.result == act.OK:
                Store.set_state(c, incident_id, now, WARMING, warm_deadline=now + self.r.warmup_timeout,
                                last_decision="restarted")
                Store.event(c, now, "restarted", backend.name, incident_id,
                            reason=f"restart action exited 0; warming up (up to {self.r.warmup_timeout:g}s)",
                            **detail)
            elif result.outcome_unknown:
                Store.set_state(c, incident_id, now, NEEDS_ACK, last_decision="failed")
                Store.event(c, now, "failed", backend.name, incident_id,
                            reason=f"restart action timed out after {self.r.action_timeout:g}s: outcome unknown, "
                            "not retried (acknowledge via API, or it closes when the backend answers again)",
                            result=result.result, **detail)
            else:
                Store.set_state(c, incident_id, now, OPEN, last_decision="failed", last_note="")
                Store.event(c, now, "failed", backend.name, incident_id,
                            reason=f"restart action failed (exit {result.exit_code}); next attempt only after "
                            "backoff", result=result.result, **detail)

    # -- step 3: warm-up ------------------------------------------------------------------------
    def watch_warmup(self, incident_id: int, backend: Backend, deadline: float) -> None:
        now = self.clock()
        if now > deadline:
            with self.store.tx() as c:
                Store.set_state(c, incident_id, now, NEEDS_ACK, last_decision="warmup_timeout")
                Store.event(c, now, "warmup_timeout", backend.name, incident_id,
                            reason=f"not answering {self.r.warmup_timeout:g}s after the restart; needs a person")
            return
        ready, why = self.warmup_check(backend)
        now = self.clock()
        with self.store.tx() as c:
            inc = c.execute("SELECT state FROM incidents WHERE id = ?", (incident_id,)).fetchone()
            if inc is None or inc["state"] != WARMING:
                return
            if ready:
                Store.set_state(c, incident_id, now, CLOSED, close_reason="recovered", last_decision="recovered")
                Store.event(c, now, "recovered", backend.name, incident_id, reason=why + "; incident closed")
            else:
                c.execute("UPDATE incidents SET next_check_at = ?, last_note = ? WHERE id = ?",
                          (now + self.r.warmup_poll, why[:200], incident_id))

    def watch_recovery(self, incident_id: int, backend: Backend) -> None:
        """An incident with an unknown outcome closes by itself once the backend answers again."""
        ready, why = self.warmup_check(backend)
        now = self.clock()
        with self.store.tx() as c:
            inc = c.execute("SELECT state FROM incidents WHERE id = ?", (incident_id,)).fetchone()
            if inc is None or inc["state"] != NEEDS_ACK:
                return
            if ready:
                Store.set_state(c, incident_id, now, CLOSED, close_reason="recovered", last_decision="recovered")
                Store.event(c, now, "recovered", backend.name, incident_id, reason=why + "; incident closed")
            else:
                c.execute("UPDATE incidents SET next_check_at = ? WHERE id = ?",
                          (now + self.r.warmup_poll, incident_id))

    def _close(self, incident_id: int, backend: str, kind: str, reason: str) -> None:
        now = self.clock()
        with self.store.tx() as c:
            Store.set_state(c, incident_id, now, CLOSED, close_reason=reason)
            Store.event(c, now, kind, backend, incident_id, reason=reason)


def state_path(config: Config) -> Path:
    return config.resolve_path(config.remediator.state)
