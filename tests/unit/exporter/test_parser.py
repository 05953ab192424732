"""The fast parser and the Reading built from it, against prometheus_client and the real captures."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_health.exporter.parser import parse
from llm_health.exporter.reading import read_text, wanted
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import Flavour, render
from tests.support.paths import PAGES

# Real /metrics pages from public sources, kept verbatim in the repository (each file's header names its source).
FIXTURES = PAGES
CAPTURES = sorted(FIXTURES.glob("*.txt"))


def _reference(text: str) -> list[tuple[str, tuple, float]]:
    out = []
    wire = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if fam.type == "counter" and name == fam.name + "_total" and name not in wire and fam.name in wire:
                # prometheus_client names a counter sample without `_total` (llama.cpp's
                # `llamacpp:n_tokens_max`) `..._total`; Prometheus and our parser keep the wire name
                name = fam.name
            out.append((name, tuple(sorted(s.labels.items())), s.value))
    return out


def _ours(text: str, keep=None) -> list[tuple[str, tuple, float]]:
    return [(s.name, tuple(sorted(s.labels.items())), s.value) for s in parse(text, keep=keep).samples]


def _same(a: list, b: list) -> None:
    def key(x):
        return (x[0], x[1], -1e300 if math.isnan(x[2]) else x[2])

    assert sorted(map(key, a)) == sorted(map(key, b))


def _busy_engine(flavour: str, index: int = 0) -> Engine:
    e = Engine(flavour=flavour, index=index, max_num_seqs=4)
    for _ in range(6):
        e.submit(prompt_tokens=300, max_tokens=50)
    e.advance_to(0.5)
    return e


# the API server's http_requests_total as the simulator server passes it (v1 only)
HTTP = {("/v1/completions", "POST", "2xx"): (3, 1.7e9), ("/v1/models", "GET", "2xx"): (1, 1.7e9 + 1),
        ("/v1/completions", "POST", "5xx"): (2, 1.7e9 + 2), ("none", "GET", "4xx"): (1, 1.7e9 + 3)}


def _sim_pages() -> dict[str, str]:
    return {
        "v1": render(_busy_engine("v1"), "v1", process_start_time=1.7e9),
        "v1-http": render(_busy_engine("v1"), "v1", process_start_time=1.7e9, http_requests=HTTP),
        "v1-http-empty": render(_busy_engine("v1"), "v1", process_start_time=1.7e9, http_requests={}),
        "v1-mp-http": render(_busy_engine("v1"), Flavour("v1", multiprocess=True), http_requests=HTTP),
        "v0": render(_busy_engine("v0"), "v0", process_start_time=1.7e9),
        "v1-mp": render(_busy_engine("v1"), Flavour("v1", multiprocess=True)),
        "v0-mp": render(_busy_engine("v0"), Flavour("v0", multiprocess=True)),
        "v1-2engines": render([_busy_engine("v1", 0), _busy_engine("v1", 1)], "v1", process_start_time=1.7e9),
    }


def test_capture_fixtures_are_there_and_say_where_they_come_from() -> None:
    # A glob that finds nothing would parametrize zero tests: that is a failure, not a pass.
    assert len(CAPTURES) >= 6, f"expected the real /metrics captures in {FIXTURES}"
    for path in CAPTURES:
        text = path.read_text()
        assert text.startswith("# SOURCE:"), f"{path.name}: first line must name its source"
        assert len(text.splitlines()) > 5, f"{path.name}: empty capture"


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_capture_parses_like_prometheus_client(path: Path) -> None:
    text = path.read_text()
    assert _ours(text)  # something was read
    _same(_ours(text), _reference(text))
    read_text(text)  # and a Reading is built without error


@pytest.mark.parametrize("name", ["v1", "v1-http", "v1-http-empty", "v1-mp-http", "v0", "v1-mp", "v0-mp",
                                  "v1-2engines"])
def test_simulator_pages_parse_like_prometheus_client(name: str) -> None:
    text = _sim_pages()[name]
    _same(_ours(text), _reference(text))
    # the kept subset has the same values as the reference for the series we use
    ref = [x for x in _reference(text) if wanted(x[0])]
    _same(_ours(text, keep=wanted), ref)
    assert _ours(text, keep=wanted)


def test_tricky_lines() -> None:
    text = "\n".join([
        "# HELP x_total a counter with \\\"quotes\\\"",
        "# TYPE x_total counter",
        'x_total{a="with \\"quote\\" and , comma",b="brace } {",c="back\\\\slash",d="new\\nline"} 3.5 1700000000000',
        'x_total{ a = "spaced" , } +Inf',
        "y -Inf",
        "z NaN",
        'w{le="+Inf"} 1e+09',
        "",
        "   ",
    ])
    _same(_ours(text), _reference(text))


def test_malformed_lines_are_skipped_not_fatal() -> None:
    text = 'good 1\nbad{a="unterminated} 2\nnovalue\nx{a="1"} notanumber\nalso_good{a="b"} 2\n'
    page = parse(text)
    assert [(s.name, s.value) for s in page.samples] == [("good", 1.0), ("also_good", 2.0)]
    assert page.skipped == 3


def test_keep_only_the_needed_series() -> None:
    text = _sim_pages()["v1"]
    names = {s.name for s in parse(text, keep=wanted).samples}
    assert "vllm:num_requests_running" in names
    assert "vllm:iteration_tokens_total_count" in names
    buckets = {n for n in names if n.endswith("_bucket")}
    assert buckets == {"vllm:inter_token_latency_seconds_bucket", "vllm:request_prefill_time_seconds_bucket"}, \
        "only the step histograms' buckets are kept (exporter/steptime.py)"
    assert "vllm:iteration_tokens_total_bucket" not in names and "vllm:e2e_request_latency_seconds_bucket" not in names
    assert "process_start_time_seconds" in names


def test_reading_v1_single_process() -> None:
    r = read_text(_sim_pages()["v1"])
    assert r.flavour == "v1"
    assert set(r.engines) == {"0"}
    eng = r.engines["0"]
    assert eng.running == 4 and eng.waiting == 2
    assert eng.kv_usage is not None and eng.kv_usage > 0
    assert eng.counters["generation_tokens"] > 0
    assert "iteration_count" in eng.counters
    assert r.process_start == 1.7e9
    assert r.created  # *_created series are the process identity in V1


def test_reading_v0_does_not_trust_iteration_count() -> None:
    r = read_text(_sim_pages()["v0"])
    assert r.flavour == "v0"
    assert "iteration_count" not in r.engines["0"].counters
    assert "iteration_tokens_sum" in r.engines["0"].counters
    assert not r.created


def test_reading_multiprocess_has_no_process_identity() -> None:
    r = read_text(_sim_pages()["v1-mp"])
    assert r.flavour == "v1"
    assert r.process_start is None and not r.created
    assert r.engines["0"].work == 6


def test_reading_two_engines() -> None:
    r = read_text(_sim_pages()["v1-2engines"])
    assert set(r.engines) == {"0", "1"}
    assert r.work == 12


def test_reading_captures() -> None:
    by_name = {p.name: read_text(p.read_text()) for p in CAPTURES}
    v0 = by_name["vllm-0.7-v0-mq-aibrix-runtime-doc.txt"]
    assert v0.flavour == "v0" and v0.work == 0 and v0.process_start is None
    assert v0.engines["0"].counters["generation_tokens"] == 955
    v1 = by_name["vllm-0.8.1-v1-production-stack-318.txt"]
    assert v1.flavour == "v1" and v1.process_start == pytest.approx(1.74262400557e9)
    assert not by_name["vllm-0.5.4-issue7188-python-only.txt"].has_engine_metrics
    # excerpts without a running-requests gauge cannot be judged: no engine metrics, not an error
    assert not by_name["sglang-0.3.x-pr1853.txt"].has_engine_metrics
    assert not by_name["llamacpp-ik_llama-pr695.txt"].has_engine_metrics


SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="1"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.25
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 1234.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 99.0
# TYPE sglang:cuda_graph_passes_total counter
sglang:cuda_graph_passes_total{mode="decode_cuda_graph",model_name="m",tp_rank="0"} 10.0
sglang:cuda_graph_passes_total{mode="prefill_none",model_name="m",tp_rank="0"} 5.0
"""

LLAMACPP_PAGE = """\
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3469
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 4000
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""


def test_reading_sglang_counts_rank_zero_only() -> None:
    _same(_ours(SGLANG_PAGE), _reference(SGLANG_PAGE))
    r = read_text(SGLANG_PAGE)
    assert r.flavour == "sglang"
    assert r.running == 3 and r.waiting == 2
    eng = r.engines["0"]
    assert eng.kv_usage == 0.25
    assert eng.counters == {"generation_tokens": 1234.0, "prompt_tokens": 99.0, "forward_passes": 15.0}


def test_reading_llamacpp() -> None:
    _same(_ours(LLAMACPP_PAGE), _reference(LLAMACPP_PAGE))
    r = read_text(LLAMACPP_PAGE)
    assert r.flavour == "llamacpp" and r.running == 1 and r.waiting == 0
    assert r.engines["0"].counters["decode_calls"] == 4000


def test_crlf_and_indented_lines_read_like_plain_ones() -> None:
    text = _sim_pages()["v1"]
    crlf = text.replace("\n", "\r\n")
    indented = "\n".join("  " + line + " " for line in text.splitlines())
    assert _ours(crlf) == _ours(text) == _ours(indented)
    assert read_text(crlf).engines == read_text(text).engines
