"""What the canary's gate asks Prometheus (HTTP API /api/v1/query), each query within one total deadline.

The engines are scraped directly with a `backend` label, the exporter's series carry `backend` themselves
(deploy/prometheus/prometheus.yml's convention, the one the rules use). Backend names come from the
configuration (config.NAME_RE: letters, digits, `_`, `.`, `-`), never from an alert; `.` is escaped in a
regular expression, nothing else can appear.

Queries (W = the soak's length; FLEET = the members not changed yet):
* verdict: `llm_health_verdict_code{backend="C"}` (the worst of the exporters' series);
* requests: finished requests of the engine (vLLM `vllm:request_success_total`, SGLang
  `sglang:num_requests_total`) and our idle probes (`llm_health_probes_sent_total`), increase over W;
* error ratio: vLLM's HTTP counter (`http_requests_total`, vLLM >= 0.8) on the /v1/ handlers: 5xx over all;
* TTFT p95 and end-to-end p95: `histogram_quantile(0.95, ...)` of the engines' histograms over W.
An engine without one of these metrics gives no data for it (the gate says which bound it skipped). The
fleet's p95 comes from the first engine's histograms that have data (an `or` of vLLM's and SGLang's): a
fleet of one engine, as a rollout of one command is, compares like with like.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from llm_health.config import Config
from llm_health.exporter.verdict import CODES, Verdict
from llm_health.http_client import HttpFailure, fetch
from llm_health.remediator.rollout.gate import FAILING, INCONCLUSIVE, Measurement, Summary

MAX_ANSWER_BYTES = 1 << 20
BY_CODE = {code: v for v, code in CODES.items()}


def prometheus_url(config: Config) -> str:
    """The gate's Prometheus: remediator.rollout.prometheus_url, else discovery's ('' = none)."""
    return config.remediator.rollout.prometheus_url or config.discovery.prometheus_url


class QueryError(RuntimeError):
    """Prometheus did not answer a query (or answered an error); the message says how."""


def matcher(backends: Sequence[str]) -> str:
    """`backend="a"` or `backend=~"a|b\\\\.c"` for names from the configuration."""
    if len(backends) == 1:
        return f'backend="{backends[0]}"'
    return 'backend=~"' + "|".join(b.replace(".", "\\\\.") for b in sorted(backends)) + '"'


def requests_expr(sel: str, w: str) -> str:
    return (f"sum(increase(vllm:request_success_total{{{sel}}}[{w}])) or "
            f"sum(increase(sglang:num_requests_total{{{sel}}}[{w}]))")


def probes_expr(sel: str, w: str) -> str:
    return f"sum(increase(llm_health_probes_sent_total{{{sel}}}[{w}]))"


def errors_expr(sel: str, w: str) -> str:
    """5xx over all: the 5xx child exists only once a 5xx happened, so none is 0 (`or vector(0)`), never no
    data; no request at all stays no data (0 / nothing)."""
    return (f'(sum(increase(http_requests_total{{{sel},handler=~"/v1/.*",status="5xx"}}[{w}])) or vector(0)) / '
            f'sum(increase(http_requests_total{{{sel},handler=~"/v1/.*"}}[{w}]))')


def p95_expr(histograms: tuple[str, ...], sel: str, w: str) -> str:
    return " or ".join(f"histogram_quantile(0.95, sum by (le) (increase({h}_bucket{{{sel}}}[{w}])))"
                       for h in histograms)


TTFT = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")
E2E = ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds")


@dataclass
class Prometheus:
    url: str
    timeout: float = 10.0          # one query, whole (connect, headers, body)
    budget: float = 30.0           # every query of one measurement or summary together

    def query(self, expr: str, deadline: float) -> list[tuple[dict[str, str], float]]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise QueryError("the gate's time for its queries ran out")
        try:
            resp = fetch("GET", self.url.rstrip("/") + "/api/v1/query", timeout=min(self.timeout, left),
                         params={"query": expr}, headers={"Accept": "application/json"}, max_bytes=MAX_ANSWER_BYTES)
        except (HttpFailure, OSError) as exc:
            raise QueryError(f"Prometheus at {self.url}: {exc}") from exc
        try:
            body = resp.json()
        except ValueError as exc:
            raise QueryError(f"Prometheus answered HTTP {resp.status} without JSON") from exc
        if resp.status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error", "") if isinstance(body, dict) else ""
            raise QueryError(f"Prometheus answered HTTP {resp.status}: {str(err)[:200]}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise QueryError(f"Prometheus answered a {data.get('resultType')!r}, not a vector")
        out: list[tuple[dict[str, str], float]] = []
        for item in data.get("result") or []:
            try:
                out.append((dict(item.get("metric") or {}), float(item["value"][1])))
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise QueryError(f"Prometheus answered a malformed sample: {exc}") from exc
        return out

    def scalar(self, expr: str, deadline: float) -> float | None:
        """The first sample's value; None when there is none or it is NaN (no data)."""
        result = self.query(expr, deadline)
        if not result:
            return None
        value = result[0][1]
        return None if math.isnan(value) or math.isinf(value) else value

    # -- what the gate reads --------------------------------------------------------------------------
    def measure(self, canary: str) -> Measurement:
        deadline = time.monotonic() + self.budget
        try:
            result = self.query(f'llm_health_verdict_code{{{matcher([canary])}}}', deadline)
        except QueryError as exc:
            return Measurement(error=str(exc))
        verdicts = [BY_CODE.get(int(v), Verdict.UNKNOWN) for _, v in result if not math.isnan(v)]
        return Measurement(verdict=worst(verdicts))

    def summary(self, canary: str, fleet: Sequence[str], window: float) -> Summary:
        w = f"{max(1, int(window))}s"
        deadline = time.monotonic() + self.budget
        me = matcher([canary])
        them = matcher(fleet) if fleet else ""
        try:
            requests = self.scalar(requests_expr(me, w), deadline)
            probes = self.scalar(probes_expr(me, w), deadline) or 0.0

            def both(expr: str) -> tuple[float | None, float | None]:
                return self.scalar(expr.replace("SEL", me), deadline), (
                    self.scalar(expr.replace("SEL", them), deadline) if them else None)

            err, fleet_err = both(errors_expr("SEL", w))
            ttft, fleet_ttft = both(p95_expr(TTFT, "SEL", w))
            e2e, fleet_e2e = both(p95_expr(E2E, "SEL", w))
        except QueryError as exc:
            return Summary(error=str(exc))
        user = None if requests is None else max(0.0, requests - probes)
        return Summary(requests=user, probes=probes, error_ratio=err, fleet_error_ratio=fleet_err, ttft_p95=ttft,
                       fleet_ttft_p95=fleet_ttft, e2e_p95=e2e, fleet_e2e_p95=fleet_e2e, fleet=len(fleet))


def worst(verdicts: Sequence[Verdict]) -> Verdict | None:
    """Of several exporters' verdicts: a failing one wins, then a working one, then an inconclusive one."""
    for v in verdicts:
        if v in FAILING:
            return v
    for v in verdicts:
        if v not in INCONCLUSIVE:
            return v
    return verdicts[0] if verdicts else None
