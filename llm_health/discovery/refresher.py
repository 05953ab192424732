"""The refreshing edge: `Discovery` asks Prometheus on a monotonic clock, keeps the last good list,
removes a vanished backend only after its grace; `LiveBackends` is the fleet as the exporter and the
remediator read it."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from llm_health.config import Backend, DiscoverySettings
from llm_health.discovery.selector import parse_selector
from llm_health.discovery.targets import Duplicate, Refusal, backends_from_targets, parse_answer
from llm_health.http_client import fetch
from llm_health.redact import redact

log = logging.getLogger("llm_health.discovery")

MAX_ANSWER_BYTES = 64 * 1024 * 1024



def fetch_targets(prometheus_url: str, timeout: float) -> list[Any]:
    """One look at Prometheus' targets, over within `timeout` whatever Prometheus (or a proxy in front of
    it) does: connect, headers and body share one deadline (llm_health/http_client.py). A user:password@
    in the URL goes as Basic auth, never to DNS."""
    resp = fetch("GET", prometheus_url.rstrip("/") + "/api/v1/targets", timeout=timeout, params={"state": "active"},
                 headers={"Accept": "application/json"}, max_bytes=MAX_ANSWER_BYTES)
    if resp.status != 200:
        raise ValueError(f"HTTP {resp.status}: {resp.text[:200]}")
    return parse_answer(resp.body)


@dataclass(frozen=True)
class Status:
    """What the metrics show about discovery (a snapshot)."""

    enabled: bool = False
    last_success: float = 0.0         # wall clock of the last good answer, 0 = never
    refreshes: int = 0
    errors: int = 0
    stale: bool = True                # no good answer within 2 refresh intervals (or never)
    last_error: str = ""
    targets: int = 0                  # targets matching the selector in the last good answer
    backends: int = 0                 # discovered backends in the fleet (incl. those in their grace period)
    refused: int = 0                  # targets refused in the last good answer (restart-only refusals too)
    refusals: tuple[Refusal, ...] = ()
    duplicates: tuple[Duplicate, ...] = ()   # names claimed by more than one target in the last good answer
    extra_refreshes: int = 0          # refreshes done early because a backend not in the fleet was asked for


@dataclass
class _Seen:
    backend: Backend
    last_seen: float                  # monotonic


class Discovery:
    """Refreshes the discovered backends; `backends()` is always the last good list (plus grace)."""

    def __init__(self, settings: DiscoverySettings, static: Sequence[Backend] = (),
                 fetch: Callable[[], list[Any]] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 keep: Callable[[str], bool] | None = None, reserved: Sequence[str] = ()) -> None:
        self.settings = settings
        self.reserved = tuple(b.name for b in static) + tuple(reserved)
        self.matchers = parse_selector(settings.selector)
        self.static = tuple(static)
        self._fetch = fetch or (lambda: fetch_targets(settings.prometheus_url, settings.timeout))
        self.monotonic = monotonic
        self.wall = wall
        self.keep = keep or (lambda _name: False)
        self._lock = threading.Lock()
        self.stop_event = threading.Event()
        self._wanted = threading.Event()      # someone asked for a refresh (request_refresh)
        self._kick = threading.Event()        # wakes the refresher: a request, or stop()
        self._seen: dict[str, _Seen] = {}
        self._backends: tuple[Backend, ...] = ()
        self._last_ok_mono: float | None = None
        self._answering_since: float | None = None    # first good answer of the current unbroken run
        self._started = 0                     # refreshes started so far (see mark)
        self._answered = 0                    # the number (1, 2, ...) of the latest good refresh, 0 = none
        self._status = Status(enabled=True)
        self._listeners: list[Callable[[tuple[Backend, ...], tuple[Refusal, ...]], None]] = []

    def on_change(self, listener: Callable[[tuple[Backend, ...], tuple[Refusal, ...]], None]) -> None:
        """Called after every good refresh with the discovered backends and the refusals."""
        self._listeners.append(listener)

    def backends(self) -> tuple[Backend, ...]:
        with self._lock:
            return self._backends

    def status(self) -> Status:
        with self._lock:
            st = self._status
            stale = self._last_ok_mono is None or \
                self.monotonic() - self._last_ok_mono > 2 * max(self.settings.refresh, 0.001)
            return dataclasses.replace(st, stale=stale or bool(st.last_error))

    # -- asking for a refresh (never waits for Prometheus) ---------------------------------------------
    def mark(self) -> int:
        """A point in this refresher's history: `answered_since(mark)` tells whether a refresh that
        STARTED after it has had a good answer (so a backend missing from the list now is really missing,
        not just not seen yet)."""
        with self._lock:
            return self._started

    def answered_since(self, mark: int) -> bool:
        with self._lock:
            return self._answered > mark

    def request_refresh(self) -> None:
        """Ask the refresher thread for a refresh soon; returns at once. Requests are served at most once
        per `extra_refresh_every` seconds (counted from the latest refresh's start), so a storm of alerts
        about backends not in the fleet costs one extra query per interval, not one per alert."""
        self._wanted.set()
        self._kick.set()

    # -- one refresh ---------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """One look at Prometheus. A failure changes no backend (the last good list stays, marked stale)."""
        with self._lock:
            self._started += 1
            number = self._started
        try:
            targets = self._fetch()
            found = backends_from_targets(targets, self.settings, self.matchers, self.reserved)
        except Exception as exc:  # noqa: BLE001 - any failure: keep the last good list
            why = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("discovery from %s failed, keeping the last good list: %s",
                        self.settings.prometheus_url, why)
            with self._lock:
                self._answering_since = None
                st = self._status
                self._status = dataclasses.replace(st, refreshes=st.refreshes + 1, errors=st.errors + 1,
                                                   last_error=why)
            return False
        now = self.monotonic()
        with self._lock:
            # absence is counted only while Prometheus answers: after a failed refresh the grace period
            # starts again at the next good answer, which may well be empty or partial (a restarted
            # Prometheus whose service discovery has not run yet)
            if self._answering_since is None:
                self._answering_since = now
            answering_since = self._answering_since
            for b in found.backends:
                self._seen[b.name] = _Seen(b, now)
            for dup in found.duplicates:
                # a name two targets claim: never restarted while that lasts. A backend of that name already
                # in the fleet stays watched (without restart) while its URL is still one of the claimants,
                # so a copy of a real backend's name cannot hide it; otherwise it ages out after grace.
                seen = self._seen.get(dup.name)
                if seen is not None:
                    kept = dataclasses.replace(seen.backend, restart=())
                    self._seen[dup.name] = _Seen(kept, now if kept.url in dup.urls else seen.last_seen)
            gone = [n for n, s in self._seen.items()
                    if now - max(s.last_seen, answering_since) > self.settings.grace]
        kept_names = {n for n in gone if self._keeps(n)}      # may read the state database: not under the lock
        with self._lock:
            for name in gone:
                seen = self._seen.get(name)
                if name in kept_names or seen is None or seen.last_seen >= now:
                    continue
                log.info("discovery: %s gone for more than %g s, removed", name, self.settings.grace)
                del self._seen[name]
            self._backends = tuple(self._seen[n].backend for n in sorted(self._seen))
            self._last_ok_mono = now
            self._answered = max(self._answered, number)
            st = self._status
            self._status = dataclasses.replace(
                st, enabled=True, last_success=self.wall(), refreshes=st.refreshes + 1, stale=False,
                last_error="", targets=found.targets, backends=len(self._backends), refused=len(found.refusals),
                refusals=found.refusals, duplicates=found.duplicates)
            current = self._backends
        for dup in found.duplicates:
            log.warning("discovery: backend name %s claimed by %d targets (%s): neither is restarted",
                        dup.name, len(dup.targets), ", ".join(dup.targets))
        for listener in self._listeners:
            try:
                listener(current, found.refusals)
            except Exception:  # noqa: BLE001 - a listener must not stop discovery
                log.exception("discovery listener failed")
        return True

    def _keeps(self, name: str) -> bool:
        """`keep(name)`; when it cannot tell (e.g. the state database is busy), keep: never drop a
        backend because of our own error."""
        try:
            return bool(self.keep(name))
        except Exception:  # noqa: BLE001 - removal waits for the next refresh
            log.exception("discovery: cannot tell whether %s may be removed; kept", name)
            return True

    def run_forever(self, stop: threading.Event) -> None:
        """Refresh every `refresh` seconds (monotonic, fixed rate) until `stop` is set, and early when
        `request_refresh` asked, but never sooner than `extra_refresh_every` after the latest refresh
        started. Nothing ends the loop but `stop`: an error is logged and the next refresh comes on time.
        With a good answer already in (the caller refreshed before starting it), the first refresh comes
        one interval later, not at once."""
        interval = max(self.settings.refresh, 0.05)
        gap = max(self.settings.extra_refresh_every, 0.05)
        next_at = started = self.monotonic()
        extra = False                       # the coming refresh was asked for (request_refresh)
        due = not self.answered_since(0)
        while not stop.is_set():
            if due:
                started = self.monotonic()
                self._wanted.clear()        # requests made before this start are served by it
                try:
                    self.refresh()
                except Exception:  # noqa: BLE001 - a dead refresher would freeze the fleet silently
                    log.exception("discovery refresh failed")
                if extra:
                    with self._lock:
                        self._status = dataclasses.replace(self._status,
                                                           extra_refreshes=self._status.extra_refreshes + 1)
            due = True
            if not extra:                   # an extra refresh leaves the fixed-rate schedule as it was
                next_at += interval
            now = self.monotonic()
            if next_at < now:
                next_at = now
            while not stop.is_set():
                now = self.monotonic()
                wait, extra = next_at - now, False
                if self._wanted.is_set() and started + gap - now < wait:
                    wait, extra = started + gap - now, True
                if wait <= 0 or not self._sleep(stop, wait):
                    break                   # the time came (also with a clock that does not move)
                # woken by a request (or stop): look again at what is due

    def _sleep(self, stop: threading.Event, seconds: float) -> bool:
        """Sleep `seconds` of real time; True as soon as request_refresh or stop() wakes it (or `stop`,
        looked at twice a second, is set), False when the time has passed."""
        until = time.monotonic() + seconds
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return False
            if self._kick.wait(min(left, 0.5)):
                self._kick.clear()
                return True
            if stop.is_set():
                return True

    def start(self) -> threading.Thread:
        """Refresh in a daemon thread until `stop()`."""
        t = threading.Thread(target=self.run_forever, args=(self.stop_event,), name="discovery", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self.stop_event.set()
        self._kick.set()


class LiveBackends(Sequence[Backend]):
    """The fleet as the exporter and remediator read it: the static backends, then the discovered ones
    that do not clash with them. Each iteration, `len` or index reads one consistent snapshot; the next
    read may see a newer list. Without discovery it behaves like the static tuple."""

    def __init__(self, static: Sequence[Backend], discovery: Discovery | None = None) -> None:
        self.static = tuple(static)
        self.discovery = discovery
        self._names = frozenset(b.name for b in self.static)
        self._merged: tuple[tuple[Backend, ...], tuple[Backend, ...]] = ((), self.static)  # (source, merged)

    def snapshot(self) -> tuple[Backend, ...]:
        if self.discovery is None:
            return self.static
        found = self.discovery.backends()
        source, merged = self._merged         # one tuple read: safe without a lock
        if found is not source:
            merged = self.static + tuple(b for b in found if b.name not in self._names)
            self._merged = (found, merged)
        return merged

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        return len(self.snapshot())

    @overload
    def __getitem__(self, i: int) -> Backend: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Backend, ...]: ...

    def __getitem__(self, i: int | slice) -> Backend | tuple[Backend, ...]:
        return self.snapshot()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LiveBackends):
            return self.snapshot() == other.snapshot()
        return isinstance(other, tuple) and self.snapshot() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LiveBackends({len(self.static)} static, discovery {'on' if self.discovery else 'off'})"


def status_document(status: Status) -> dict[str, Any]:
    """Discovery's status as shown (exporter /verdicts, remediator /api/discovery): URLs redacted."""
    return redact({"enabled": status.enabled, "last_success": status.last_success, "stale": status.stale,
                   "refreshes": status.refreshes, "errors": status.errors, "last_error": status.last_error,
                   "targets": status.targets, "backends": status.backends, "extra_refreshes": status.extra_refreshes,
                   "refusals": [{**r.__dict__, "kind": str(r.kind)} for r in status.refusals],
                   "duplicates": [{"name": d.name, "targets": list(d.targets)} for d in status.duplicates]})
