"""The exporter's HTTP service: GET /metrics (Prometheus), GET /verdicts (JSON), GET /health; HEAD on each.

/metrics answers in the format the scraper asks for (OpenMetrics or text, gzip or not:
llm_health/exposition.py); it includes llm_health_build_info and the exporter's own process_* series.

`/verdicts` answers one JSON object:

```json
{"backends": [{"backend": "gpu-a", "url": "...", "verdict": "busy", "code": 2,
               "reason": "12 running, 3 waiting, engine progressing (840 tokens/s)",
               "since": 1764470000.0, "in_flight": 15, "tokens_per_second": 840.0,
               "steps_per_second": 56.0,
               "last_progress": 1764470042.1, "probes": {"ok": 3, "error": 0, "timeout": 0},
               "probes_sent": 3, "readings_skipped": 0, "read_seconds": 0.004,
               "readings": {"ok": 40, "timeout": 0, ...}, "last_reading": 1764470042.0}],
 "proxies": [{"proxy": "lb", "url": "...", "up": true}],
 "cycles": 42, "lag_seconds": 0.001, "at": 1764470042.5}
```
A stalled backend also has `progress_signature` and `frozen_for_seconds` (the frozen counters and for how
long they have stood still: what a remediator's verification reuses, exporter/check.py). `?backend=NAME`
answers that backend only. (`up` is null before the first check; `cycles` counts whole intervals since the exporter started;
every backend is read on its own schedule, see exporter/cycle.py.) With discovery on, a `discovery`
object is added: freshness, errors and refused targets (llm_health.discovery.status_document).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.registry import Collector

from llm_health.buildinfo import BuildInfoCollector
from llm_health.discovery import Discovery, status_document
from llm_health.discovery.collector import DiscoveryCollector
from llm_health.exporter.collector import ExporterCollector
from llm_health.exporter.scheduler import ReadScheduler, Snapshot
from llm_health.exporter.verdict import CODES
from llm_health.exposition import metrics_answer
from llm_health.httpserver import QuietHandler
from llm_health.redact import redact


def _frozen_evidence(b: Any, at: float) -> dict[str, Any]:
    """A stalled backend: the signature of its frozen counters and for how long they have stood still (as
    of this answer: a duration, so no two hosts' clocks are compared). What a verification reuses."""
    if not b.progress_signature or b.last_progress is None:
        return {}
    return {"progress_signature": b.progress_signature, "frozen_for_seconds": round(max(0.0, at - b.last_progress), 3),
            "page_is_work_queue": b.page_is_work_queue}


def verdicts_document(snap: Snapshot, only: str | None = None) -> dict[str, Any]:
    """The /verdicts answer (unauthenticated: credentials in URLs redacted, llm_health.redact); `only`:
    one backend (`/verdicts?backend=NAME`, what a remediator's verification asks)."""
    return redact({
        "backends": [
            {
                "backend": b.name,
                "url": b.url,
                "verdict": b.verdict.value,
                "code": CODES[b.verdict],
                "reason": b.reason,
                "since": b.since,
                "in_flight": b.in_flight,
                "tokens_per_second": round(b.tokens_per_second, 3),
                "steps_per_second": round(b.steps_per_second, 3),
                "last_progress": b.last_progress,
                "probes": b.probes,
                "probes_sent": b.probes_sent,
                "readings_skipped": b.reads_skipped,
                "read_seconds": round(b.read_seconds, 4),
                "readings": b.readings,
                "last_reading": b.last_reading,
                "stall_bound_seconds": round(b.stall_bound, 1),
                **_frozen_evidence(b, snap.at),
            }
            for b in snap.backends if only is None or b.name == only
        ],
        "proxies": [{"proxy": p.name, "url": p.url, "up": p.up} for p in snap.proxies],
        "cycles": snap.cycles,
        "lag_seconds": round(snap.lag_seconds, 4),
        "at": snap.at,
    })


class ExporterServer:
    """The fleet loop in a thread plus the HTTP listener."""

    def __init__(self, fleet: ReadScheduler, host: str, port: int, discovery: Discovery | None = None,
                 collectors: Sequence[Collector] = ()) -> None:
        self.fleet = fleet
        self.discovery = discovery
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ExporterCollector(fleet.snapshot))
        if discovery is not None:
            self.registry.register(DiscoveryCollector(discovery.status))
        self.registry.register(BuildInfoCollector())
        for collector in collectors:     # e.g. the config reload's (exporter/cli.py)
            self.registry.register(collector)
        ProcessCollector(registry=self.registry)  # the exporter's own process_* series
        registry = self.registry

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                path, _, query = self.path.partition("?")
                if path == "/metrics":
                    answer = metrics_answer(registry, self.headers.get("Accept"), self.headers.get("Accept-Encoding"))
                    self.reply(200, answer.body, answer.content_type, dict(answer.headers))
                elif path == "/verdicts":
                    doc = verdicts_document(fleet.snapshot(), (parse_qs(query).get("backend") or [None])[0])
                    if discovery is not None:
                        doc["discovery"] = status_document(discovery.status())
                    self.reply(200, json.dumps(doc, indent=1), "application/json")
                elif path in ("/health", "/"):
                    self.reply(200, b"ok\n", "text/plain")
                else:
                    self.reply(404, b"not found\n", "text/plain")

            do_HEAD = do_GET  # noqa: N815 - the same answer without its body (QuietHandler.reply)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.stop = threading.Event()
        self._loop = threading.Thread(target=fleet.run_forever, args=(self.stop,), name="fleet", daemon=True)

    def serve_forever(self) -> None:
        if self.discovery is not None:
            self.discovery.start()
        self._loop.start()
        try:
            self.httpd.serve_forever(poll_interval=0.2)
        finally:
            if self.discovery is not None:
                self.discovery.stop()
            self.stop.set()
            self.httpd.server_close()
            self.fleet.close()

    def shutdown(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
