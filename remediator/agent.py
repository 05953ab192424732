"""The remediator's HAProxy agent: answers from SQLite, one listener per remediator.

`FleetAgent.status_for(name)` builds the `AgentStatus` of a backend from the lifecycle row and the active
incident (so every process gives the same answer), plus a fresh KV-cache reading of the backend's own
/metrics (cached a few seconds) for the weight of a READY backend:

* lifecycle READY, no incident with a firing restart-worthy alert -> `ready up W%`
* READY with such an incident (stalled / down, not yet restarted)  -> `down #<alert> firing`
* DRAINING -> `drain`; INITIALIZING / STOPPED / ERROR -> `down #<state reason>`

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
from remediator import fleet
from remediator.agent_check import AgentCheckServer, AgentStatus, parse_listen
from remediator.inflight import kv_usage, read_backend
from remediator.lifecycle import LifecycleState
from remediator.store import NEEDS_ACK, OBSERVED, OPEN, Store

log = logging.getLogger("llm_health.remediator")

S = LifecycleState
KV_CACHE_SECONDS = 3.0
KV_READ_TIMEOUT = 1.0
RETRY_BIND_SECONDS = 2.0


class FleetAgent:
    def __init__(self, store: Store, config: Config, clock: Callable[[], float] = time.monotonic,
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

    def status_for(self, name: str) -> AgentStatus | None:
        backend = self.config.backend(name)
        if backend is None:
            return None
        with self.store.reader() as c:
            r = fleet.row(c, name)
            inc = Store.active_incident(c, name)
            firing = []
            if inc is not None and inc["state"] in (OPEN, NEEDS_ACK, OBSERVED):
                firing = [x["alertname"] for x in c.execute(
                    "SELECT DISTINCT alertname FROM incident_alerts WHERE incident_id = ? AND status = 'firing' "
                    "ORDER BY alertname", (inc["id"],)).fetchall()]
        state = S(r["state"]) if r else fleet.UNSEEN
        if state != S.READY:
            reason = (r["reason"] if r else "") or state.value
            return AgentStatus(state, None, f"{state.value}: {reason}")
        if firing:
            return AgentStatus(S.READY, None, f"{', '.join(firing)} firing (incident {inc['id']})", healthy=False)
        return AgentStatus(S.READY, self.kv(name, backend.url))


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
