"""prometheus_client custom collector: the exporter's series, built from the latest fleet snapshot.

Series and labels are the contract of docs/design.md §3 (rules and dashboards read them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_health.exporter.observation import ProbeOutcome, ReadResult
from llm_health.exporter.scheduler import Snapshot
from llm_health.exporter.verdict import CODES, Verdict


class ExporterCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        verdict = GaugeMetricFamily(
            "llm_health_verdict", "1 for the backend's current verdict, 0 for the others",
            labels=["backend", "verdict"])
        code = GaugeMetricFamily(
            "llm_health_verdict_code",
            "Current verdict as a number: " + ", ".join(f"{v.value}={c}" for v, c in CODES.items()),
            labels=["backend"])
        in_flight = GaugeMetricFamily(
            "llm_health_in_flight_requests", "Running + waiting requests at the last reading", labels=["backend"])
        tps = GaugeMetricFamily(
            "llm_health_generation_tokens_per_second",
            "Generation tokens per second between the last two readings", labels=["backend"])
        sps = GaugeMetricFamily(
            "llm_health_engine_steps_per_second",
            "Engine steps per second between the last two readings (vLLM V1 iterations, SGLang forward passes, "
            "llama.cpp llama_decode calls; 0 without a step counter)", labels=["backend"])
        progress = GaugeMetricFamily(
            "llm_health_last_progress_timestamp_seconds",
            "Unix time when engine progress was last observed (absent until it has been)", labels=["backend"])
        probes = CounterMetricFamily(
            "llm_health_probes", "Idle probes finished, by result", labels=["backend", "result"])
        sent = CounterMetricFamily(
            "llm_health_probes_sent", "Idle probes sent (counted when sent, before any answer)",
            labels=["backend"])
        readings = CounterMetricFamily(
            "llm_health_readings", "Readings of /metrics, by result", labels=["backend", "result"])
        skipped = CounterMetricFamily(
            "llm_health_readings_skipped",
            "Readings not started because the backend's previous read was still running", labels=["backend"])
        duration = GaugeMetricFamily(
            "llm_health_reading_duration_seconds",
            "How long the backend's last judged /metrics read took (about the read timeout when it timed out)",
            labels=["backend"])
        judged = GaugeMetricFamily(
            "llm_health_last_reading_timestamp_seconds",
            "Unix time of the backend's last judged reading (absent until it has one): a backend whose reads "
            "cannot start (the exporter's readers are busy) or never end is visible by its age",
            labels=["backend"])
        bound = GaugeMetricFamily(
            "llm_health_stall_threshold_seconds",
            "How long the backend's counters may stay frozen with work in flight before it is stalled: stall_after, "
            "or more when its own numbers say one engine step can take longer (exporter/steptime.py)",
            labels=["backend"])
        for b in snap.backends:
            if b.last_reading is not None:
                judged.add_metric([b.name], b.last_reading)
            if b.stall_bound > 0:
                bound.add_metric([b.name], b.stall_bound)
            for v in Verdict:
                verdict.add_metric([b.name, v.value], 1.0 if b.verdict == v else 0.0)
            code.add_metric([b.name], float(CODES[b.verdict]))
            in_flight.add_metric([b.name], b.in_flight)
            tps.add_metric([b.name], b.tokens_per_second)
            sps.add_metric([b.name], b.steps_per_second)
            if b.last_progress is not None:  # never seen is missing data, not "progress in 1970"
                progress.add_metric([b.name], b.last_progress)
            for r in tuple(ProbeOutcome):
                probes.add_metric([b.name, r], float(b.probes.get(r, 0)))
            sent.add_metric([b.name], float(b.probes_sent))
            for r in tuple(ReadResult):
                readings.add_metric([b.name, r], float(b.readings.get(r, 0)))
            skipped.add_metric([b.name], float(b.reads_skipped))
            duration.add_metric([b.name], b.read_seconds)
        proxy = GaugeMetricFamily("llm_health_proxy_up", "1 when GET /v1/models through the proxy answers 200",
                                  labels=["proxy"])
        for p in snap.proxies:
            proxy.add_metric([p.name], 1.0 if p.up else 0.0)
        lag = GaugeMetricFamily(
            "llm_health_schedule_lag_seconds",
            "The largest delay, among the backends' last reads, between a read's scheduled time and its start "
            "(the exporter is short of workers or CPU when this nears the interval)")
        lag.add_metric([], snap.lag_seconds)
        interval = GaugeMetricFamily(
            "llm_health_reading_interval_seconds", "Seconds between two readings of one backend (exporter.interval)")
        interval.add_metric([], snap.interval)
        yield from (verdict, code, in_flight, tps, sps, progress, probes, sent, readings, skipped, duration, judged,
                    bound, proxy, lag, interval)
