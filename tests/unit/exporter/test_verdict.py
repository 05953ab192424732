"""The pure verdict: previous state + observation + clock -> new state (no HTTP, injected time)."""

from __future__ import annotations

import pytest

from llm_health.config import ExporterSettings
from llm_health.exporter.observation import Observation, ProbeResult, ReadResult
from llm_health.exporter.reading import EngineReading, Reading, read_text
from llm_health.exporter.verdict import CODES, BackendState, Thresholds, Verdict, judge
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import Flavour, render
from tests.support.fakevllm import vllm_page

T = Thresholds(stall_after=120.0, down_after=2)


def reading(
    running: float = 0,
    waiting: float = 0,
    gen: float = 100,
    kv: float | None = 0.1,
    start: float | None = 1000.0,
    created: dict[str, float] | None = None,
    engines: dict[str, EngineReading] | None = None,
    **counters: float,
) -> Reading:
    if engines is None:
        engines = {"0": EngineReading(running, waiting, kv, {"generation_tokens": gen, **counters})}
    return Reading(flavour="v1", engines=engines, process_start=start, created=created or {})


def ok(r: Reading, probe: ProbeResult | None = None) -> Observation:
    return Observation(outcome=ReadResult.OK, reading=r, probe=probe)


def run(steps: list[tuple[float, Observation]], settings: Thresholds = T) -> list[BackendState]:
    state: BackendState | None = None
    out = []
    for now, obs in steps:
        state = judge(state, obs, now, settings)
        out.append(state)
    return out


def test_codes_are_the_shared_contract() -> None:
    assert {v.value: c for v, c in CODES.items()} == {
        "unknown": 0, "idle": 1, "busy": 2, "restarted": 3, "no_metrics": 4, "stalled": 5, "down": 6,
        "sleeping": 7}
    assert Verdict.BUSY == "busy" and Verdict.STALLED.code == 5


def test_first_reading_with_work_is_unknown_without_work_idle() -> None:
    assert run([(0, ok(reading(running=2)))])[-1].verdict == Verdict.UNKNOWN
    assert run([(0, ok(reading()))])[-1].verdict == Verdict.IDLE


def test_busy_when_work_and_progress() -> None:
    states = run([(0, ok(reading(running=2, gen=100))), (15, ok(reading(running=2, gen=400)))])
    s = states[-1]
    assert s.verdict == Verdict.BUSY
    assert s.tokens_per_second == pytest.approx(20.0)
    assert s.in_flight == 2
    assert s.last_progress == 15
    assert "2 running, 0 waiting" in s.reason


@pytest.mark.parametrize("counter", ["iteration_tokens_sum", "iteration_count", "prompt_tokens",
                                     "finished_requests", "preemptions", "prefix_cache_queries"])
def test_any_progress_counter_is_progress(counter: str) -> None:
    a = reading(running=1, **{counter: 5.0})
    b = reading(running=1, **{counter: 6.0})
    assert run([(0, ok(a)), (15, ok(b))])[-1].verdict == Verdict.BUSY


def test_kv_gauge_change_is_progress_during_a_long_prefill() -> None:
    steps = [(t, ok(reading(running=1, kv=0.01 * (i + 1)))) for i, t in enumerate(range(0, 600, 15))]
    assert all(s.verdict == Verdict.BUSY for s in run(steps)[1:])


def test_stalled_needs_two_frozen_readings_and_stall_after() -> None:
    frozen = reading(running=2, waiting=0, gen=100)
    states = run([(t, ok(frozen)) for t in (0, 15, 30, 60, 90, 119, 121)])
    assert [s.verdict for s in states] == [Verdict.UNKNOWN] * 6 + [Verdict.STALLED]
    assert states[-1].reason == "2 running, 0 waiting, no engine progress for 121 s (bound: stall_after 120 s)"
    assert "stalled after 120 s" in states[3].reason


