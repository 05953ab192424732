"""The remediator's HAProxy agent: answers from SQLite, one listener per remediator.

`AgentAnswers.status_for(name)` builds the `AgentStatus` of a backend from the lifecycle rows and the active
incidents (so every process gives the same answer), plus a fresh KV-cache reading of the backend's own
/metrics (cached a few seconds) for the weight of a backend answered `up`:

* DRAINING -> `drain` (the authority's min_ready floor already allowed the drain)
* lifecycle READY and no reason to take it out -> `ready up W%` (a rollout's canary during its soak: at
  most remediator.rollout.canary_weight %, so a bad new version meets a reduced share of the traffic)
* reasons to take a server out (`down #reason`), and only these:
  - READY, and the authority's latest verification of its active incident (open / needs_ack / observed)
    is `down`, `no_progress` or `unresponsive`. A firing alert alone never takes a server out: when
    Prometheus loses sight of every backend, every alert fires, and taking them all out would be an
    outage of our own making;
  - lifecycle STOPPED, INITIALIZING or ERROR.
* never `down` in dry_run: a dry run changes nothing anywhere, the load balancer included (`ready up W%`);
* a READY backend is never taken `down` when that would leave fewer than `min_ready` *other* backends
  READY, up and in service: the answer is then `ready up W%` and `status_for` carries the true state and
  why it was kept up. HAProxy's own health check still takes out a server that does not answer at all.
  When every READY backend has a reason, each one sees no other up, so with min_ready >= 1 all stay up.
  The floor only keeps READY backends in: it never lets a STOPPED, INITIALIZING or ERROR one in (the
  lifecycle design's rule: only READY instances take traffic);
* an operator's hold wins over all of this, in a dry run too: drained -> `up drain` / `down drain`,
  retired -> `maint` (remediator/commands.py).

`AgentListener` binds `remediator.agent_listen` in a background thread. Under several gunicorn workers
each tries; the port takes one listener (SO_REUSEPORT is not set), the others fail quietly and retry every
few seconds, so a listener lost with a worker is taken over by another.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from llm_health.config import Config
from llm_health.remediator.agent_check import AgentCheckServer, AgentStatus, parse_listen
from llm_health.remediator.inflight import kv_usage, read_backend
from llm_health.remediator.lifecycle import UNSEEN, LifecycleState
from llm_health.remediator.policy import OUT_OF_SERVICE_OUTCOMES
from llm_health.remediator.store import NO_RESTART_UNDER_WAY, Incident, LifecycleRow, Reads, StateStore

log = logging.getLogger("llm_health.remediator")

S = LifecycleState
KV_CACHE_SECONDS = 3.0
KV_READ_TIMEOUT = 1.0
RETRY_BIND_SECONDS = 2.0


class AgentAnswers:
    def __init__(self, store: StateStore, config: Config, clock: Callable[[], float] = time.monotonic,
                 kv_reader: Callable[[str], float | None] | None = None) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.kv_reader = kv_reader or (lambda url: kv_usage(read_backend(url, KV_READ_TIMEOUT)[0]))
        self._kv: dict[str, tuple[float, float | None]] = {}
        self._lock = threading.Lock()

    def kv(self, name: str, url: str) -> float | None:
        now = self.clock()
        with self._lock:
            cached = self._kv.get(name)
            if cached is not None and now - cached[0] < KV_CACHE_SECONDS:
                return cached[1]
        value = self.kv_reader(url)
        with self._lock:
            self._kv[name] = (now, value)
        return value

    def status_for(self, name: str, weigh: bool = True) -> AgentStatus | None:
        """The backend's status (None: not a backend of ours). It reads only this backend's rows unless the
        min_ready floor must count the others (a READY backend with a reason to go out), so a check every
        few seconds per backend (HAProxy's agent, each pod's readiness sidecar) stays cheap in a big
        fleet. `weigh=False`: no KV-cache reading (kv_usage None), for callers that ask only whether a
        backend takes traffic (GET /api/backends/<name>/readiness), never how much."""
        backend = self.config.backend(name)
        if backend is None:
            return None
        r = self.config.remediator
        with self.store.reader() as rd:
            lc = rd.lifecycle(name)
            state = lc.state if lc is not None else UNSEEN
            why = out_of_service(state, lc, rd.active_incident(name))
            hold = rd.admin(name)
            floored = hold is None and not r.dry_run and why is not None and state == S.READY
            others_up = self.others_up(rd, name) if floored else 0
            cap = r.rollout.canary_weight if weigh and why is None and rd.soaking(name) is not None else 100

        def kv() -> float | None:
            return self.kv(name, backend.url) if weigh else None

        if hold is not None:   # an operator's word wins, in a dry run too (it is not ours to keep up)
            return AgentStatus(state, None, f"{hold.state.value} by {hold.by or 'unknown'}: {hold.reason}",
                               healthy=why is None, admin=hold.state)
        if r.dry_run:
            return AgentStatus(state, kv(), f"dry run: kept up ({why or state.value})", keep_up=True)
        if state == S.DRAINING:
            return AgentStatus(S.DRAINING, None, "draining")
        if why is None:        # a rollout's canary during its soak: a reduced share of the traffic
            return AgentStatus(S.READY, kv(), "canary soaking" if cap < 100 else "", weight_cap=cap)
        if floored and others_up < r.min_ready:   # the floor keeps a READY backend in, never a non-READY one
            return AgentStatus(state, kv(), f"{why}; kept up: only {others_up} other backend(s) ready and up, "
                               f"min_ready {r.min_ready}", keep_up=True)
        return AgentStatus(state, None, why, healthy=state != S.READY)

    def others_up(self, rd: Reads, name: str) -> int:
        """Backends other than `name`, in service, READY and with no reason to go out (the floor's count)."""
        rows = rd.lifecycles()
        incidents = {i.backend: i for i in rd.active_incidents()}
        held = rd.admins()
        up = 0
        for b in self.config.backends:
            if b.name == name or b.name in held:
                continue
            lc = rows.get(b.name)
            state = lc.state if lc is not None else UNSEEN
            if state == S.READY and out_of_service(state, lc, incidents.get(b.name)) is None:
                up += 1
        return up


def out_of_service(state: LifecycleState, lc: LifecycleRow | None, inc: Incident | None) -> str | None:
    """Why the load balancer should not send this backend requests (None: no reason; DRAINING aside)."""
    if state in (S.STOPPED, S.INITIALIZING, S.ERROR):
        return f"{state.value}: {(lc.reason if lc else '') or state.value}"
    if state == S.DRAINING:
        return "draining"
    if inc is not None and inc.state in NO_RESTART_UNDER_WAY and inc.verified_outcome in OUT_OF_SERVICE_OUTCOMES:
        return f"verified {inc.verified_outcome} incident {inc.id}"
    return None


class AgentListener:
    """Keeps trying to bind the agent-check port until it holds it (or is stopped)."""

    def __init__(self, spec: str, status_for: Callable[[str], AgentStatus | None]) -> None:
        self.host, self.port = parse_listen(spec)
        self.status_for = status_for
        self.server: AgentCheckServer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AgentListener:
        self._thread = threading.Thread(target=self._run, name="agent-listener", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.server = AgentCheckServer(self.host, self.port, self.status_for).start()
                log.info("agent-check listening on %s:%s", self.host, self.port)
                return
            except OSError as exc:
                log.debug("agent-check port %s:%s not ours (%s); retrying", self.host, self.port, exc)
            self._stop.wait(RETRY_BIND_SECONDS)

    @property
    def listening(self) -> bool:
        return self.server is not None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.server is not None:
            self.server.stop()
            self.server = None
