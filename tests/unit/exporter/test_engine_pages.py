"""The exporter's reading and verdict on SGLang and llama.cpp pages, produced by the simulator's engine
flavours (which follow the real pages: tests/unit/simulator/test_flavours.py) and by the real captures."""

from __future__ import annotations

import re
import threading

import requests

from llm_health.drill.procs import free_port, wait_until
from llm_health.exporter.backend import Target
from llm_health.exporter.backend import observe as observe_http
from llm_health.exporter.check import verify
from llm_health.exporter.observation import Observation, ReadResult, VerifyOutcome
from llm_health.exporter.reading import read_text
from llm_health.exporter.verdict import BackendState, Thresholds, Verdict, judge
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import Flavour, render
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.paths import PAGES

FIXTURES = PAGES
T = Thresholds(stall_after=30.0, down_after=2)
STEP = 5.0


def observe(text: str, header: str | None = None) -> Observation:
    return Observation(outcome=ReadResult.OK, reading=read_text(text, header))


class Run:
    """Engines driven by engine time, read every STEP seconds, judged like the exporter does."""

    def __init__(self, flavour: str, engines: int = 1, tp_size: int = 1, **kw: object) -> None:
        self.engines = [Engine(flavour=flavour, index=i, step_seconds=0.05, **kw) for i in range(engines)]
        self.flavour = Flavour(engine=flavour, tp_size=tp_size)
        self.now = 0.0
        self.state: BackendState | None = None
        self.frozen: set[int] = set()
        self.header = "1000"
        self.edit = lambda text: text

    def read(self, seconds: float = STEP) -> BackendState:
        self.now += seconds
        for e in self.engines:
            if e.index in self.frozen:
                e.freeze_until(self.now)
            else:
                e.advance_to(self.now)
        text = self.edit(render(self.engines, self.flavour))
        self.state = judge(self.state, observe(text, self.header if self.flavour.engine == "llamacpp" else None),
                           self.now, T)
        return self.state


# --- llama.cpp --------------------------------------------------------------------------------------