def test_never_stalled_on_one_comparison_even_with_zero_grace() -> None:
    settings = Thresholds(stall_after=0.0, down_after=2)
    frozen = reading(running=1)
    states = run([(0, ok(frozen)), (1, ok(frozen)), (2, ok(frozen))], settings)
    assert [s.verdict for s in states] == [Verdict.UNKNOWN, Verdict.UNKNOWN, Verdict.STALLED]


def test_progress_resets_the_stall_clock() -> None:
    # a pause that ends in progress (counters last seen moving at 0, moved by 55): the clock starts again at
    # 55, and the bound is 2 x 55 s from now on
    steps = [(0, ok(reading(running=1, gen=1))), (50, ok(reading(running=1, gen=1))),
             (55, ok(reading(running=1, gen=2))), (145, ok(reading(running=1, gen=2))),
             (164, ok(reading(running=1, gen=2)))]
    states = run(steps)
    assert states[2].verdict == Verdict.BUSY
    assert states[-1].verdict == Verdict.UNKNOWN  # frozen since 55: 109 s < 110 s
    assert run(steps + [(166, ok(reading(running=1, gen=2)))])[-1].verdict == Verdict.STALLED


def test_a_long_pause_that_ended_in_progress_raises_the_bound_for_this_process() -> None:
    """The engine showed that it can sit 110 s on one step with work and go on: the next pause is judged
    against twice that, not stall_after (principle 4); a restart forgets it."""
    steps = [(0, ok(reading(running=1, gen=1))), (100, ok(reading(running=1, gen=1))),
             (110, ok(reading(running=1, gen=2))), (200, ok(reading(running=1, gen=2))),
             (231, ok(reading(running=1, gen=2)))]
    states = run(steps)
    assert states[2].longest_quiet == 110
    assert states[-1].verdict == Verdict.UNKNOWN and "stalled after 220 s" in states[-1].reason
    assert "the longest pause seen end in progress (110 s)" in states[-1].reason
    later = run(steps + [(331, ok(reading(running=1, gen=2)))])[-1]
    assert later.verdict == Verdict.STALLED and "bound: 2 x the longest pause" in later.reason


def test_a_slow_answer_starts_the_frozen_clock_when_it_came_not_when_it_was_asked_for() -> None:
    """The CI case (tests/real/test_vllm.py, readings 1 s apart, stall_after 6 s): a page asked for at 1 s
    came at 3 s with new counters, and the engine stopped right after. Its counters may be those of 3 s:
    frozen since then (stalled at 9 s), not since 1 s (7 s: 2 s before a stall of 6 s was proven)."""
    settings = Thresholds(stall_after=6.0, down_after=2)

    def late(r: Reading, at: float) -> Observation:
        return Observation(outcome=ReadResult.OK, reading=r, answered=at)

    frozen = reading(running=1, gen=2)
    steps = [(0, ok(reading(running=1, gen=1))), (1, late(frozen, 3.0))] + [(t, ok(frozen)) for t in range(4, 12)]
    states = run(steps, settings)
    assert states[1].last_progress == 3 and states[1].last_seen == 3 and states[1].last_at == 1
    stalled = next(t for (t, _), s in zip(steps, states, strict=True) if s.verdict == Verdict.STALLED)
    assert stalled == 9, [s.reason for s in states]
    # a prompt answer (no `answered`, or one not later than the judged time) counts at the judged time
    prompt = run([(0, ok(reading(running=1, gen=1))), (10, late(frozen, 5.0))])[-1]
    assert prompt.last_progress == 10 and prompt.last_seen == 10


def test_work_arriving_on_an_idle_backend_starts_the_clock_then() -> None:
    states = run([(0, ok(reading())), (1000, ok(reading(running=1))), (1015, ok(reading(running=1))),
                  (1030, ok(reading(running=1)))])
    assert states[-1].verdict == Verdict.UNKNOWN
    assert "for 30 s" in states[-1].reason


