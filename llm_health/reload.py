"""The outcome of the last configuration (re)load, and its two series, as Prometheus and Alertmanager
export theirs:

    <prefix>_config_last_reload_successful                    1 when the last (re)load worked, else 0
    <prefix>_config_last_reload_success_timestamp_seconds     Unix time of the last load that worked

The start counts as a load. A reload that fails keeps the running configuration: the first series
says 0 until a later reload works, and the reason is logged (and kept in `error`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from llm_health.config import Config


@dataclass(frozen=True)
class ReloadStatus:
    ok: bool
    success_at: float              # wall time of the last load that worked (the start counts)
    error: str = ""                # why the last reload failed ('' when it worked)
    reloads: int = 0               # reloads tried since the start

    @classmethod
    def loaded(cls, at: float) -> ReloadStatus:
        return cls(ok=True, success_at=at)

    def succeeded(self, at: float) -> ReloadStatus:
        return ReloadStatus(ok=True, success_at=at, reloads=self.reloads + 1)

    def failed(self, error: str) -> ReloadStatus:
        return ReloadStatus(ok=False, success_at=self.success_at, error=error, reloads=self.reloads + 1)


class ReloadCollector(Collector):
    def __init__(self, prefix: str, status: Callable[[], ReloadStatus]) -> None:
        self.prefix = prefix
        self.status = status

    def collect(self) -> Iterator[Metric]:
        st = self.status()
        g = GaugeMetricFamily(f"{self.prefix}_config_last_reload_successful",
                              "1 when the last configuration (re)load worked; 0: a reload failed and the "
                              "previous configuration is still running (the log says why).")
        g.add_metric([], int(st.ok))
        yield g
        g = GaugeMetricFamily(f"{self.prefix}_config_last_reload_success_timestamp_seconds",
                              "Unix time of the last configuration load that worked (the start counts).")
        g.add_metric([], st.success_at)
        yield g


def fleet_change(old: Config, new: Config) -> str:
    """'+b1 -a2 ~c3' for the backends and proxies a reload adds, removes and moves ('' for none)."""
    def urls(config: Config) -> dict[str, str]:
        return {**{b.name: b.url for b in config.backends}, **{p.name: p.url for p in config.proxies}}

    before, after = urls(old), urls(new)
    parts = [f"+{n}" for n in after if n not in before] + [f"-{n}" for n in before if n not in after]
    parts += [f"~{n}" for n in after if n in before and before[n] != after[n]]
    return " ".join(parts)