def test_llamacpp_busy_progress_comes_from_n_decode_and_the_reason_says_steps() -> None:
    run = Run("llamacpp", max_num_seqs=2)
    for e in run.engines:
        for _ in range(3):
            e.submit(20, 100_000 // 50)   # long requests: tokens_predicted stays flat all along
    states = [run.read() for _ in range(8)]
    assert [s.verdict for s in states[1:]] == [Verdict.BUSY] * 7
    last = states[-1]
    assert last.tokens_per_second == 0.0           # the completion-only token counter did not move
    assert last.steps_per_second > 10              # one llama_decode per step: 20 per second
    assert re.search(r"engine progressing \(\d+ decode steps/s\)", last.reason), last.reason
    assert "0 tokens/s" not in last.reason and last.in_flight == 3


def test_llamacpp_frozen_inside_decode_is_stalled_in_time_and_recovers() -> None:
    run = Run("llamacpp", max_num_seqs=2)
    run.engines[0].submit(20, 100_000 // 50)
    run.read()
    assert run.read().verdict == Verdict.BUSY
    run.frozen = {0}
    verdicts = [run.read().verdict for _ in range(8)]
    # stalled once 30 s passed without progress (6 readings), never before
    assert verdicts[:5] == [Verdict.UNKNOWN] * 5 and verdicts[6:] == [Verdict.STALLED] * 2
    run.frozen = set()
    state = run.read()
    assert state.verdict == Verdict.BUSY   # counters carry on: never judged restarted


def test_llamacpp_restart_from_counters_going_backwards_or_the_header() -> None:
    run = Run("llamacpp")
    run.engines[0].submit(20, 30)
    run.read()
    run.read()
    run.engines = [Engine(flavour="llamacpp", step_seconds=0.05, start=run.now)]   # a new process: all zero
    state = run.read()
    assert state.verdict == Verdict.RESTARTED and "went backwards" in state.reason
    # the same page twice, but another process answered (header changed): restarted too
    page = render(run.engines[0], "llamacpp")
    state = judge(None, observe(page, "1000"), 0.0, T)
    state = judge(state, observe(page, "2000"), 5.0, T)
    assert state.verdict == Verdict.RESTARTED and "Process-Start-Time-Unix" in state.reason


def test_llamacpp_kv_series_is_optional() -> None:
    page = render(Engine(flavour="llamacpp"), "llamacpp")
    assert "kv_cache" not in page
    r = read_text(page)
    assert r.has_engine_metrics and r.engines["0"].kv_usage is None
    older = page + "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.4\n"
    assert read_text(older).engines["0"].kv_usage == 0.4


def test_llamacpp_real_capture_reads_its_counters() -> None:
    capture = (FIXTURES / "llamacpp-ik_llama-pr695.txt").read_text()
    # the excerpt has no gauges; with llama-server's in-flight gauges appended it is a full reading
    r = read_text(capture + "llamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n")
    assert r.flavour == "llamacpp" and r.work == 3
    assert r.engines["0"].counters == {"generation_tokens": 3469.0, "prompt_tokens": 6886.0}
    assert r.steps() is None and r.rate_unit == "decode steps/s"


# --- SGLang ---------------------------------------------------------------------------------------


def test_sglang_reads_rank_zero_of_every_tp_group_and_keys_engines_by_dp_rank() -> None:
    run = Run("sglang", engines=2, tp_size=2)
    for e in run.engines:
        e.submit(20, 1000)
        e.submit(20, 1000)
    run.read()
    r = read_text(render(run.engines, run.flavour))
    assert set(r.engines) == {"0", "1"}
    assert r.running == 4                       # tp_rank 1 repeats tp_rank 0: not counted twice
    assert r.server["generation_tokens"] == sum(e.stats.generation_tokens for e in run.engines)
    assert all(not e.shared and "forward_passes" in e.counters for e in r.engines.values())
    assert r.generation_tokens() == r.server["generation_tokens"]


def test_sglang_one_wedged_dp_rank_is_stalled_while_the_other_serves() -> None:
    run = Run("sglang", engines=2, tp_size=2)
    for e in run.engines:
        e.submit(20, 100_000 // 50)
    run.read()
    assert run.read().verdict == Verdict.BUSY
    run.frozen = {1}
    verdicts = [run.read() for _ in range(8)]
    assert verdicts[-1].verdict == Verdict.STALLED and verdicts[-1].reason.startswith("engine 1:")
    assert Verdict.STALLED not in [s.verdict for s in verdicts[:5]]


def test_sglang_without_per_rank_counters_uses_the_server_counters_and_never_false_stalls() -> None:
    run = Run("sglang", engines=2)
    # a page without per-rank counters (SGLang 0.4.x): no forward passes, no realtime tokens
    run.edit = lambda text: "\n".join(ln for ln in text.splitlines()
                                      if "cuda_graph_passes" not in ln and "realtime_tokens" not in ln) + "\n"
    for e in run.engines:
        e.submit(20, 100_000 // 50)
    states = [run.read() for _ in range(10)]
    assert [s.verdict for s in states[1:]] == [Verdict.BUSY] * 9
    r = read_text(run.edit(render(run.engines, run.flavour)))
    assert all(e.shared for e in r.engines.values())
    assert "tokens/s" in states[-1].reason and states[-1].tokens_per_second > 0


def test_sglang_restart_shows_as_counters_going_backwards() -> None:
    run = Run("sglang")
    run.engines[0].submit(20, 30)
    run.read()
    run.read()
    run.engines = [Engine(flavour="sglang", step_seconds=0.05, start=run.now)]
    run.engines[0].submit(5, 2)
    state = run.read()
    assert state.verdict == Verdict.RESTARTED and "went backwards" in state.reason


def test_sglang_idle_is_idle_and_stale_gauges_catch_up() -> None:
    run = Run("sglang", decode_log_interval=40)
    run.engines[0].submit(20, 10)
    states = [run.read() for _ in range(4)]
    assert states[-1].verdict == Verdict.IDLE and states[-1].in_flight == 0


# --- over HTTP, against the simulator flavours -------------------------------------------------------


def test_llamacpp_over_http_header_identity_and_verify_reports_decode_steps() -> None:
    with Simulator(SimConfig(engine="llamacpp", port=free_port(), step_seconds=0.02, max_num_seqs=2)) as sim:
        target = Target(sim.url, timeout=5)
        first = observe_http(target)
        assert first.outcome == ReadResult.OK and first.reading is not None and first.reading.start_header is not None
        for _ in range(2):
            requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
        jobs = [threading.Thread(target=requests.post, args=(sim.url + "/v1/completions",),
                                               kwargs={"json": {"prompt": "x", "max_tokens": 5000}, "timeout": 60},
                                               daemon=True) for _ in range(2)]
        for j in jobs:
            j.start()
        wait_until(lambda: "llamacpp:requests_processing 2" in requests.get(sim.url + "/metrics", timeout=5).text,
                   what="both slots busy")
        v = verify(sim.url, readings=2, interval=0.3, read_timeout=5)
        assert v.outcome == VerifyOutcome.PROGRESS and "decode steps/s" in v.reason and "tokens/s" not in v.reason, v.reason
        state = judge(None, observe_http(target), 0.0, T)
        sim.set_fault("restart", 0.0)
        wait_until(lambda: requests.get(sim.url + "/health", timeout=2).ok, what="back after restart")
        state = judge(state, observe_http(target), 5.0, T)
        assert state.verdict == Verdict.RESTARTED, state.reason
