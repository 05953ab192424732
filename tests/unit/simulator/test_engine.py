"""The simulated engine, driven by a fake clock (plain numbers): no threads, no sleeping."""

from __future__ import annotations

import pytest

from llm_health.simulator.engine import Engine, RequestState


def make(**kw: object) -> Engine:
    defaults: dict[str, object] = {"step_seconds": 1.0, "chunk_tokens": 512, "kv_blocks": 1000, "block_size": 16}
    defaults.update(kw)
    return Engine(**defaults)  # type: ignore[arg-type]


def test_short_request_prefills_then_decodes_one_token_per_step() -> None:
    e = make()
    req = e.submit(prompt_tokens=10, max_tokens=3)
    assert req.state is RequestState.WAITING
    assert e.advance_to(0.99) == 0
    assert e.advance_to(1.0) == 1
    # the step that completes the prefill emits the first token; v1 credits the whole prompt then
    assert req.generated == 1 and req.first_token_time == 1.0
    assert e.stats.prompt_tokens == 10 and e.stats.generation_tokens == 1
    assert e.stats.iteration_tokens.count == 1 and e.stats.iteration_tokens.total == 11
    assert e.stats.running == 1
    e.advance_to(3.0)
    assert req.state is RequestState.FINISHED and req.generated == 3 and req.finish_time == 3.0
    assert e.stats.request_success == {"stop": 0, "length": 1, "abort": 0}
    assert e.stats.e2e.count == 1 and e.stats.e2e.total == 3.0
    assert e.stats.ttft.total == 1.0
    assert e.stats.running == 0 and e.kv_usage == 0.0
    # idle v1 engine: no more steps, nothing moves
    steps = e.stats.steps
    e.advance_to(100.0)
    assert e.stats.steps == steps and e.stats.iteration_tokens.count == 3


def test_v1_long_prefill_moves_only_kv_until_first_token() -> None:
    e = make(chunk_tokens=512, kv_blocks=1000, block_size=16)
    req = e.submit(prompt_tokens=2000, max_tokens=2)
    usages = []
    for t in (1, 2, 3):
        e.advance_to(t)
        usages.append(e.stats.kv_usage)
        assert e.stats.iteration_tokens.count == 0
        assert e.stats.generation_tokens == 0 and e.stats.prompt_tokens == 0
        assert e.stats.running == 1 and req.generated == 0
    assert usages == [32 / 1000, 64 / 1000, 96 / 1000]
    e.advance_to(4)  # last chunk (464 tokens) completes the prefill
    assert req.generated == 1
    assert e.stats.prompt_tokens == 2000 and e.stats.iteration_tokens.count == 1
    assert e.stats.iteration_tokens.total == 2001
    assert e.stats.prefix_cache_queries == 2000


def test_v0_counts_every_step_and_prompt_chunks() -> None:
    e = make(flavour="v0", chunk_tokens=512)
    e.submit(prompt_tokens=1000, max_tokens=2)
    e.advance_to(1)
    assert e.stats.iteration_tokens.count == 1 and e.stats.iteration_tokens.total == 512
    assert e.stats.prompt_tokens == 512 and e.stats.generation_tokens == 0
    e.advance_to(3)
    assert e.stats.prompt_tokens == 1000 and e.stats.generation_tokens == 2
    assert e.stats.request_success == {"length": 1}


def test_v0_idle_observes_zero_every_log_period_v1_does_not() -> None:
    v0 = make(flavour="v0", idle_log_seconds=10.0)
    v1 = make(flavour="v1", idle_log_seconds=10.0)
    for e in (v0, v1):
        e.advance_to(35.0)
    assert v0.stats.iteration_tokens.count == 3 and v0.stats.iteration_tokens.total == 0
    assert v0.stats.iteration_tokens.counts[0] == 3  # le="1"
    assert v1.stats.iteration_tokens.count == 0


def test_requests_beyond_max_num_seqs_wait_fifo_until_a_slot_frees() -> None:
    e = make(max_num_seqs=2)
    a = e.submit(10, 5)
    b = e.submit(10, 8)
    probe = e.submit(3, 1)
    e.advance_to(1)
    assert e.stats.running == 2 and e.stats.waiting == 1
    assert probe.state is RequestState.WAITING
    e.advance_to(4.5)
    assert probe.state is RequestState.WAITING and probe.generated == 0
    e.advance_to(5)  # a finishes at t=5, its slot frees at the end of that step
    assert a.state is RequestState.FINISHED and probe.state is RequestState.WAITING
    e.advance_to(6)
    assert probe.state is RequestState.FINISHED and probe.first_scheduled == 6
    assert b.state is RequestState.RUNNING


def test_preemption_when_kv_is_full_and_everyone_finishes() -> None:
    e = make(kv_blocks=4, block_size=4, max_num_seqs=4)
    reqs = [e.submit(6, 6), e.submit(6, 6)]
    e.advance_to(100)
    assert all(r.state is RequestState.FINISHED and r.generated == 6 for r in reqs)
    assert e.stats.preemptions >= 1
    assert e.free_blocks == 4 and e.stats.request_success["length"] == 2


def test_submit_rejects_impossible_requests() -> None:
    e = make(kv_blocks=10, block_size=16)
    with pytest.raises(ValueError, match="maximum context length is 160"):
        e.submit(150, 20)
    with pytest.raises(ValueError):
        e.submit(0, 1)
    assert e.in_flight == 0
    with pytest.raises(ValueError):
        Engine(flavour="v2")


def test_freeze_runs_no_step_and_work_resumes_afterwards() -> None:
    e = make()
    req = e.submit(10, 5)
    e.advance_to(2)
    assert req.generated == 2
    e.freeze_until(50)
    assert req.generated == 2 and e.stats.steps == 2
    e.advance_to(51)
    assert req.generated == 3


def test_fail_all_and_abort_free_everything() -> None:
    e = make(max_num_seqs=1)
    a = e.submit(10, 50)
    b = e.submit(10, 50)
    e.advance_to(3)
    e.abort(b)
    assert b.finished_reason == "abort" and e.stats.request_success["abort"] == 1
    failed = e.fail_all("restart")
    assert failed == [a] and a.state is RequestState.FAILED and a.error == "restart"
    assert e.in_flight == 0 and e.free_blocks == e.kv_blocks


def test_a_frozen_engine_counts_no_abort_until_it_runs_again() -> None:
    """A client that gives up on a wedged engine: the abort is a message to its loop, so nothing is counted
    (and no gauge moves) while it is frozen; a stall never looks like progress (issue 25's replay found
    an idle stall 'verified healthy' because the simulator counted the exporter's timed-out probe)."""
    e = make()
    e.advance_to(1.0)
    req = e.submit(prompt_tokens=10, max_tokens=50)
    e.freeze_until(5.0)
    e.abort(req)
    assert e.stats.request_success["abort"] == 0 and not req.done and e.in_flight == 1
    e.freeze_until(9.0)
    assert e.stats.request_success["abort"] == 0
    e.advance_to(10.0)                       # the loop runs again: it takes the abort up first
    assert e.stats.request_success["abort"] == 1 and req.done and e.in_flight == 0


def test_a_restart_of_a_frozen_engine_fails_only_requests_whose_client_still_waits() -> None:
    e = make()
    gone, waiting = e.submit(prompt_tokens=10, max_tokens=50), e.submit(prompt_tokens=10, max_tokens=50)
    e.freeze_until(5.0)
    e.abort(gone)
    assert e.fail_all("restart") == [waiting]
