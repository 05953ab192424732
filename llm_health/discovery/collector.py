"""prometheus_client collector for discovery's freshness and errors: the same series in the exporter's
and the remediator's /metrics (the remediator's describe the gunicorn worker that answered)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_health.discovery import Status


class DiscoveryCollector(Collector):
    def __init__(self, status: Callable[[], Status]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        st = self._status()
        yield GaugeMetricFamily("llm_health_discovery_last_success_timestamp_seconds",
                                "When Prometheus last answered the target list usefully (0 = never).",
                                value=st.last_success)
        yield GaugeMetricFamily("llm_health_discovery_stale",
                                "1 while the discovered backend list is not fresh (last refresh failed or no good "
                                "answer within 2 refresh intervals); the last good list is kept.",
                                value=int(st.stale))
        yield CounterMetricFamily("llm_health_discovery_refreshes", "Target list refreshes attempted.",
                                  value=st.refreshes)
        yield CounterMetricFamily("llm_health_discovery_errors", "Target list refreshes that failed (list kept).",
                                  value=st.errors)
        yield GaugeMetricFamily("llm_health_discovery_targets",
                                "Targets matching the selector in the last good answer.", value=st.targets)
        yield GaugeMetricFamily("llm_health_discovery_backends",
                                "Discovered backends in the fleet (including those in their grace period).",
                                value=st.backends)
        yield GaugeMetricFamily("llm_health_discovery_refused",
                                "Targets refused (or refused a restart) in the last good answer.", value=st.refused)
        yield GaugeMetricFamily("llm_health_discovery_duplicate_names",
                                "Backend names claimed by more than one target in the last good answer: none of "
                                "them is restarted (a rogue monitor copying a real name, or two real servers).",
                                value=len(st.duplicates))
        yield CounterMetricFamily("llm_health_discovery_extra_refreshes",
                                  "Refreshes done early because a backend not in the fleet was asked for "
                                  "(at most one per discovery.extra_refresh_every).", value=st.extra_refreshes)
