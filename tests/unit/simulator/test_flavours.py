"""Simulator flavours `sglang` and `llamacpp`: pages like the real ones (series, types, labels, what moves
when) and the engine-specific HTTP behaviour (llama.cpp's hanging /metrics, its start-time header,
503 while loading; SGLang's generating /health). Facts: docs/reference/llamacpp-facts.md and
docs/reference/vllm-metrics-facts.md §5.1; real captures in tests/fixtures/metrics/."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from llm_health.drill.procs import free_port, wait_until
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import Flavour, render
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.paths import PAGES
from tests.support.simserver import Background, completion, fault, stats

FIXTURES = PAGES


def families(text: str) -> dict[str, tuple[str, list]]:
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def value(text: str, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


@pytest.fixture
def make_sim() -> Iterator[Callable[..., Simulator]]:
    started: list[Simulator] = []

    def make(**kw: Any) -> Simulator:
        sim = Simulator(SimConfig(port=free_port(), control_port=free_port(), **kw)).start()
        started.append(sim)
        wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="simulator up")
        return sim

    yield make
    for sim in started:
        sim.stop()


def run(engine: Engine, until: float) -> None:
    engine.advance_to(until)


# --- llama.cpp: the page ---------------------------------------------------------------------------


def test_llamacpp_page_is_unlabelled_with_help_and_type_and_no_process_or_kv_series() -> None:
    e = Engine(flavour="llamacpp", max_num_seqs=2)
    e.submit(20, 10)
    run(e, 0.2)
    text = render(e, "llamacpp")
    fams = families(text)
    assert set(fams) == {
        "llamacpp:prompt_tokens", "llamacpp:prompt_seconds", "llamacpp:tokens_predicted",
        "llamacpp:tokens_predicted_seconds", "llamacpp:prompt_tokens_cached", "llamacpp:n_decode",
        "llamacpp:n_tokens_max", "llamacpp:n_busy_slots_per_decode", "llamacpp:prompt_tokens_seconds",
        "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing", "llamacpp:requests_deferred",
    }
    assert fams["llamacpp:n_decode"][0] == "counter"
    assert fams["llamacpp:requests_processing"][0] == "gauge"
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert all("{" not in ln for ln in lines)
    assert not any(ln.startswith(("process_", "python_")) or "_created" in ln or "kv_cache" in ln for ln in lines)
    # every series has its HELP and TYPE line
    for ln in lines:
        name = ln.split()[0]
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text, name


def test_llamacpp_page_matches_the_real_capture_for_the_series_it_shows() -> None:
    real = (FIXTURES / "llamacpp-ik_llama-pr695.txt").read_text()
    real_fams = families(real)
    ours = families(render(Engine(flavour="llamacpp"), "llamacpp"))
    assert real_fams, "the capture parses"
    for name, (kind, samples) in real_fams.items():
        assert name in ours, name
        assert ours[name][0] == kind, name
        assert all(not s.labels for s in samples) and all(not s.labels for s in ours[name][1])
    # HELP texts of the capture are the ones we print
    for line in real.splitlines():
        if line.startswith("# HELP "):
            assert line in render(Engine(flavour="llamacpp"), "llamacpp"), line


def test_llamacpp_tokens_predicted_moves_only_at_completion_n_decode_every_step() -> None:
    e = Engine(flavour="llamacpp", max_num_seqs=2, step_seconds=0.05)
    e.submit(10, 40)
    decodes, predicted = [], []
    for i in range(1, 30):
        run(e, i * 0.05)
        text = render(e, "llamacpp")
        decodes.append(value(text, "llamacpp:n_decode_total"))
        predicted.append(value(text, "llamacpp:tokens_predicted_total"))
        assert value(text, "llamacpp:requests_processing") == 1
    assert decodes == sorted(decodes) and decodes[-1] - decodes[0] >= 25   # one llama_decode per step
    assert set(predicted) == {0.0}                                        # flat for the request's life
    run(e, 5.0)
    text = render(e, "llamacpp")
    assert value(text, "llamacpp:tokens_predicted_total") == 40             # +N at once when it finishes
    assert value(text, "llamacpp:requests_processing") == 0
    assert value(text, "llamacpp:prompt_tokens_total") == 10


def test_llamacpp_deferred_counts_tasks_waiting_for_a_slot() -> None:
    e = Engine(flavour="llamacpp", max_num_seqs=2)
    for _ in range(5):
        e.submit(10, 100)
    run(e, 0.2)
    text = render(e, "llamacpp")
    assert value(text, "llamacpp:requests_processing") == 2
    assert value(text, "llamacpp:requests_deferred") == 3


def test_llamacpp_throughput_window_is_stolen_by_every_read() -> None:
    e = Engine(flavour="llamacpp", max_num_seqs=2, step_seconds=0.05)
    e.submit(10, 5)
    run(e, 2.0)
    first = render(e, "llamacpp")
    assert value(first, "llamacpp:predicted_tokens_seconds") > 0
    second = render(e, "llamacpp")   # another scraper read the page in between: its window is empty
    assert value(second, "llamacpp:predicted_tokens_seconds") == 0
    assert value(second, "llamacpp:tokens_predicted_total") == 5


# --- SGLang: the page ------------------------------------------------------------------------------

SCHED = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}


def test_sglang_page_names_types_and_label_sets() -> None:
    engines = [Engine(flavour="sglang", index=i) for i in range(2)]
    for e in engines:
        e.submit(50, 20)
        run(e, 0.2)
    text = render(engines, Flavour(engine="sglang", tp_size=2))
    fams = families(text)
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:prompt_tokens",
            "sglang:generation_tokens", "sglang:cuda_graph_passes"} <= set(fams)
    assert fams["sglang:num_running_reqs"][0] == "gauge" and fams["sglang:generation_tokens"][0] == "counter"
    running = fams["sglang:num_running_reqs"][1]
    assert {(s.labels["dp_rank"], s.labels["tp_rank"]) for s in running} == {("0", "0"), ("0", "1"), ("1", "0"),
                                                                             ("1", "1")}
    assert all(set(s.labels) == SCHED | {"dp_rank"} for s in running)
    # tokenizer-side counters: one per model, no rank labels (0.5.23: engine_type and is_streaming too)
    assert [s.labels for s in fams["sglang:generation_tokens"][1]] == [
        {"engine_type": "unified", "is_streaming": "false", "model_name": "sim-model"}]
    # multiprocess mode: no process_*, no _created, HELP "Multiprocess metric", counters first
    assert "process_" not in text and "_created" not in text
    assert all(ln.endswith("Multiprocess metric") for ln in text.splitlines() if ln.startswith("# HELP"))
    types = [ln.split()[3] for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert types == sorted(types, key=["counter", "gauge", "histogram"].index)


def test_sglang_single_engine_has_no_dp_rank() -> None:
    text = render(Engine(flavour="sglang"), "sglang")
    labels = families(text)["sglang:num_running_reqs"][1][0].labels
    assert set(labels) == SCHED and labels["tp_rank"] == "0"


def test_sglang_capture_names_exist_with_their_types() -> None:
    real = families((FIXTURES / "sglang-0.3.x-pr1853.txt").read_text())
    ours = families(render(Engine(flavour="sglang"), "sglang"))
    shared = set(real) & set(ours)
    assert {"sglang:prompt_tokens", "sglang:max_total_num_tokens"} <= shared
    assert all(real[n][0] == ours[n][0] for n in shared)


def test_sglang_gauges_are_published_every_40_decode_batches_prefill_and_idle() -> None:
    e = Engine(flavour="sglang", step_seconds=0.01, chunk_tokens=512)
    e.submit(10, 200)
    run(e, 0.011)                      # the prefill batch publishes at once
    assert e.stats.running == 1
    e.submit(10, 200)
    run(e, 0.021)                      # its prefill batch publishes too
    assert e.stats.running == 2
    kv = e.stats.kv_usage
    run(e, 0.021 + 0.01 * 30)          # 30 decode batches: the published gauges lag
    assert e.stats.kv_usage == kv
    passes = e.stats.decode_passes
    run(e, 0.021 + 0.01 * 41)          # the 40th decode batch publishes
    assert e.stats.kv_usage > kv and e.stats.decode_passes > passes
    run(e, 10.0)                       # finished: going idle publishes zeros
    assert (e.stats.running, e.stats.waiting, e.stats.kv_usage) == (0, 0, 0)


# --- HTTP behaviour ---------------------------------------------------------------------------------


def test_llamacpp_metrics_hang_while_idle_loop_is_frozen_but_health_answers(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(engine="llamacpp", max_num_seqs=2)
    r = requests.get(sim.url + "/metrics", timeout=5)
    start = r.headers["Process-Start-Time-Unix"]
    assert r.ok and "llamacpp:n_decode_total 0" in r.text
    assert fault(sim.control_url, {"fault": "stall"}).ok
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(sim.url + "/metrics", timeout=0.5)
    assert requests.get(sim.url + "/health", timeout=2).status_code == 200
    waiting = Background(lambda: requests.get(sim.url + "/metrics", timeout=10))
    assert fault(sim.control_url, {"fault": "none"}).ok
    assert waiting.done.wait(10) and waiting.result.status_code == 200   # the loop resumes: it answers
    assert waiting.result.headers["Process-Start-Time-Unix"] == start


def test_llamacpp_stall_inside_decode_serves_the_frozen_page(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(engine="llamacpp", max_num_seqs=2, step_seconds=0.02)
    job = completion(sim.url, 100_000 // 100)
    wait_until(lambda: "llamacpp:requests_processing 1" in requests.get(sim.url + "/metrics", timeout=5).text,
               what="request running")
    assert fault(sim.control_url, {"fault": "stall"}).ok
    first = requests.get(sim.url + "/metrics", timeout=2).text
    late = completion(sim.url, 5)   # new work during the stall: the frozen page does not show it
    wait_until(lambda: stats(sim)["requests"].get("POST /v1/completions") == 2, what="late request arrived")
    second = requests.get(sim.url + "/metrics", timeout=2).text
    assert value(first, "llamacpp:n_decode_total") == value(second, "llamacpp:n_decode_total")
    assert value(second, "llamacpp:requests_processing") == 1 and value(second, "llamacpp:requests_deferred") == 0
    assert requests.get(sim.url + "/health", timeout=2).status_code == 200
    assert fault(sim.control_url, {"fault": "none"}).ok
    wait_until(lambda: value(requests.get(sim.url + "/metrics", timeout=5).text, "llamacpp:n_decode_total")
               > value(second, "llamacpp:n_decode_total"), what="counters carry on after the stall")
    assert fault(sim.control_url, {"fault": "restart", "seconds": 0}).ok
    for bg in (job, late):
        assert bg.done.wait(10)


def test_llamacpp_restart_resets_counters_and_changes_the_start_header(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(engine="llamacpp", step_seconds=0.01)
    job = completion(sim.url, 5)
    assert job.done.wait(10) and job.result.status_code == 200
    before = requests.get(sim.url + "/metrics", timeout=5)
    assert value(before.text, "llamacpp:n_decode_total") > 0
    assert fault(sim.control_url, {"fault": "restart", "seconds": 0.2}).ok
    wait_until(lambda: stats(sim)["restarts"] == 1 and stats(sim)["port_open"], what="restarted")
    after = requests.get(sim.url + "/metrics", timeout=5)
    assert value(after.text, "llamacpp:n_decode_total") == 0
    assert after.headers["Process-Start-Time-Unix"] != before.headers["Process-Start-Time-Unix"]


@pytest.mark.parametrize("engine", ["llamacpp", "sglang"])
def test_loading_model_answers_503(engine: str, make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(engine=engine)
    sim.cfg.load_seconds = 600.0   # the next start loads for a long time
    assert fault(sim.control_url, {"fault": "restart", "seconds": 0}).ok
    wait_until(lambda: stats(sim)["restarts"] == 1 and stats(sim)["port_open"], what="restarted")
    health = requests.get(sim.url + "/health", timeout=5)
    assert health.status_code == 503
    gen = requests.post(sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
    assert gen.status_code == 503
    metrics = requests.get(sim.url + "/metrics", timeout=5)
    if engine == "llamacpp":
        assert metrics.status_code == 503 and "Loading model" in metrics.text and "Loading model" in health.text
    else:
        assert metrics.status_code == 200
    assert stats(sim)["loading"] is True


def test_sglang_health_fails_after_its_timeout_when_the_engine_is_stalled(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(engine="sglang", time_scale=40.0)   # SGLang's 20 s health timeout becomes 0.5 s
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200
    assert fault(sim.control_url, {"fault": "stall"}).ok
    assert requests.get(sim.url + "/health", timeout=5).status_code == 503
    assert requests.get(sim.url + "/metrics", timeout=5).status_code == 200


@pytest.mark.parametrize("engine", ["sglang", "llamacpp"])
def test_every_fault_works_for_the_flavour(engine: str, make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(engine=engine, step_seconds=0.01, time_scale=40.0)
    # error: generation fails, metrics fine
    assert fault(sim.control_url, {"fault": "error"}).ok
    assert requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=5).status_code == 500
    assert requests.get(sim.url + "/metrics", timeout=5).ok
    # slow_metrics: delayed by 20 engine seconds = 0.5 s
    assert fault(sim.control_url, {"fault": "slow_metrics", "seconds": 20}).ok
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(sim.url + "/metrics", timeout=0.2)
    # hang: nothing answers
    assert fault(sim.control_url, {"fault": "hang"}).ok
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(sim.url + "/health", timeout=0.3)
    # stall with work: the engine stops stepping
    assert fault(sim.control_url, {"fault": "none"}).ok
    job = completion(sim.url, 10_000)
    wait_until(lambda: stats(sim)["running"] == 1, what="running")
    assert fault(sim.control_url, {"fault": "stall", "seconds": 40}).ok
    assert not job.done.wait(0.3)
    # crash: refused, in-flight dropped; restart: a new process
    assert fault(sim.control_url, {"fault": "crash"}).ok
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(sim.url + "/health", timeout=2)
    assert job.done.wait(10)
    assert fault(sim.control_url, {"fault": "restart", "seconds": 0}).ok
    wait_until(lambda: requests.get(sim.url + "/health", timeout=2).ok, what="back after restart")
    assert stats(sim)["restarts"] == 1
