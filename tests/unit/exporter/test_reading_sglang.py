"""exporter/reading.py and the verdict on the pages of a real SGLang 0.5.23 (tests/fixtures/metrics/
sglang-0.5.23-cpu-{idle,busy,stalled}.txt, captured by tests/real/test_sglang.py with
LLM_HEALTH_SAVE_PAGES=1; every real-engine run checks the live page still has their structure).

What the real page showed: scheduler series per rank (`tp_rank`, `pp_rank`, `moe_ep_rank`; no `dp_rank`
with one DP rank); tokenizer counters with `model_name`, `engine_type`, `is_streaming` and no rank,
credited when a request finishes; `sglang:cuda_graph_passes_total{mode}` (decode_none, prefill_none on
this path) moving every engine step; `http_*` and `scheduler_idle_seconds_total` moving without any
engine work; no `process_start_time_seconds`, no `*_created`.
"""

from __future__ import annotations

import re

import pytest

from llm_health.exporter.observation import Observation, ProbeOutcome, ProbeResult, ReadResult
from llm_health.exporter.reading import rates, read_text
from llm_health.exporter.verdict import (
    BackendState,
    Thresholds,
    Verdict,
    judge,
    other_process,
    page_is_work_queue,
    progressed,
)
from tests.support.paths import PAGES

