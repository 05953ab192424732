"""One /metrics answer for the exporter and the remediator, through prometheus_client's exposition.

* the format the scraper asks for: OpenMetrics 1.0 for `Accept: application/openmetrics-text` (Prometheus
  asks for it first), else the text format 0.0.4 (prometheus_client's `choose_encoder`);
* gzip when `Accept-Encoding` names it (Prometheus always does; `gzip_accepted`);
* `Vary: Accept, Accept-Encoding`, so a cache in between never hands one client's format to another.

HEAD is the servers' part: the exporter's handler (llm_health/httpserver.py) and Flask both answer it
with the GET's headers and no body.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass

from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import CollectorRegistry

#: zlib's default: nearly the size of level 9 at a fraction of its CPU (a 1000-backend page every scrape)
GZIP_LEVEL = 6


@dataclass(frozen=True)
class MetricsAnswer:
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...]


def metrics_answer(registry: CollectorRegistry, accept: str | None, accept_encoding: str | None) -> MetricsAnswer:
    encoder, content_type = choose_encoder(accept or "")
    body = encoder(registry)
    headers: list[tuple[str, str]] = [("Vary", "Accept, Accept-Encoding")]
    if gzip_accepted(accept_encoding or ""):
        body = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
        headers.append(("Content-Encoding", "gzip"))
    return MetricsAnswer(body, content_type, tuple(headers))
