"""What the gate asks Prometheus (remediator/rollout/queries.py): the queries evaluated by the real promtool
over series shaped like vLLM's, and the answers read from a Prometheus-shaped HTTP server (NaN is no data,
an error answer or a hung server is a query error within the deadline)."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_health.exporter.verdict import Verdict
from llm_health.httpserver import QuietHandler
from llm_health.remediator.rollout.queries import (
    TTFT,
    Prometheus,
    errors_expr,
    matcher,
    p95_expr,
    probes_expr,
    requests_expr,
)
from tests.support.loopback import Loopback

PROMTOOL = shutil.which("promtool")
V1 = '{{backend="{b}",handler="/v1/completions",method="POST",status="{s}"}}'


def test_names_from_the_configuration_are_matched_exactly() -> None:
    assert matcher(["gpu-a"]) == 'backend="gpu-a"'
    assert matcher(["b.2", "a-1"]) == 'backend=~"a-1|b\\\\.2"'     # `.` escaped for the regular expression


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_the_queries_on_vllm_shaped_series(tmp_path: Path) -> None:
    series = [
        # canary c: healthy, no 5xx child at all; d: half its requests fail; fleet f1 (a few 5xx), f2
        {"series": "http_requests_total" + V1.format(b="c", s="2xx"), "values": "0+10x10"},
        {"series": "http_requests_total" + V1.format(b="d", s="2xx"), "values": "0+10x10"},
        {"series": "http_requests_total" + V1.format(b="d", s="5xx"), "values": "0+10x10"},
        {"series": "http_requests_total" + V1.format(b="f1", s="2xx"), "values": "0+9x10"},
        {"series": "http_requests_total" + V1.format(b="f1", s="5xx"), "values": "0+1x10"},
        {"series": "http_requests_total" + V1.format(b="f2", s="2xx"), "values": "0+10x10"},
        {"series": 'vllm:request_success_total{backend="c",finished_reason="length"}', "values": "0+12x10"},
        {"series": 'llm_health_probes_sent_total{backend="c"}', "values": "0+2x10"},
        *({"series": f'vllm:time_to_first_token_seconds_bucket{{backend="c",le="{le}"}}', "values": v}
          for le, v in (("0.1", "0+0x10"), ("0.5", "0+10x10"), ("+Inf", "0+10x10"))),
    ]
    w = "5m"
    cases = [
        (errors_expr(matcher(["c"]), w), [0.0]),              # no 5xx child: 0, not "no data"
        (errors_expr(matcher(["d"]), w), [0.5]),
        (errors_expr(matcher(["f1", "f2"]), w), [1 / 20]),
        (errors_expr(matcher(["none"]), w), None),            # no request at all: no data
        (requests_expr(matcher(["c"]), w), [60.0]),
        (probes_expr(matcher(["c"]), w), [10.0]),
        (p95_expr(TTFT, matcher(["c"]), w), [0.48]),          # within (0.1, 0.5]
    ]
    tests = [{"expr": expr, "eval_time": "10m",
              "exp_samples": [] if want is None else [{"value": v} for v in want]} for expr, want in cases]
    path = tmp_path / "queries_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": tests}]}))
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


class FakeProm:
    """/api/v1/query answering from `answers` (expr -> result list), `status`, or holding until released."""

    def __init__(self) -> None:
        self.answers: dict[str, list[dict[str, Any]]] = {}
        self.status = 200
        self.hold = threading.Event()
        self.hold.set()
        self.asked: list[str] = []
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802
                from urllib.parse import parse_qs, urlsplit
                expr = parse_qs(urlsplit(self.path).query)["query"][0]
                outer.asked.append(expr)
                outer.hold.wait(10)
                if outer.status != 200:
                    self.reply_json(outer.status, {"status": "error", "error": "bad_data: parse error"})
                    return
                result = outer.answers.get(expr, [])
                self.reply_json(200, {"status": "success", "data": {"resultType": "vector", "result": result}})

        self.server = Loopback(Handler)


@pytest.fixture
def prom() -> Any:
    p = FakeProm()
    yield p
    p.hold.set()
    p.server.stop()


def sample(value: str, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1.0, value]}


def test_the_worst_verdict_of_the_exporters_wins_and_none_is_no_data(prom: FakeProm) -> None:
    gate = Prometheus(prom.server.url, timeout=2, budget=5)
    expr = 'llm_health_verdict_code{backend="c"}'
    assert gate.measure("c").verdict is None and not gate.measure("c").error
    prom.answers[expr] = [sample("1", instance="e1"), sample("5", instance="e2")]
    assert gate.measure("c").verdict == Verdict.STALLED
    prom.answers[expr] = [sample("0", instance="e1"), sample("2", instance="e2")]
    assert gate.measure("c").verdict == Verdict.BUSY


def test_nan_is_no_data_and_probes_are_taken_from_the_requests(prom: FakeProm) -> None:
    gate = Prometheus(prom.server.url, timeout=2, budget=5)
    prom.answers[requests_expr('backend="c"', "60s")] = [sample("30")]
    prom.answers[probes_expr('backend="c"', "60s")] = [sample("4")]
    prom.answers[p95_expr(TTFT, 'backend="c"', "60s")] = [sample("NaN")]
    s = gate.summary("c", ["f"], 60)
    assert not s.error and s.requests == 26 and s.probes == 4 and s.ttft_p95 is None and s.fleet == 1


def test_an_error_answer_or_a_hung_prometheus_is_a_query_error_within_the_deadline(prom: FakeProm) -> None:
    import time

    prom.status = 400
    assert "HTTP 400" in Prometheus(prom.server.url, timeout=2, budget=5).measure("c").error
    prom.status = 200
    prom.hold.clear()                                    # Prometheus hangs
    t = time.monotonic()
    s = Prometheus(prom.server.url, timeout=0.5, budget=1.0).summary("c", ["f"], 60)
    assert s.error and time.monotonic() - t < 5
