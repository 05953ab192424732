"""How much work a draining backend still has, and whether its engine moved meanwhile.

The backend's own gauges (`vllm:num_requests_running` + `waiting`, read with the exporter's reading
code) are the primary source; when `remediator.haproxy_socket` is set, HAProxy's current sessions for
the server (`scur`) must be 0 as well. A reading that fails is "unknown" (principle 3): the drain then
runs to its deadline. The reading taken when the drain began is kept whole in the store so that
progress during the drain - in-flight requests finishing - can be told from a stalled engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_health.config import Backend
from llm_health.exporter.backend import Target, observe
from llm_health.exporter.observation import ReadResult
from llm_health.exporter.reading import Reading
from llm_health.exporter.verdict import other_process, progressed
from llm_health.remediator.drain import StatsError, show_stat


@dataclass(frozen=True)
class InFlight:
    work: float | None          # running + waiting on the backend; None = could not read
    sessions: int | None        # HAProxy scur for the server; None = no socket configured / unreadable
    reading: Reading | None     # the backend's reading (for progress), None when unreadable
    detail: str = ""

    @property
    def drained(self) -> bool:
        """Known to have nothing in flight (every configured source says 0)."""
        if self.work is None or self.work > 0:
            return False
        return self.sessions is None or self.sessions == 0

    def describe(self) -> str:
        parts = ["backend: " + ("unreadable" if self.work is None else f"{self.work:g} in flight")]
        if self.sessions is not None:
            parts.append(f"haproxy: {self.sessions} sessions")
        if self.detail:
            parts.append(self.detail)
        return ", ".join(parts)


def read_backend(url: str, timeout: float) -> tuple[Reading | None, str]:
    target = Target(url, timeout)
    try:
        obs = observe(target)
    finally:
        target.close()
    if obs.outcome != ReadResult.OK or obs.reading is None or not obs.reading.has_engine_metrics:
        return None, f"/metrics {obs.outcome}{': ' + obs.detail if obs.detail else ''}"
    return obs.reading, ""


def read_in_flight(backend: Backend, timeout: float, haproxy_socket: str = "", proxy: str = "") -> InFlight:
    reading, detail = read_backend(backend.url, timeout)
    sessions: int | None = None
    if haproxy_socket:
        try:
            stats = show_stat(haproxy_socket, timeout)
            for (px, srv), st in stats.items():
                if srv == backend.name and (not proxy or px == proxy):
                    sessions = (sessions or 0) + st.current_sessions
        except StatsError as exc:
            detail = (detail + "; " if detail else "") + str(exc)
    return InFlight(reading.work if reading else None, sessions, reading, detail)


def kv_usage(reading: Reading | None) -> float | None:
    """The fullest engine's KV-cache usage (0..1), None when the page has none."""
    if reading is None:
        return None
    values = [e.kv_usage for e in reading.engines.values() if e.kv_usage is not None]
    return max(values) if values else None


def moved(before: Reading | None, after: Reading | None) -> str:
    """Why the backend is evidently not stalled any more ("" when nothing moved or we cannot tell)."""
    if before is None or after is None:
        return ""
    why = other_process(before, after)
    if why:
        return f"another process answers ({why})"
    for key, eng in after.engines.items():
        old = before.engines.get(key)
        if old is not None and progressed(old, eng):
            return f"engine {key} progressed during the drain"
    return ""