def test_worst_engine_decides() -> None:
    def two(gen0: float, gen1: float, run1: float) -> Reading:
        return reading(engines={
            "0": EngineReading(2, 0, None, {"generation_tokens": gen0}),
            "1": EngineReading(run1, 0, None, {"generation_tokens": gen1}),
        })
    states = run([(0, ok(two(1, 1, 3))), (60, ok(two(50, 1, 3))), (130, ok(two(90, 1, 3)))])
    assert states[1].verdict == Verdict.BUSY
    assert states[-1].verdict == Verdict.STALLED
    assert states[-1].reason.startswith("engine 1: 3 running")
    # one busy engine and one idle engine: busy, never idle (so never probed)
    states = run([(0, ok(two(1, 1, 0))), (15, ok(two(9, 1, 0)))])
    assert states[-1].verdict == Verdict.BUSY


@pytest.mark.parametrize("before,after,why", [
    (reading(start=1000.0), reading(start=2000.0), "process start time changed"),
    (reading(start=None, created={"vllm:prompt_tokens_created{engine=0}": 5.0}),
     reading(start=None, created={"vllm:prompt_tokens_created{engine=0}": 9.0}), "vllm:prompt_tokens_created changed"),
    (reading(start=None, gen=500), reading(start=None, gen=20), "went backwards"),
])
def test_restarted(before: Reading, after: Reading, why: str) -> None:
    states = run([(0, ok(before)), (15, ok(after))])
    assert states[-1].verdict == Verdict.RESTARTED
    assert why in states[-1].reason


def test_counters_of_two_processes_are_never_compared() -> None:
    # the new process is busy and its counters happen to be equal: still "restarted", not stalled/busy
    a = reading(running=3, start=1.0, gen=100)
    b = reading(running=3, start=2.0, gen=100)
    states = run([(0, ok(a)), (200, ok(a)), (400, ok(a)), (415, ok(b))])
    assert states[2].verdict == Verdict.STALLED
    assert states[-1].verdict == Verdict.RESTARTED
    # and the stall clock starts over for the new process
    assert run([(0, ok(a)), (200, ok(a)), (400, ok(a)), (415, ok(b)), (430, ok(b))])[-1].verdict == Verdict.UNKNOWN


def test_down_after_two_refusals_and_back() -> None:
    refused = Observation(outcome=ReadResult.REFUSED, detail="connection refused")
    states = run([(0, ok(reading())), (15, refused), (30, refused), (45, refused), (60, ok(reading()))])
    assert [s.verdict for s in states] == [Verdict.IDLE, Verdict.UNKNOWN, Verdict.DOWN, Verdict.DOWN, Verdict.IDLE]
    assert states[2].since == 30 and states[3].since == 30


def test_metrics_timeout_while_busy_is_not_down() -> None:
    timeout = Observation(outcome=ReadResult.TIMEOUT, detail="no answer within 5 s")
    states = run([(0, ok(reading(running=5, gen=1))), (15, ok(reading(running=5, gen=9)))]
                 + [(t, timeout) for t in (30, 45, 60, 75, 90, 105, 120)])
    assert all(s.verdict == Verdict.UNKNOWN for s in states[2:])
    assert states[-1].in_flight == 5


@pytest.mark.parametrize("health", [True, None])
def test_a_slow_page_under_load_is_never_stalled_while_health_answers(health: bool | None) -> None:
    """Principle 3 on vLLM: its /metrics comes from the API server's event loop, slow under load."""
    slow = Observation(outcome=ReadResult.TIMEOUT, detail="no answer within 5 s", cheap_ok=health)
    states = run([(0, ok(reading(running=5, gen=1))), (15, ok(reading(running=5, gen=9)))]
                 + [(t, slow) for t in range(30, 1000, 15)])
    assert {s.verdict for s in states[2:]} == {Verdict.UNKNOWN}
    assert "no evidence of a stall" in states[-1].reason and "5 running" in states[-1].reason


