"""The simulated vLLM server over real HTTP on loopback (in-process threads, free ports)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from llm_health.drill.procs import free_port, wait_until
from llm_health.simulator.server import BadRequest, SimConfig, Simulator
from tests.support.simserver import Background, completion, fault, stats

PROBE = {"X-LLM-Health-Probe": "1"}


@pytest.fixture
def make_sim() -> Iterator[Callable[..., Simulator]]:
    started: list[Simulator] = []

    def make(**kw: Any) -> Simulator:
        kw.setdefault("port", free_port())
        kw.setdefault("control_port", free_port())
        sim = Simulator(SimConfig(**kw)).start()
        started.append(sim)
        wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="simulator up")
        return sim

    yield make
    for sim in started:
        sim.stop()


def metric(url: str, name: str, **labels: str) -> float:
    text = requests.get(url + "/metrics", timeout=5).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


def vllm_lines(url: str) -> list[str]:
    text = requests.get(url + "/metrics", timeout=5).text
    return [ln for ln in text.splitlines() if ln.startswith("vllm:")]


def test_openai_endpoints_and_stats(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10)
    models = requests.get(sim.url + "/v1/models", timeout=5).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "sim-model"
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "0.11.2"}
    r = requests.post(sim.url + "/v1/completions", json={"model": "sim-model", "prompt": "one two three",
                                                          "max_tokens": 4}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    assert body["choices"][0]["finish_reason"] == "length"
    r = requests.post(sim.url + "/v1/chat/completions", json={
        "model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}, timeout=10)
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    r = requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=PROBE, timeout=10)
    assert r.status_code == 200
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200
    assert metric(sim.url, "vllm:generation_tokens_total") == 7
    assert metric(sim.url, "vllm:request_success_total", finished_reason="length") == 3
    st = stats(sim)
    assert st["requests"]["POST /v1/completions"] == 2 and st["requests"]["POST /v1/chat/completions"] == 1
    assert st["by_kind"]["generation"] == 2 and st["by_kind"]["probe"] == 1
    assert st["by_kind"]["models"] == 1 and st["by_kind"]["metrics"] >= 1 and st["by_kind"]["health"] >= 1
    assert st["probes"] == 1 and st["probes_while_busy"] == 0
    assert st["fault"] == "none" and st["engine"] == "v1" and st["restarts"] == 0
    # the control port serves only /sim/*
    assert requests.get(f"{sim.control_url}/metrics", timeout=5).status_code == 404


def test_streaming_sse(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10)
    for path, body in (
        ("/v1/completions", {"prompt": "a b", "max_tokens": 5, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 5, "stream": True}),
    ):
        with requests.post(sim.url + path, json=body, stream=True, timeout=10) as r:
            assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            events = [ln[len("data: "):] for ln in r.iter_lines(decode_unicode=True) if ln]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        texts = [c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") for c in chunks]
        assert len([t for t in texts if t]) == 5
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_bad_input_gets_4xx_and_changes_nothing(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10)
    url = sim.url
    cases = [
        ("/v1/completions", "{not json"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "many"})),
        ("/v1/completions", json.dumps({"max_tokens": 3})),
        ("/v1/completions", json.dumps(["x"])),
        ("/v1/chat/completions", json.dumps({"messages": "hi"})),
        ("/v1/completions", json.dumps({"prompt": [1] * 40000, "max_tokens": 1})),
    ]
    for path, data in cases:
        r = requests.post(url + path, data=data, timeout=5)
        assert r.status_code == 400, (path, data, r.text)
        assert r.json()
    r = requests.post(url + "/v1/completions", json={"model": "other", "prompt": "x"}, timeout=5)
    assert r.status_code == 404 and "does not exist" in r.json()["message"]
    assert requests.get(url + "/nope", timeout=5).status_code == 404
    assert requests.get(url + "/v1/completions", timeout=5).status_code == 405
    for base in (url, sim.control_url):
        for body in ("{oops", {"fault": "explode"}, {"fault": 3}, {"fault": "stall", "seconds": "ten"},
                     {"fault": "stall", "seconds": -1}, {"fault": "stall", "extra": 1}, ["stall"]):
            r = fault(base, body)
            assert r.status_code == 400, body
            assert isinstance(r.json()["error"], str) and r.json()["error"]
    st = stats(sim)
    assert st["fault"] == "none" and st["restarts"] == 0 and st["running"] == 0 and st["waiting"] == 0
    assert metric(url, "vllm:prompt_tokens_total") == 0


def test_probe_behind_full_batch_waits_for_a_slot(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(max_num_seqs=2, step_seconds=0.02)
    batch = [completion(sim.url, 40)]
    wait_until(lambda: stats(sim)["running"] == 1, what="first batch request running")
    batch.append(completion(sim.url, 40))
    wait_until(lambda: stats(sim)["running"] == 2, what="batch running")
    probe = completion(sim.url, 1, headers=PROBE)
    wait_until(lambda: stats(sim)["waiting"] == 1, what="probe waiting")
    assert not probe.done.is_set()
    wait_until(lambda: metric(sim.url, "vllm:num_requests_waiting") == 1, what="waiting gauge")
    st = stats(sim)
    assert st["probes"] == 1 and st["probes_while_busy"] == 1 and st["generation_while_busy"] == 1
    assert probe.done.wait(20)
    assert probe.result.status_code == 200
    # the probe could only start once a batch request had finished (40 tokens each)
    assert metric(sim.url, "vllm:request_success_total", finished_reason="length") >= 2
    for b in batch:
        assert b.done.wait(20) and b.result.status_code == 200


def test_long_prompt_on_idle_v1_moves_kv_only(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(step_seconds=0.1, chunk_tokens=512, kv_blocks=2048, block_size=16)
    req = completion(sim.url, 2, prompt=[7] * 8000)  # 16 chunks: ~1.6 s of prefill
    seen: set[float] = set()

    def kv_moved_while_frozen() -> bool:
        text = requests.get(sim.url + "/metrics", timeout=5).text
        vals = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name in ("vllm:kv_cache_usage_perc", "vllm:iteration_tokens_total_count",
                              "vllm:generation_tokens_total")}
        assert vals["vllm:iteration_tokens_total_count"] == 0 and vals["vllm:generation_tokens_total"] == 0
        if vals["vllm:kv_cache_usage_perc"] > 0:
            seen.add(vals["vllm:kv_cache_usage_perc"])
        return len(seen) >= 3

    wait_until(kv_moved_while_frozen, timeout=10, interval=0.02, what="kv growing during prefill")
    assert req.done.wait(20) and req.result.status_code == 200
    assert metric(sim.url, "vllm:generation_tokens_total") == 2
    assert metric(sim.url, "vllm:prompt_tokens_total") == 8000


def test_v0_idle_count_grows_sum_unchanged(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(engine="v0", time_scale=100)  # the 10 s idle stats log every 0.1 s
    wait_until(lambda: metric(sim.url, "vllm:iteration_tokens_total_count") >= 3, what="idle observations")
    assert metric(sim.url, "vllm:iteration_tokens_total_sum") == 0
    assert metric(sim.url, "vllm:generation_tokens_total") == 0
    text = requests.get(sim.url + "/metrics", timeout=5).text
    assert 'engine="' not in text and "_created" not in text and "vllm:num_requests_swapped" in text
    assert requests.get(sim.url + "/version", timeout=5).json()["version"].startswith("0.6")


def test_stall_freezes_engine_but_health_and_metrics_answer(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(step_seconds=0.02)
    req = completion(sim.url, 5000)
    wait_until(lambda: metric(sim.url, "vllm:generation_tokens_total") > 3, what="generation")
    assert fault(sim.url, {"fault": "stall"}).json()["fault"] == "stall"
    before = vllm_lines(sim.url)
    t0 = sim.process.engine_time()
    wait_until(lambda: sim.process.engine_time() > t0 + 20 * 0.02, what="20 step times to pass")
    assert vllm_lines(sim.url) == before
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200
    st = stats(sim)
    assert st["fault"] == "stall" and st["running"] == 1 and not req.done.is_set()
    assert metric(sim.url, "vllm:num_requests_running") == 1
    gen = metric(sim.url, "vllm:generation_tokens_total")
    fault(sim.control_url, {"fault": "none"})
    wait_until(lambda: metric(sim.url, "vllm:generation_tokens_total") > gen, what="progress after stall")


def test_stall_with_seconds_clears_itself(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10)
    assert fault(sim.control_url, {"fault": "stall", "seconds": 2}).status_code == 200
    assert stats(sim)["fault"] == "stall"
    wait_until(lambda: stats(sim)["fault"] == "none", what="stall to expire")


def test_restart_fails_in_flight_and_resets_process(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(step_seconds=0.02, restart_seconds=1, time_scale=2)
    start = metric(sim.url, "process_start_time_seconds")
    created = metric(sim.url, "vllm:generation_tokens_created")
    req = completion(sim.url, 5000)
    with requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5000, "stream": True},
                       stream=True, timeout=30) as streaming:
        wait_until(lambda: metric(sim.url, "vllm:generation_tokens_total") > 5, what="generation")
        assert fault(sim.url, {"fault": "restart"}).status_code == 200
        assert req.done.wait(10)
        assert req.result.status_code == 500
        events = [ln for ln in streaming.iter_lines(decode_unicode=True) if ln]
    assert '"error"' in events[-2] and events[-1] == "data: [DONE]"
    wait_until(lambda: metric(sim.url, "process_start_time_seconds") != start, timeout=10, what="new process")
    assert metric(sim.url, "process_start_time_seconds") > start
    assert metric(sim.url, "vllm:generation_tokens_created") > created
    assert metric(sim.url, "vllm:generation_tokens_total") == 0
    assert metric(sim.url, "vllm:request_success_total", finished_reason="length") == 0
    st = stats(sim)
    assert st["restarts"] == 1 and st["fault"] == "none" and st["running"] == 0 and st["waiting"] == 0
    assert st["requests"]["POST /v1/completions"] == 2  # stats survive the restart


def test_crash_refuses_connections_until_restart_via_control(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10)
    start = metric(sim.url, "process_start_time_seconds")
    assert fault(sim.url, {"fault": "crash"}).status_code == 200

    def refused() -> bool:
        try:
            requests.get(sim.url + "/health", timeout=1)
        except requests.ConnectionError:
            return True
        return False

    wait_until(refused, what="main port closed")
    assert stats(sim)["fault"] == "crash"
    r = fault(sim.control_url, {"fault": "stall"})
    assert r.status_code == 409 and stats(sim)["fault"] == "crash"
    assert fault(sim.control_url, {"fault": "restart"}).status_code == 200
    wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="main port back")
    assert metric(sim.url, "process_start_time_seconds") > start
    assert stats(sim)["restarts"] == 1


def test_hang_accepts_but_never_answers(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10)
    assert fault(sim.url, {"fault": "hang"}).status_code == 200
    with pytest.raises(requests.ReadTimeout):
        requests.get(sim.url + "/health", timeout=0.5)
    waiting = Background(lambda: requests.get(sim.url + "/v1/models", timeout=30))
    wait_until(lambda: stats(sim)["requests"].get("GET /v1/models") == 1, what="request arrived")
    assert not waiting.done.is_set() and stats(sim)["fault"] == "hang"
    assert fault(sim.control_url, {"fault": "none"}).status_code == 200
    assert waiting.done.wait(10) and waiting.result.status_code == 200
    # hang again, then a restart through the control port brings a new process
    start = metric(sim.url, "process_start_time_seconds")
    fault(sim.control_url, {"fault": "hang"})
    assert fault(sim.control_url, {"fault": "restart"}).status_code == 200
    wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="main port back")
    assert metric(sim.url, "process_start_time_seconds") > start


def test_slow_metrics_and_no_metrics(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim()
    assert fault(sim.url, {"fault": "slow_metrics", "seconds": 5}).status_code == 200
    with pytest.raises(requests.ReadTimeout):
        requests.get(sim.url + "/metrics", timeout=0.5)
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200
    fault(sim.url, {"fault": "none"})
    assert requests.get(sim.url + "/metrics", timeout=5).status_code == 200
    bare = make_sim(no_metrics=True)
    assert requests.get(bare.url + "/metrics", timeout=5).status_code == 404
    assert requests.get(bare.url + "/health", timeout=5).status_code == 200


def test_engines_spread_round_robin(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(engines=2, time_scale=10, multiprocess=True)
    for _ in range(4):
        requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
    assert metric(sim.url, "vllm:generation_tokens_total", engine="0") == 4
    assert metric(sim.url, "vllm:generation_tokens_total", engine="1") == 4
    text = requests.get(sim.url + "/metrics", timeout=5).text
    assert "process_start_time_seconds" not in text and "_created" not in text


def test_prompt_tokens_override_and_token_id_prompts(make_sim: Callable[..., Simulator]) -> None:
    fixed = make_sim(prompt_tokens=300, time_scale=10)
    r = requests.post(fixed.url + "/v1/completions", json={"prompt": "short", "max_tokens": 1}, timeout=10)
    assert r.json()["usage"]["prompt_tokens"] == 300
    assert metric(fixed.url, "vllm:prompt_tokens_total") == 300
    free = make_sim(time_scale=10)
    r = requests.post(free.url + "/v1/completions", json={"prompt": [5] * 77, "max_tokens": 1}, timeout=10)
    assert r.json()["usage"]["prompt_tokens"] == 77


def test_error_fails_generation_with_openai_500_while_engine_is_fine(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10)
    assert fault(sim.url, {"fault": "error"}).json()["fault"] == "error"
    before = metric(sim.url, "vllm:request_success_total", finished_reason="length")
    for path, body in (
        ("/v1/completions", {"model": "sim-model", "prompt": "x", "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 3, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True}),
    ):
        for headers in (None, PROBE):
            r = requests.post(sim.url + path, json=body, headers=headers, timeout=10)
            err = r.json()
            assert r.status_code == 500, (path, body, r.text)
            assert err["object"] == "error" and err["type"] == "InternalServerError" and err["code"] == 500
            assert err["message"]
    # the engine itself is fine: health, models and metrics answer, no request reached the engine
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200
    assert requests.get(sim.url + "/v1/models", timeout=5).json()["data"][0]["id"] == "sim-model"
    assert metric(sim.url, "vllm:request_success_total", finished_reason="length") == before
    st = stats(sim)
    assert st["fault"] == "error" and st["running"] == 0 and st["waiting"] == 0
    assert st["requests"]["POST /v1/completions"] == 4 and st["by_kind"]["probe"] == 4
    # none clears it
    assert fault(sim.control_url, {"fault": "none"}).json() == {"fault": "none", "previous": "error", "restarts": 0}
    r = requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
    # a restart clears it too (a new process)
    fault(sim.control_url, {"fault": "error"})
    assert fault(sim.control_url, {"fault": "restart"}).status_code == 200
    wait_until(lambda: stats(sim)["restarts"] == 1 and stats(sim)["port_open"], what="restarted")
    wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="main port back")
    assert stats(sim)["fault"] == "none"
    r = requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
    assert r.status_code == 200
    # error with seconds clears itself
    fault(sim.control_url, {"fault": "error", "seconds": 2})
    assert requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10).status_code == 500
    wait_until(lambda: stats(sim)["fault"] == "none", what="error to expire")


# --- restart into a changed engine (a rollout's canary: a new command, maybe slower) ----------------


def back_up(sim: Simulator, restarts: int) -> None:
    wait_until(lambda: stats(sim)["restarts"] == restarts and stats(sim)["port_open"], what=f"restart {restarts}")
    wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="main port back")


def latency_sums(sim: Simulator, max_tokens: int) -> tuple[float, float]:
    """One completion on an idle engine of a fresh process: (TTFT sum, e2e sum) of the process's histograms.
    The engine clock is injected, so these are step counts times step_seconds whatever the machine's load:
    the first token one step after arrival, one more token each step."""
    r = requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": max_tokens}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == max_tokens
    assert metric(sim.url, "vllm:time_to_first_token_seconds_count") == 1
    assert metric(sim.url, "vllm:e2e_request_latency_seconds_count") == 1
    return (metric(sim.url, "vllm:time_to_first_token_seconds_sum"),
            metric(sim.url, "vllm:e2e_request_latency_seconds_sum"))


def test_restart_with_step_seconds_and_version_is_a_slower_new_version(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(step_seconds=0.01, time_scale=10, restart_seconds=0)
    st = stats(sim)
    assert st["step_seconds"] == 0.01 and st["version"] == "0.11.2"
    # a plain restart: the same engine
    assert fault(sim.control_url, {"fault": "restart", "seconds": 0}).status_code == 200
    back_up(sim, 1)
    assert latency_sums(sim, 20) == (pytest.approx(0.01), pytest.approx(20 * 0.01))
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "0.11.2"}
    # the canary: a new command, five times slower a step
    r = fault(sim.control_url, {"fault": "restart", "seconds": 0.3, "step_seconds": 0.05, "version": "0.8.5-canary"})
    assert r.status_code == 200 and r.json()["fault"] == "restart"
    back_up(sim, 2)
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "0.8.5-canary"}
    st = stats(sim)
    assert st["step_seconds"] == 0.05 and st["version"] == "0.8.5-canary"
    ttft, e2e = latency_sums(sim, 20)
    assert ttft == pytest.approx(0.05) and e2e == pytest.approx(20 * 0.05)
    # the regression is in the buckets too: TTFT above 0.04 s, e2e above 0.3 s (the old run had both below)
    assert metric(sim.url, "vllm:time_to_first_token_seconds_bucket", le="0.04") == 0
    assert metric(sim.url, "vllm:e2e_request_latency_seconds_bucket", le="0.3") == 0
    # a later plain restart keeps the deployed command
    assert fault(sim.control_url, {"fault": "restart"}).status_code == 200
    back_up(sim, 3)
    assert latency_sums(sim, 20) == (pytest.approx(0.05), pytest.approx(20 * 0.05))
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "0.8.5-canary"}
    st = stats(sim)
    assert st["step_seconds"] == 0.05 and st["version"] == "0.8.5-canary" and st["restarts"] == 3
    # rolling back sets them again; the stats of the simulator survived every restart
    assert fault(sim.control_url, {"fault": "restart", "step_seconds": 0.01, "version": "0.11.2"}).status_code == 200
    back_up(sim, 4)
    assert latency_sums(sim, 20) == (pytest.approx(0.01), pytest.approx(20 * 0.01))
    st = stats(sim)
    assert st["step_seconds"] == 0.01 and st["version"] == "0.11.2"
    assert st["requests"]["POST /v1/completions"] == 4 and st["by_kind"]["generation"] == 4
    assert sim.cfg.time_scale == 10 and sim.cfg.restart_seconds == 0  # the rest of the command is unchanged


def test_restart_settings_refused_with_400_change_nothing(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(step_seconds=0.02, time_scale=10)
    bad = [
        {"fault": "restart", "step_seconds": 0},
        {"fault": "restart", "step_seconds": -0.05},
        {"fault": "restart", "step_seconds": "0.05"},
        {"fault": "restart", "step_seconds": True},
        {"fault": "restart", "step_seconds": [0.05]},
        {"fault": "restart", "version": ""},
        {"fault": "restart", "version": "x" * 65},
        {"fault": "restart", "version": 85},
        {"fault": "restart", "version": "0.8.5\nX-Injected: 1"},
        {"fault": "restart", "version": "0.8.5\x00"},
        {"fault": "restart", "step_seconds": 0.05, "version": "x" * 65},  # one bad value: nothing applies
        {"fault": "stall", "step_seconds": 0.05},                          # only a restart changes the command
        {"fault": "crash", "version": "x"},
        {"fault": "restart", "step": 0.05},
    ]
    raw = ['{"fault": "restart", "step_seconds": NaN}', '{"fault": "restart", "step_seconds": Infinity}',
           '{"fault": "restart", "step_seconds": 1e999}']
    for base in (sim.url, sim.control_url):
        for body in [*bad, *raw]:
            r = fault(base, body)
            assert r.status_code == 400, (body, r.text)
            assert isinstance(r.json()["error"], str) and r.json()["error"]
    assert "step_seconds must be a positive finite number" in fault(sim.url, bad[0]).json()["error"]
    assert "1 to 64 characters" in fault(sim.url, bad[6]).json()["error"]
    assert "only apply to the restart fault" in fault(sim.url, bad[11]).json()["error"]
    st = stats(sim)
    assert st["restarts"] == 0 and st["fault"] == "none" and st["port_open"]
    assert st["step_seconds"] == 0.02 and st["version"] == "0.11.2"
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "0.11.2"}
    # the Python API refuses the same way
    with pytest.raises(BadRequest):
        sim.set_fault("restart", step_seconds=float("nan"))
    with pytest.raises(BadRequest):
        sim.set_fault("hang", version="x")
    assert stats(sim)["fault"] == "none" and sim.cfg.step_seconds == 0.02 and sim.cfg.version is None
    # a 64-character printable version is fine
    assert fault(sim.control_url, {"fault": "restart", "seconds": 0, "version": "v" * 64}).status_code == 200
    back_up(sim, 1)
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "v" * 64}


def test_restart_settings_sent_during_a_restart_apply_to_the_process_it_starts(
    make_sim: Callable[..., Simulator],
) -> None:
    sim = make_sim(engine="sglang", time_scale=1)
    sim.set_fault("restart", 3.0)  # down for 3 s
    answer = sim.set_fault("restart", step_seconds=0.2, version="0.5.4-canary")
    assert answer["previous"] == "restart"  # already restarting: taken for the coming process
    back_up(sim, 1)
    assert requests.get(sim.url + "/version", timeout=5).json() == {"version": "0.5.4-canary"}
    assert stats(sim)["step_seconds"] == 0.2 and all(e.step_seconds == 0.2 for e in sim.process.engines)


# --- vLLM's http_requests_total (prometheus-fastapi-instrumentator, vLLM >= 0.8) -----------------------


def http_counts(url: str) -> dict[tuple[str, str, str], float]:
    text = requests.get(url + "/metrics", timeout=5).text
    assert "# HELP http_requests_total Total number of requests by method, status and handler.\n" in text
    assert "# TYPE http_requests_total counter\n" in text
    return {(s.labels["handler"], s.labels["method"], s.labels["status"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == "http_requests_total"}


def test_http_requests_total_counts_answers_by_handler_and_grouped_status(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10)
    assert http_counts(sim.url) == {}  # /health and /metrics so far: excluded handlers
    for _ in range(3):
        assert requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10).ok
    with requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True},
                       stream=True, timeout=10) as r:
        assert r.status_code == 200 and list(r.iter_lines())
    assert requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=PROBE,
                         timeout=10).ok  # our probe is a completion like any other to vLLM
    assert requests.post(sim.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, timeout=10).ok
    assert requests.get(sim.url + "/v1/models", timeout=5).ok
    for path in ("/health", "/ping", "/version", "/metrics", "/sim/stats"):  # excluded (and the simulator's own)
        assert requests.get(sim.url + path, timeout=5).ok
    assert requests.post(sim.url + "/v1/completions", data="{not json", timeout=5).status_code == 400
    assert requests.post(sim.url + "/v1/completions", json={"model": "other", "prompt": "x"}, timeout=5).status_code == 404
    assert requests.get(sim.url + "/v1/completions", timeout=5).status_code == 405
    assert requests.get(sim.url + "/nope", timeout=5).status_code == 404  # no route: handler "none"
    assert fault(sim.control_url, {"fault": "error"}).ok
    for _ in range(2):
        assert requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                             timeout=10).status_code == 500
    assert requests.post(sim.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, timeout=10).status_code == 500
    assert http_counts(sim.url) == {
        ("/v1/completions", "POST", "2xx"): 5,
        ("/v1/chat/completions", "POST", "2xx"): 1,
        ("/v1/models", "GET", "2xx"): 1,
        ("/v1/completions", "POST", "4xx"): 2,
        ("/v1/completions", "GET", "4xx"): 1,
        ("none", "GET", "4xx"): 1,
        ("/v1/completions", "POST", "5xx"): 2,
        ("/v1/chat/completions", "POST", "5xx"): 1,
    }
    assert metric(sim.url, "http_requests_created", handler="/v1/completions", method="POST", status="5xx") > 0
    # a new process (a restart also clears the error fault): the counter starts again from nothing; the 500
    # of a completion the restart failed was the old process's answer
    assert fault(sim.control_url, {"fault": "none"}).ok
    in_flight = completion(sim.url, 5000)
    wait_until(lambda: stats(sim)["running"] == 1, what="a long completion running")
    assert fault(sim.control_url, {"fault": "restart", "seconds": 0}).ok
    assert in_flight.done.wait(10) and in_flight.result.status_code == 500
    wait_until(lambda: stats(sim)["restarts"] == 1 and stats(sim)["port_open"], what="restarted")
    wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="main port back")
    assert http_counts(sim.url) == {}
    assert requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10).ok
    assert http_counts(sim.url) == {("/v1/completions", "POST", "2xx"): 1}
    assert stats(sim)["requests"]["POST /v1/completions"] == 11  # the simulator's own stats survive


@pytest.mark.parametrize("engine", ["v0", "sglang", "llamacpp"])
def test_http_requests_total_is_on_the_vllm_v1_page_only(make_sim: Callable[..., Simulator], engine: str) -> None:
    sim = make_sim(engine=engine, time_scale=10)
    assert requests.get(sim.url + "/v1/models", timeout=5).ok
    text = requests.get(sim.url + "/metrics", timeout=5).text
    assert not [ln for ln in text.splitlines() if ln.startswith(("http_requests", "# HELP http_requests"))]


def test_http_requests_total_multiprocess_has_no_created(make_sim: Callable[..., Simulator]) -> None:
    sim = make_sim(time_scale=10, multiprocess=True)
    assert requests.get(sim.url + "/v1/models", timeout=5).ok
    assert http_counts(sim.url) == {("/v1/models", "GET", "2xx"): 1}
    assert "http_requests_created" not in requests.get(sim.url + "/metrics", timeout=5).text


def test_the_control_port_is_bound_before_the_main_port_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whoever waits for the main port (tests/process/test_simulator.py's fixture, a drill) uses the control
    port at once: it must already take connections. Before, it was bound after the main port served, and a
    clean-clone run met 'connection refused' on /sim/stats."""
    seen: list[bool] = []
    real = Simulator._open_main

    def open_main(self: Simulator) -> None:
        seen.append(self.control is not None)
        real(self)

    monkeypatch.setattr(Simulator, "_open_main", open_main)
    sim = Simulator(SimConfig(port=free_port(), control_port=free_port())).start()
    try:
        assert seen[0] is True
        assert sim.control_url is not None and requests.get(sim.control_url + "/sim/stats", timeout=5).ok
    finally:
        sim.stop()