FIXTURES = PAGES
PAGES = ("sglang-0.5.23-cpu-idle.txt", "sglang-0.5.23-cpu-busy.txt", "sglang-0.5.23-cpu-stalled.txt")
T = Thresholds(stall_after=10.0, down_after=2, stall_readings=2)


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels text, value) of every sample of `name`, read with a regex (not with the exporter's parser)."""
    out = []
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out.append((m.group(1) or "", float(m.group(2))))
    return out


def total(text: str, name: str) -> float:
    return sum(v for _, v in samples(text, name))


@pytest.mark.parametrize("name", PAGES)
def test_real_page_reads_as_one_sglang_engine_without_identity(name: str) -> None:
    text = page(name)
    assert text.startswith("# SOURCE: SGLang 0.5.23")
    r = read_text(text)
    assert r.flavour == "sglang" and set(r.engines) == {"0"} and r.has_engine_metrics
    assert r.process_start is None and r.created == {}
    assert not page_is_work_queue(r)  # /metrics is the HTTP server's, not the scheduler's
    eng = r.engines["0"]
    assert eng.running == total(text, "sglang:num_running_reqs")
    assert eng.waiting == total(text, "sglang:num_queue_reqs") + total(text, "sglang:num_grammar_queue_reqs")
    assert eng.kv_usage == total(text, "sglang:token_usage")
    # forward passes: every mode of the per-rank counter (decode_none and prefill_none on this path)
    modes = {re.search(r'mode="([^"]+)"', labels).group(1) for labels, _ in
             samples(text, "sglang:cuda_graph_passes_total")}
    assert modes == {"decode_none", "prefill_none"}
    assert eng.counters["forward_passes"] == total(text, "sglang:cuda_graph_passes_total") > 0
    # the tokenizer's counters (no rank label) are the server's, and with one rank the engine's too
    for short, wire in (("generation_tokens", "sglang:generation_tokens_total"),
                        ("prompt_tokens", "sglang:prompt_tokens_total")):
        assert all("tp_rank" not in labels for labels, _ in samples(text, wire))
        assert r.server[short] == eng.counters[short] == total(text, wire) > 0
    assert not eng.shared
    assert r.steps() == eng.counters["forward_passes"]


def test_real_busy_page_has_the_held_load_in_flight() -> None:
    r = read_text(page("sglang-0.5.23-cpu-busy.txt"))
    assert (r.running, r.waiting) == (4, 2)  # --max-running-requests 4, 6 clients
    idle = read_text(page("sglang-0.5.23-cpu-idle.txt"))
    assert idle.work == 0


def test_every_tp_rank_exports_the_scheduler_series_and_only_rank_0_is_read() -> None:
    """A TP-2 server's page repeats every scheduler series with tp_rank="1": in flight is not doubled."""
    text = page("sglang-0.5.23-cpu-busy.txt")
    rank1 = "\n".join(line.replace('tp_rank="0"', 'tp_rank="1"') for line in text.splitlines()
                      if 'tp_rank="0"' in line)
    one, two = read_text(text), read_text(text + "\n" + rank1 + "\n")
    assert (two.running, two.waiting, two.engines["0"].counters) == (one.running, one.waiting, one.engines["0"].counters)


def test_series_that_move_without_engine_work_are_not_progress() -> None:
    """http_* count every scrape; scheduler_idle_seconds_total and the process CPU counters move while
    idle: a frozen scheduler behind a busy HTTP side must not read as progress."""
    text = page("sglang-0.5.23-cpu-idle.txt")
    bumped = text
    for name in ("sglang:http_requests_total", "sglang:http_responses_total", "sglang:scheduler_idle_seconds_total",
                 "sglang:process_cpu_seconds_total", "sglang:scheduler_process_cpu_seconds_total"):
        assert samples(text, name), name
        bumped = re.sub(rf"^({re.escape(name)}(?:\{{[^}}]*\}})?) (\S+)$",
                        lambda m: f"{m.group(1)} {float(m.group(2)) + 100}", bumped, flags=re.M)
    assert bumped != text
    old, new = read_text(text), read_text(bumped)
    assert not progressed(old.engines["0"], new.engines["0"])
    assert other_process(old, new) == ""


def test_frozen_real_page_with_work_is_stalled_after_stall_after() -> None:
    """The busy page, then the scheduler SIGSTOPped: the stalled capture, again and again."""
    busy, stalled = read_text(page("sglang-0.5.23-cpu-busy.txt")), read_text(page("sglang-0.5.23-cpu-stalled.txt"))
    assert stalled.work > 0
    state: BackendState | None = judge(None, Observation(ReadResult.OK, busy), 0.0, T)
    seen = []
    for t in range(1, 15):
        state = judge(state, Observation(ReadResult.OK, stalled), float(t), T)
        seen.append((t, state.verdict))
    first = next(t for t, v in seen if v == Verdict.STALLED)
    # the first frozen reading may still show the steps made between the two captures
    assert T.stall_after <= first <= T.stall_after + 1, seen
    assert all(v != Verdict.DOWN for _, v in seen)


def test_frozen_real_idle_page_is_down_only_by_the_probe() -> None:
    """The scheduler stopped while idle: the page says idle forever; the failed probes say down."""
    idle = Observation(ReadResult.OK, read_text(page("sglang-0.5.23-cpu-idle.txt")))
    state = judge(None, idle, 0.0, T)
    assert state.verdict == Verdict.IDLE
    for t in range(1, 30):
        state = judge(state, idle, float(t), T)
    assert state.verdict == Verdict.IDLE  # nothing on the page tells
    failed = Observation(ReadResult.OK, idle.reading, probe=ProbeResult(ProbeOutcome.TIMEOUT, "no answer", 4.0))
    state = judge(state, failed, 30.0, T)
    assert state.verdict == Verdict.IDLE
    state = judge(state, failed, 31.0, T)
    assert state.verdict == Verdict.DOWN and "probe" in state.reason


def test_a_new_server_is_another_process_by_its_counters() -> None:
    """No identity series: a fresh server (the idle page, few requests) after the busy one is a restart."""
    busy, idle = read_text(page("sglang-0.5.23-cpu-busy.txt")), read_text(page("sglang-0.5.23-cpu-idle.txt"))
    assert "went backwards" in other_process(busy, idle)
    assert other_process(idle, busy) == ""


def test_tokens_per_second_come_from_the_decode_counter_not_the_finished_requests() -> None:
    """The tokenizer's generation_tokens_total is credited when a request finishes (the busy capture:
    12 counted while 4 requests had decoded for seconds); realtime_tokens_total{mode="decode"} moves on
    every decode step, per rank. Without it (older releases) the tokenizer's counter is the fallback."""
    busy, stalled = page("sglang-0.5.23-cpu-busy.txt"), page("sglang-0.5.23-cpu-stalled.txt")
    decoded = {name: sum(v for labels, v in samples(page(name), "sglang:realtime_tokens_total")
                         if 'mode="decode"' in labels) for name in PAGES}
    for name in PAGES:
        r = read_text(page(name))
        assert r.generation_tokens() == decoded[name] == r.engines["0"].counters["decode_tokens"]
    assert total(busy, "sglang:generation_tokens_total") < decoded["sglang-0.5.23-cpu-busy.txt"] / 10
    tps, _ = rates(read_text(busy), read_text(stalled), 10.0)
    assert tps == (decoded["sglang-0.5.23-cpu-stalled.txt"] - decoded["sglang-0.5.23-cpu-busy.txt"]) / 10.0
    older = "\n".join(line for line in busy.splitlines() if "realtime_tokens_total" not in line) + "\n"
    assert read_text(older).generation_tokens() == total(busy, "sglang:generation_tokens_total")