def test_work_last_seen_and_nothing_answering_is_stalled_after_stall_after_of_silence() -> None:
    slow = Observation(outcome=ReadResult.TIMEOUT, cheap_ok=True)
    silent = Observation(outcome=ReadResult.TIMEOUT, cheap_ok=False)
    start = [(0.0, ok(reading(running=5, gen=1))), (15.0, ok(reading(running=5, gen=9)))]
    states = run(start + [(t, silent) for t in range(30, 200, 15)])
    first = next(i for i, s in enumerate(states) if s.verdict == Verdict.STALLED)
    assert (30 + 15 * (first - 2)) - 30 >= T.stall_after     # silent since the first timeout at 30 s
    assert {s.verdict for s in states[2:first]} == {Verdict.UNKNOWN}
    assert "nothing answered" in states[first].reason and "5 running" in states[first].reason
    # /health answering in between starts the silence over: one failed /health is never enough
    mixed = run(start + [(t, silent if (t // 15) % 4 else slow) for t in range(30, 600, 15)])
    assert Verdict.STALLED not in {s.verdict for s in mixed}
    assert {s.verdict for s in mixed[2:]} == {Verdict.UNKNOWN}


def test_metrics_timeout_while_idle_counts_toward_down() -> None:
    timeout = Observation(outcome=ReadResult.TIMEOUT)
    states = run([(0, ok(reading())), (15, timeout), (30, timeout)])
    assert [s.verdict for s in states] == [Verdict.IDLE, Verdict.UNKNOWN, Verdict.DOWN]


def test_no_metrics_judged_by_cheap_endpoints() -> None:
    page = Observation(outcome=ReadResult.NOT_FOUND, cheap_ok=True)
    assert run([(0, page)])[-1].verdict == Verdict.NO_METRICS
    empty = Observation(outcome=ReadResult.OK, reading=Reading("none", {}), cheap_ok=True)
    assert run([(0, empty)])[-1].verdict == Verdict.NO_METRICS
    dead = Observation(outcome=ReadResult.NOT_FOUND, cheap_ok=False)
    assert [s.verdict for s in run([(0, dead), (15, dead)])] == [Verdict.UNKNOWN, Verdict.DOWN]


def test_failed_probes_of_an_idle_backend() -> None:
    bad = ProbeResult("timeout", "no answer within 10 s")
    good = ProbeResult("ok", seconds=0.05)
    states = run([(0, ok(reading())), (15, ok(reading(), bad)), (30, ok(reading(), good)),
                  (45, ok(reading(), bad)), (60, ok(reading(), bad)), (75, ok(reading(), good))])
    assert [s.verdict for s in states] == [Verdict.IDLE, Verdict.IDLE, Verdict.IDLE, Verdict.IDLE,
                                           Verdict.DOWN, Verdict.IDLE]
    assert "probe timeout" in states[1].reason and "1 of 2" in states[1].reason
    assert "probe answered" in states[2].reason


def test_down_by_failed_probes_holds_between_probes() -> None:
    """With probes spaced wider than the interval (probe_every, or a probe_timeout longer than the
    interval), cycles without a probe result must not flip a down server back to idle: that flapping
    kept LLMBackendDown (`for:`) from ever firing for a server wedged behind frozen gauges. (Here the engine
    moves a little between the probes, e.g. its abort of the timed-out probe, so each probe counts once.)"""
    bad = ProbeResult("timeout", "no answer within 10 s")
    good = ProbeResult("ok", seconds=0.05)
    states = run([(0, ok(reading())), (15, ok(reading(), bad)), (30, ok(reading(gen=101))),
                  (45, ok(reading(gen=102), bad)), (60, ok(reading(gen=102))), (75, ok(reading(gen=102))),
                  (90, ok(reading(gen=103), good))])
    assert [s.verdict for s in states] == [Verdict.IDLE, Verdict.IDLE, Verdict.IDLE, Verdict.DOWN,
                                           Verdict.DOWN, Verdict.DOWN, Verdict.IDLE]
    assert states[5].since == 45, "down holds without restarting its clock"
    assert "down until a probe answers" in states[4].reason


def test_an_unanswered_probe_is_not_followed_by_another_while_the_engine_stands_still() -> None:
    """A probe that timed out may still sit in the engine's queue behind frozen gauges (a wedged vLLM
    takes no abort): no second probe joins it; the engine not moving since is the next failure. A healthy
    engine moves (it answers the probe late, or counts its abort): the probe counted once, probing resumes."""
    bad = ProbeResult("timeout", "no answer within 10 s")
    states = run([(0, ok(reading())), (15, ok(reading(), bad)), (30, ok(reading()))])
    assert states[1].probe_unanswered and states[2].verdict == Verdict.DOWN
    assert "still unanswered" in states[2].reason and "not probed again" in states[2].reason
    moved = run([(0, ok(reading())), (15, ok(reading(), bad)), (30, ok(reading(gen=101)))])
    assert moved[2].verdict == Verdict.IDLE and not moved[2].probe_unanswered and moved[2].probe_failures == 1
    refused = run([(0, ok(reading())), (15, ok(reading(), ProbeResult("error", "connection refused")))])
    assert not refused[1].probe_unanswered            # an answer of any kind: nothing left in its queue


def test_v0_idle_page_is_idle_not_busy() -> None:
    """V0 observes iteration_tokens 0 every 10 s while idle: _count grows, nothing else does."""
    engine = Engine(flavour="v0", idle_log_seconds=10.0)
    engine.submit(prompt_tokens=20, max_tokens=5)
    engine.advance_to(5.0)
    states = []
    state = None
    for t in (30.0, 45.0, 60.0, 75.0):
        engine.advance_to(t)
        page = render(engine, Flavour("v0", multiprocess=True))
        state = judge(state, ok(read_text(page)), t, T)
        states.append(state.verdict)
    assert engine.stats.iteration_tokens.count > engine.stats.steps  # the idle observations happened
    assert states == [Verdict.IDLE] * 4


def test_since_is_kept_while_the_verdict_holds() -> None:
    states = run([(0, ok(reading(running=1, gen=1))), (15, ok(reading(running=1, gen=2))),
                  (30, ok(reading(running=1, gen=3)))])
    assert states[1].since == 15 and states[2].since == 15


def test_restarted_and_idle_holds_until_a_probe_answers() -> None:
    states = run([(0, ok(reading(start=1.0))), (15, ok(reading(start=2.0))), (30, ok(reading(start=2.0))),
                  (45, ok(reading(start=2.0), ProbeResult("ok", seconds=0.1)))])
    assert [s.verdict for s in states] == [Verdict.IDLE, Verdict.RESTARTED, Verdict.RESTARTED, Verdict.IDLE]
    assert states[2].since == 15


def test_judge_accepts_the_exporter_settings() -> None:

    settings = ExporterSettings(stall_after=10.0, down_after=3)
    frozen = reading(running=1)
    states = run([(0, ok(frozen)), (5, ok(frozen)), (11, ok(frozen))], settings)  # type: ignore[arg-type]
    assert states[-1].verdict == Verdict.STALLED
    refused = Observation(outcome=ReadResult.REFUSED)
    assert [s.verdict for s in run([(0, refused), (1, refused), (2, refused)], settings)] == [  # type: ignore[arg-type]
        Verdict.UNKNOWN, Verdict.UNKNOWN, Verdict.DOWN]


def test_an_idle_page_is_not_believed_while_the_engine_steps() -> None:
    """SGLang's gauges lag (written at prefill batches and every 40 decode steps): a page saying 0 / 0 while
    its forward passes moved is not idle enough to probe; our own probe's few steps are allowed for."""
    from llm_health.exporter.verdict import PROBE_STEPS, idle_believable

    def page(passes: float) -> Reading:
        return Reading(flavour="sglang", engines={"0": EngineReading(counters={"forward_passes": passes})})

    t = Thresholds()
    state = judge(None, Observation("ok", page(100)), 0.0, t)
    assert idle_believable(state, Observation("ok", page(100)))            # first reading: nothing to compare
    moved = judge(state, Observation("ok", page(140)), 15.0, t)
    assert moved.steps_moved == 40 and not idle_believable(moved, Observation("ok", page(140)))
    still = judge(moved, Observation("ok", page(140)), 30.0, t)
    assert idle_believable(still, Observation("ok", page(140)))
    probed = Observation("ok", page(140 + PROBE_STEPS), probe=ProbeResult("ok"))
    after_probe = judge(still, probed, 45.0, t)
    assert idle_believable(after_probe, probed)                             # our own probe's steps


def test_no_probe_on_the_reading_that_shows_a_restarted_process() -> None:
    """A server that has just come back (another process answers) is when the clients' retries and the
    balancer's re-admission land, after its page was rendered: its first idle page is not probed; the next
    reading of the same process is (the replay's incident day had a probe meet 24 retries at that instant)."""
    from llm_health.exporter.verdict import idle_believable

    t = Thresholds()
    old = read_text(vllm_page({"0": {"running": 0, "waiting": 0, "gen": 100}}))
    new_page = vllm_page({"0": {"running": 0, "waiting": 0, "gen": 0}}).replace("1000.0", "2000.0")
    state = judge(judge(None, Observation("ok", old), 0.0, t), Observation("ok", old), 15.0, t)
    assert idle_believable(state, Observation("ok", old))
    first = Observation("ok", read_text(new_page))
    restarted = judge(state, first, 30.0, t)
    assert restarted.verdict is Verdict.RESTARTED
    assert not idle_believable(restarted, first)                          # the process's first page
    again = Observation("ok", read_text(new_page))
    later = judge(restarted, again, 45.0, t)
    assert later.verdict is Verdict.RESTARTED and idle_believable(later, again)   # its second: probed
    assert idle_believable(judge(None, first, 0.0, t), first)             # the exporter's first reading still is


def test_a_rejected_probe_is_unknown_and_never_counts_toward_down() -> None:
    idle = read_text(vllm_page({"0": {"running": 0, "waiting": 0, "gen": 100}}))
    t = Thresholds(stall_after=120.0, down_after=2)
    rejected = ProbeResult("error", "HTTP 401", 0.01, status=401)
    state = None
    verdicts = []
    for now, probe in enumerate([None, rejected, None, rejected, rejected, None]):
        state = judge(state, Observation(ReadResult.OK, idle, probe=probe), float(now), t)
        verdicts.append(state.verdict)
    assert verdicts == [Verdict.IDLE] + [Verdict.UNKNOWN] * 5
    assert "probe rejected: HTTP 401 — set exporter.api_key_file?" in state.reason
    state = judge(state, Observation(ReadResult.OK, idle, probe=ProbeResult("ok", seconds=0.1)), 6.0, t)
    assert state.verdict == Verdict.IDLE and "rejected" not in state.reason
    # a server error still counts: 5xx twice is down
    for now in (7.0, 8.0):
        state = judge(state, Observation(ReadResult.OK, idle, probe=ProbeResult("error", "HTTP 503", status=503)), now, t)
    assert state.verdict == Verdict.DOWN
    wrong_model = ProbeResult("error", "HTTP 404", status=404)
    state = judge(state, Observation(ReadResult.OK, idle, probe=wrong_model), 9.0, t)
    assert state.verdict == Verdict.UNKNOWN and "probe_model" in state.reason


def test_a_timeout_after_an_idle_reading_counts_only_when_health_fails_too() -> None:
    t = Thresholds(stall_after=120.0, down_after=2)
    idle = Observation(ReadResult.OK, read_text(vllm_page({"0": {"running": 0, "waiting": 0, "gen": 100}})))
    slow = Observation(ReadResult.TIMEOUT, detail="no answer within 5 s", cheap_ok=True)
    dead = Observation(ReadResult.TIMEOUT, detail="no answer within 5 s", cheap_ok=False)
    states = []
    state = None
    for now, obs in enumerate([idle, slow, slow, slow, slow, dead, dead]):
        state = judge(state, obs, float(now), t)
        states.append(state)
    assert [s.verdict for s in states] == [Verdict.IDLE] + [Verdict.UNKNOWN] * 5 + [Verdict.DOWN]
    assert states[1].reason == "/metrics slow, /health fine" and states[4].failures == 0
    assert "/health failed too" in states[-1].reason
    # while the last reading had work a timeout is judged as before (toward stalled, never down)
    busy = Observation(ReadResult.OK, read_text(vllm_page({"0": {"running": 3, "waiting": 0, "gen": 100}})))
    state = judge(judge(None, busy, 0.0, t), slow, 15.0, t)
    assert state.verdict == Verdict.UNKNOWN and "last reading 3 running" in state.reason


HEAD = "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"


def _page(running: str = "0", waiting: str = "0", kv: str | None = "0.5", gen: str | None = "500") -> str:
    e = '{engine="0",model_name="m"}'
    return (HEAD + f"vllm:num_requests_running{e} {running}\nvllm:num_requests_waiting{e} {waiting}\n"
            + (f"vllm:kv_cache_usage_perc{e} {kv}\n" if kv is not None else "")
            + (f"vllm:generation_tokens_total{e} {gen}\n" if gen is not None else "")
            + "process_start_time_seconds 1000\n")


def _judged(text: str, readings: int) -> BackendState:
    return run([(i * 15.0, ok(read_text(text))) for i in range(readings)])[-1]


def test_a_nan_kv_gauge_does_not_hide_frozen_counters() -> None:
    """NaN != NaN: the frozen engine looked like progress at every reading, busy forever, never stalled."""
    assert _judged(_page("2", kv="NaN"), 41).verdict == Verdict.STALLED


@pytest.mark.parametrize(("running", "waiting"), [("NaN", "0"), ("NaN", "3"), ("-1", "0"), ("2", "+Inf")])
def test_a_work_gauge_that_is_no_count_says_nothing_of_the_work(running: str, waiting: str) -> None:
    """A NaN running gauge counted as work (stalled with no real data), and NaN running with 3 waiting read
    as idle (probed): such a page is one without engine gauges."""
    r = read_text(_page(running, waiting))
    assert not r.has_engine_metrics and r.work == 0
    assert _judged(_page(running, waiting), 41).verdict != Verdict.STALLED


def test_a_nan_counter_is_no_series() -> None:
    assert _judged(_page("2", kv=None, gen="NaN"), 41).verdict == Verdict.UNKNOWN


def test_an_engine_without_any_progress_series_is_never_stalled() -> None:
    """Running and waiting gauges, no counter and no KV gauge (a page cut after its gauges, counters
    renamed): nothing could ever show progress, so nothing shows a stall."""
    state = _judged(_page("2", kv=None, gen=None), 12)
    assert state.verdict == Verdict.UNKNOWN and "no progress series" in state.reason, state.reason
    assert _judged(_page("2", kv=None), 12).verdict == Verdict.STALLED     # one counter is enough


def _sleep_rows(*states: str) -> str:
    out = ""
    for i, state in enumerate(states):
        for level in ("awake", "weights_offloaded", "discard_all"):
            out += f'vllm:engine_sleep_state{{engine="{i}",sleep_state="{level}"}} {1 if level == state else 0}\n'
    return out


def test_a_server_with_some_engines_asleep_is_never_probed() -> None:
    """Data parallel, one engine asleep and one awake (going to sleep, or waking): it read as awake, and a
    probe could be routed to the sleeping engine (a completion can crash a sleeping vLLM)."""
    from llm_health.exporter.reading import Sleep
    from llm_health.exporter.verdict import may_probe_engine

    gauges = "".join(f'vllm:num_requests_running{{engine="{i}"}} 0\nvllm:num_requests_waiting{{engine="{i}"}} 0\n'
                     f'vllm:generation_tokens_total{{engine="{i}"}} 5\n' for i in range(2))
    mixed = read_text(HEAD + gauges + _sleep_rows("awake", "weights_offloaded"))
    assert mixed.sleep is Sleep.PARTLY and not mixed.asleep and not may_probe_engine(mixed)
    awake = read_text(HEAD + gauges + _sleep_rows("awake", "awake"))
    assert awake.sleep is Sleep.AWAKE and may_probe_engine(awake)
    asleep = read_text(HEAD + gauges + _sleep_rows("discard_all", "weights_offloaded"))
    assert asleep.sleep is Sleep.DISCARD_ALL and asleep.asleep
