"""The simulated /metrics page: real vLLM names, types, labels; parses with prometheus_client."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from llm_health.simulator.engine import ITERATION_TOKENS_BUCKETS, Engine
from llm_health.simulator.metrics import Flavour, render

START = 1_700_000_000.25


def parse(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    for (n, lab), v in samples(text).items():
        if n == name and all(dict(lab).get(k) == want for k, want in labels.items()):
            return v
    raise KeyError(name)


def busy_engine(flavour: str, index: int = 0) -> Engine:
    e = Engine(flavour=flavour, step_seconds=0.1, index=index)
    e.submit(100, 5)
    e.submit(30, 2)
    e.advance_to(10)
    return e


def test_v1_page_names_types_labels() -> None:
    text = render(busy_engine("v1"), Flavour("v1", model="m"), process_start_time=START, created=START + 1)
    fams = parse(text)
    types = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:engine_sleep_state": "gauge",
        "vllm:cache_config_info": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:iteration_tokens_total": "histogram",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "process_start_time_seconds": "gauge",
    }
    for name, kind in types.items():
        assert fams[name].type == kind, name
    assert "vllm:gpu_cache_usage_perc" not in fams and "vllm:num_requests_swapped" not in fams
    assert fams["vllm:num_requests_running"].documentation == "Number of requests in model execution batches."
    assert value(text, "vllm:num_requests_running", engine="0", model_name="m") == 0
    assert value(text, "vllm:prompt_tokens_total", engine="0") == 130
    assert value(text, "vllm:generation_tokens_total", engine="0") == 7
    for reason, n in (("stop", 0), ("length", 2), ("abort", 0)):
        assert value(text, "vllm:request_success_total", finished_reason=reason) == n
    assert value(text, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert value(text, "process_start_time_seconds") == START
    assert value(text, "vllm:prompt_tokens_created", engine="0") == START + 1
    assert value(text, "vllm:iteration_tokens_total_created", engine="0") == START + 1
    assert value(text, "vllm:cache_config_info", engine="0", block_size="16") == 1
    bounds = [s.labels["le"] for s in fams["vllm:iteration_tokens_total"].samples if s.name.endswith("_bucket")]
    assert bounds == [*(f"{float(b)}" for b in ITERATION_TOKENS_BUCKETS), "+Inf"]
    ttft = [s.labels["le"] for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")]
    assert ttft[-3:] == ["640.0", "2560.0", "+Inf"]
    e2e = [s.labels["le"] for s in fams["vllm:e2e_request_latency_seconds"].samples if s.name.endswith("_bucket")]
    assert e2e[0] == "0.3" and e2e[-2:] == ["7680.0", "+Inf"]
    assert "python_gc_objects_collected_total" in text and "process_cpu_seconds_total" in text


def test_v0_page_model_name_only_swapped_no_created() -> None:
    text = render(busy_engine("v0"), Flavour("v0", model="m"), process_start_time=START)
    fams = parse(text)
    assert "vllm:gpu_cache_usage_perc" in fams and "vllm:num_requests_swapped" in fams
    assert "vllm:kv_cache_usage_perc" not in fams and "vllm:engine_sleep_state" not in fams
    assert fams["vllm:num_requests_running"].documentation == "Number of requests currently running on GPU."
    assert "_created" not in text and 'engine="' not in text
    assert value(text, "vllm:num_requests_running", model_name="m") == 0
    assert value(text, "process_start_time_seconds") == START
    # lazily created finished_reason children: only what happened
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
    assert reasons == {"length"}


def test_multiprocess_page_has_no_process_python_or_created_and_sum_first() -> None:
    text = render(busy_engine("v1"), Flavour("v1", multiprocess=True), process_start_time=START)
    parse(text)
    assert "process_" not in text and "python_" not in text and "_created" not in text
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:iteration_tokens_total")]
    assert lines[0].startswith("vllm:iteration_tokens_total_sum")
    kinds = [ln.split()[-1] for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert kinds == sorted(kinds, key=["counter", "gauge", "histogram"].index)


def test_two_engines_have_separate_series() -> None:
    engines = [busy_engine("v1", 0), Engine(flavour="v1", index=1)]
    text = render(engines, Flavour("v1"), process_start_time=START)
    assert value(text, "vllm:generation_tokens_total", engine="0") == 7
    assert value(text, "vllm:generation_tokens_total", engine="1") == 0
    assert value(text, "vllm:cache_config_info", engine="1") == 1


def test_long_prompt_page_kv_moves_while_count_and_generation_stay() -> None:
    e = Engine(flavour="v1", step_seconds=1.0, chunk_tokens=512, kv_blocks=1000, block_size=16)
    e.submit(4000, 4)
    pages = []
    for t in range(1, 5):
        e.advance_to(t)
        pages.append(render(e, "v1", process_start_time=START))
    kv = [value(p, "vllm:kv_cache_usage_perc") for p in pages]
    assert kv == sorted(kv) and len(set(kv)) == 4 and kv[0] > 0
    assert {value(p, "vllm:iteration_tokens_total_count") for p in pages} == {0}
    assert {value(p, "vllm:generation_tokens_total") for p in pages} == {0}
    assert {value(p, "vllm:num_requests_running") for p in pages} == {1}
