"""The sidecar's two pollers and the latest facts they found; /ready reads those, never the network.

A kubelet probe must not wait on a remote call (its own timeout would turn our slowness into a Ready
flap), so two background threads keep the facts fresh and `decision()` is only arithmetic:

* the remediator, every `interval`: GET <remediator>/api/backends/<name>/readiness, over within
  `timeout` (llm_health/http_client.py: one total deadline, however the other side behaves);
* the engine, every `interval`: GET <engine>/health, within `engine_timeout` (a busy vLLM answers
  /health slowly: docs/kubernetes.md). On its own thread, so a slow engine never delays the
  remediator's answers; kept fresh all the time, so the fallback has a recent reading the moment it
  is due.

Each change of what /ready answers (ready or not, and who decided) is logged once, with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from llm_health.http_client import HttpFailure, Response, fetch
from llm_health.redact import redact
from llm_health.remediator.sidecar.decision import Answer, Decision, Engine, Source, decide, parse_answer

log = logging.getLogger("llm_health.readiness")

MAX_ANSWER_BYTES = 64 * 1024
Fetch = Callable[..., Response]


@dataclass(frozen=True)
class Settings:
    remediator: str          # base URL, e.g. http://llm-health-remediator:9411
    backend: str
    engine: str              # base URL, e.g. http://127.0.0.1:8000
    interval: float = 2.0
    timeout: float = 2.0
    engine_timeout: float = 45.0
    fallback_after: float = 30.0

    @property
    def readiness_url(self) -> str:
        return f"{self.remediator.rstrip('/')}/api/backends/{quote(self.backend, safe='')}/readiness"

    @property
    def health_url(self) -> str:
        return f"{self.engine.rstrip('/')}/health"


def failure_text(exc: HttpFailure) -> str:
    return f"{exc.kind.value}: {exc.detail}"


class Watch:
    """The latest remediator answer (and when it came), the latest poll's failure, the latest engine
    check. Thread-safe; `clock` is monotonic."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic,
                 fetcher: Fetch = fetch) -> None:
        self.settings = settings
        self.clock = clock
        self.fetch = fetcher
        self.started = clock()
        self._lock = threading.Lock()
        self._answer: Answer | None = None
        self._answered_at = self.started
        self._failure = ""
        self._engine: Engine | None = None
        self._mode: tuple[bool, Source] | None = None
        self._stop = threading.Event()

    # -- what the pollers do, one call each
    def poll_remediator(self) -> None:
        s = self.settings
        try:
            resp = self.fetch("GET", s.readiness_url, timeout=s.timeout, max_bytes=MAX_ANSWER_BYTES)
            got = parse_answer(resp.status, resp.body, s.backend)
        except HttpFailure as exc:
            got = f"the remediator did not answer: {failure_text(exc)}"
        with self._lock:
            if isinstance(got, Answer):
                self._answer, self._answered_at, self._failure = got, self.clock(), ""
            else:
                self._failure = redact(got)
        self.decision()

    def poll_engine(self) -> None:
        s = self.settings
        try:
            resp = self.fetch("GET", s.health_url, timeout=s.engine_timeout, max_bytes=MAX_ANSWER_BYTES)
            engine = Engine(resp.status == 200, f"HTTP {resp.status}")
        except HttpFailure as exc:
            engine = Engine(False, redact(failure_text(exc)))
        with self._lock:
            self._engine = engine
        self.decision()

    # -- what /ready answers
    def decision(self) -> Decision:
        with self._lock:
            d = decide(self._answer, self.clock() - self._answered_at, self._failure, self._engine,
                       self.settings.fallback_after)
            changed, self._mode = d.mode != self._mode, d.mode
        if changed:
            log.info("backend %s: %s: %s", self.settings.backend, "ready" if d.ready else "not ready", d.reason)
        return d

    # -- the threads
    def start(self) -> Watch:
        for name, poll in (("remediator", self.poll_remediator), ("engine", self.poll_engine)):
            t = threading.Thread(target=self._every, args=(poll,), name=f"poll-{name}", daemon=True)
            t.start()
        return self

    def _every(self, poll: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                poll()
            except Exception:  # noqa: BLE001 - a poller that dies would freeze /ready on its last answer
                log.exception("readiness poll failed")
            self._stop.wait(self.settings.interval)

    def stop(self) -> None:
        """The pollers end after their current call (daemon threads: a process exiting waits for none)."""
        self._stop.set()
