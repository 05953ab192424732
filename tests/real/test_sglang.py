"""A real SGLang 0.5.23 (PyPI, CPU torch, its base platform path `--device cpu --attention-backend
torch_native`, installed by `make engines`) judged by the real exporter and `llm-health check`.

One server for the module (started once more by the last test, after its scheduler is killed), one
exporter reading it through a counting proxy: every probe is counted, and a probe arriving while the
test has work in flight is caught. The exporter starts before the server, so the loading phase is
seen too. Stalls are real: SIGSTOP of the `sglang::scheduler` process. SGLang's /metrics is answered
by its HTTP server (the tokenizer manager's process) from the multiprocess files the scheduler writes,
so a stopped scheduler leaves the page answering, frozen.

Timings: exporter interval 1 s, stall_after 6 s, read_timeout 2 s, probe_timeout 4 s, down_after 2;
the bounds asserted here are the ones docs/engines.md documents.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from llm_health.drill.procs import free_port
from llm_health.exporter.reading import read_text
from llm_health.exporter.verdict import PROBE_STEPS
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
    sglang_engine,
    wait_for,
)

pytestmark = pytest.mark.real_engine

INTERVAL, STALL_AFTER, READ_TIMEOUT, PROBE_TIMEOUT, DOWN_AFTER = 1.0, 6.0, 2.0, 4.0, 2
SEQS = 4            # --max-running-requests
MAX_TOKENS = 64     # per completion of the held load: short, so clients finish soon once stopped
STALL_BOUND = STALL_AFTER + 2 * INTERVAL + READ_TIMEOUT
# an idle engine whose scheduler is stopped: each probe needs its timeout and a cycle to be judged
WEDGE_BOUND = DOWN_AFTER * (PROBE_TIMEOUT + INTERVAL) + 2 * INTERVAL
# the scheduler killed: SGLang's launcher sleeps 5 s ("crash diagnostics") with its event loop blocked
# (/metrics and /health time out), then kills its process tree (refused); down after down_after
KILL_BOUND = 5 + 3 + DOWN_AFTER * INTERVAL + READ_TIMEOUT + 3
HEALTH_CHECK_TIMEOUT = 20   # SGLANG_HEALTH_CHECK_TIMEOUT: SGLang's own /health generates, waits this long
START_TIMEOUT = 240
TIMINGS: dict[str, float] = {}
# exported once a multi-token completion finished: present or not depending on when the page was read
LAZY = frozenset({"sglang:inter_token_latency_seconds", "sglang:num_aborted_requests"})
SCHEDULER_COUNTERS = {"forward_passes", "decode_tokens"}  # written by the scheduler process (reading.py names)
PHASES: list[tuple[float, int, int]] = []  # while starting: (seconds, /health, /metrics) at each change
SOURCE = "SGLang 0.5.23 (PyPI sglang, CPU torch 2.13.0, --device cpu --attention-backend torch_native)"
SETUP = ("tiny random-weight Llama (scripts/tiny_model.py), --max-running-requests 4, --max-total-tokens 16384,\n"
         "--enable-metrics, --sleep-on-idle (tests/real/test_sglang.py)")


def said_no_work(pages: list[str]) -> bool:
    """A probe sent while work was in flight is excused only in the race no reading can see: the last two
    pages the exporter read said 0 running, 0 waiting AND the forward-pass counter had not moved between
    them beyond a probe's own steps (the work arrived after the engine's last step). SGLang's stale gauges
    (0 / 0 for up to 40 decode steps while it runs, docs/engines.md) are no excuse: the exporter does not
    believe an idle page while the engine steps (exporter.verdict.idle_believable)."""
    readings = [read_text(page) for page in pages[-2:]]
    if len(readings) < 2 or not all(r.has_engine_metrics and r.work == 0 for r in readings):
        return False
    before, after = readings[0].steps(), readings[1].steps()
    return before is not None and after is not None and after - before <= PROBE_STEPS


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    paths = require_engine("sglang")
    logs = tmp_path_factory.mktemp("sglang")
    engine = sglang_engine(paths, free_port(), logs, max_running=SEQS)
    try:
        with judged(engine, logs, idle_timeout=90, interval=INTERVAL, stall_after=STALL_AFTER,
                    read_timeout=READ_TIMEOUT, probe_timeout=PROBE_TIMEOUT, down_after=DOWN_AFTER) as r:
            r.started_at = started = time.monotonic()
            engine.start()

            def up() -> bool:
                if not engine.proc.alive():
                    raise RuntimeError(f"sglang exited:\n{engine.proc.log()[-3000:]}")
                health, page = get(engine.url, "/health", 1.0)[0], get(engine.url, "/metrics", 1.0)[0]
                if not PHASES or PHASES[-1][1:] != (health, page):
                    PHASES.append((time.monotonic() - started, health, page))
                return health == 200

            wait_for(up, START_TIMEOUT, "SGLang ready", 0.1)
            TIMINGS["ready_seconds"] = time.monotonic() - started
            yield r
    finally:
        print(f"\nSGLang timings: {TIMINGS}")


def test_loading_refuses_then_warms_up_and_is_never_busy(rig: Rig) -> None:
    """Nothing listens while the scheduler loads; then /metrics answers while /health still says 503
    (SGLang's warm-up request runs); /health 200 once it is done."""
    phases = PHASES
    assert phases[0][1:] == (0, 0), phases                         # refused at first
    assert phases[-1][1] == 200, phases
    warming = [p for p in phases if p[1] == 503]
    assert warming and all(p[2] == 200 for p in warming), phases   # the page answers during warm-up
    TIMINGS["listening_seconds"] = next(t for t, h, _ in phases if h != 0)
    rig.wait_idle()
    ready_at = rig.started_at + TIMINGS["ready_seconds"]
    listening_at = rig.started_at + TIMINGS["listening_seconds"]
    before = [v for t, v, _, _ in rig.timeline.seen if t < listening_at - 1]
    assert before and set(before) <= {"unknown", "down"}, set(before)
    assert "down" in before  # refused down_after times in a row
    reasons = {r for t, v, r, _ in rig.timeline.seen if t < listening_at - 1 and v == "down"}
    assert any("refused" in r or "error" in r for r in reasons), reasons  # the proxy drops the connection
    assert not {"busy", "stalled", "restarted"} & set(rig.timeline.since(rig.started_at)), rig.story(rig.started_at)
    TIMINGS["warmup_seconds"] = ready_at - listening_at
    TIMINGS["listening_to_idle_seconds"] = rig.timeline.wait("idle", listening_at, 30)


def test_idle_is_probed_and_check_says_ok(rig: Rig) -> None:
    rig.wait_idle()
    wait_for(lambda: "probe answered" in rig.timeline.now().get("reason", ""), 20, "probe answered")
    assert rig.proxy.probes >= 1
    page = metrics_text(rig.engine.url) or ""
    reading = read_text(page)
    assert reading.flavour == "sglang" and reading.work == 0 and set(reading.engines) == {"0"}
    maybe_save_page(page, "sglang-0.5.23-cpu-idle.txt", SOURCE, "idle, after a few probes: GET /metrics\n" + SETUP, LAZY)
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT,
                      "--probe-timeout", PROBE_TIMEOUT)
    assert code == 0 and out.startswith("OK: idle"), out


def test_busy_then_stall_with_work_then_recovery(rig: Rig) -> None:
    rig.wait_idle()
    n = SEQS + 2
    probes_before = rig.proxy.probes_while_busy
    rig.load = Load(rig.engine.url, n, MAX_TOKENS, hold=True)
    t0 = time.monotonic()
    TIMINGS["busy_seconds"] = rig.timeline.wait("busy", t0, 30)
    wait_for(lambda: f"{SEQS} running, {n - SEQS} waiting" in rig.timeline.now()["reason"], 30,
             "every slot busy, the rest waiting")
    page = metrics_text(rig.engine.url) or ""
    assert read_text(page).flavour == "sglang"
    maybe_save_page(page, "sglang-0.5.23-cpu-busy.txt", SOURCE,
                    f"busy: {n} held completions of {MAX_TOKENS} tokens, {SEQS} running, {n - SEQS} queued\n" + SETUP, LAZY)
    # SGLang's scheduler gauges are written at each prefill batch (running = the batch before it was
    # admitted) and every 40 decode steps: work admitted to an idle engine reads 0 running, 0 waiting
    # until then, and the exporter probes it (docs/engines.md, "the stale gauges")
    TIMINGS["probes_while_busy_at_start"] = rig.proxy.probes_while_busy - probes_before
    assert all(said_no_work(pages) for _, pages in rig.proxy.busy_probe_pages[probes_before:])
    busy_probes = rig.proxy.probes_while_busy
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT)
    assert code == 0 and out.startswith("OK: busy"), out

    # a real engine under load, never stopped yet: a stall here would be a false one
    assert "stalled" not in rig.timeline.since(t0), rig.story(t0)
    scheduler = rig.engine.scheduler()
    os.kill(scheduler, signal.SIGSTOP)
    try:
        t1 = time.monotonic()
        status, _, body = get(rig.engine.url, "/metrics", READ_TIMEOUT)
        assert status == 200  # answered by the HTTP server, from the stopped scheduler's last values
        TIMINGS["busy_stall_to_stalled_seconds"] = took = rig.timeline.wait("stalled", t1, STALL_BOUND + 5)
        assert STALL_AFTER - INTERVAL <= took <= STALL_BOUND, (took, rig.story(t0))
        assert "down" not in rig.timeline.since(t1)
        frozen = metrics_text(rig.engine.url, READ_TIMEOUT) or ""
        assert series_value(frozen, "sglang:cuda_graph_passes_total") == series_value(
            body.decode(), "sglang:cuda_graph_passes_total")
        assert read_text(frozen).work > 0
        maybe_save_page(frozen, "sglang-0.5.23-cpu-stalled.txt", SOURCE,
                        f"stalled: the sglang::scheduler process SIGSTOPped with {n} held completions in flight;\n"
                        f"GET /metrics {took:.0f} s later (every sglang:* series frozen)\n" + SETUP, LAZY)
        code, out = check(rig.proxy.url, "--readings", 4, "--interval", 1, "--timeout", READ_TIMEOUT,
                          "--stall-after", 3)
        assert code == 2 and out.startswith("CRITICAL: stalled"), out
    finally:
        os.kill(scheduler, signal.SIGCONT)
    TIMINGS["resume_to_busy_seconds"] = rig.carries_on(t0, busy_probes, 180, excused=said_no_work)
    TIMINGS["probes_while_busy_later"] = rig.proxy.probes_while_busy - busy_probes


def test_stall_while_idle_is_down_by_the_probe(rig: Rig) -> None:
    """The scheduler stopped while idle: the page answers, frozen at 0 running / 0 waiting (nothing on
    it tells a stopped scheduler from an idle one); the probe hangs and the exporter says down. SGLang's
    own /health (a generation of its own) says 503 after SGLANG_HEALTH_CHECK_TIMEOUT."""
    rig.wait_idle()
    scheduler = rig.engine.scheduler()
    probes = rig.proxy.probes
    health: list[int] = []
    os.kill(scheduler, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        before = metrics_text(rig.engine.url) or ""
        asked = threading.Thread(target=lambda: health.append(
            get(rig.engine.url, "/health", HEALTH_CHECK_TIMEOUT + 10)[0]), daemon=True)
        asked.start()
        TIMINGS["idle_stall_to_down_seconds"] = took = rig.timeline.wait("down", t0, WEDGE_BOUND + 5)
        assert took <= WEDGE_BOUND, (took, rig.story(t0))
        assert "probe" in rig.timeline.now()["reason"]
        # one probe went out (or the one in flight at the stop) and timed out; no second joined it in the
        # stopped engine's queue while nothing moved: that standing still was the next failure
        assert rig.proxy.probes - probes <= 1, rig.proxy.probes - probes
        assert "stalled" not in rig.timeline.since(t0)
        page = metrics_text(rig.engine.url) or ""
        assert read_text(page).work == 0  # the frozen page says idle, with probes queued behind it
        frozen = {k: v for k, v in read_text(page).engines["0"].counters.items() if k in SCHEDULER_COUNTERS}
        assert frozen == {k: v for k, v in read_text(before).engines["0"].counters.items() if k in SCHEDULER_COUNTERS}
        assert set(frozen) == SCHEDULER_COUNTERS
        code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT,
                          "--probe-timeout", PROBE_TIMEOUT)
        assert code == 2 and out.startswith("CRITICAL: down"), out
        asked.join(HEALTH_CHECK_TIMEOUT + 15)
        TIMINGS["idle_stall_sglang_health_seconds"] = time.monotonic() - t0
        assert health == [503], health
    finally:
        os.kill(scheduler, signal.SIGCONT)
    t1 = time.monotonic()
    TIMINGS["idle_resume_to_idle_seconds"] = rig.timeline.wait("idle", t1, 30)
    wait_for(lambda: "probe answered" in rig.timeline.now().get("reason", ""), 20, "probe answered again")
    assert "restarted" not in rig.timeline.since(t0)


def test_scheduler_killed_is_down_and_a_new_server_is_restarted(rig: Rig) -> None:
    """kill -9 of the scheduler with work in flight: the server notices at once, blocks 5 s (its crash
    diagnostics), then kills its own process tree; the work in flight gets no answer. Started again,
    the new server's counters start from zero: restarted, then idle."""
    rig.wait_idle()
    old = read_text(metrics_text(rig.engine.url) or "")
    assert old.process_start is None and not old.created  # SGLang pages carry no identity series
    rig.load = Load(rig.engine.url, SEQS, MAX_TOKENS, hold=True)
    t0 = time.monotonic()
    rig.timeline.wait("busy", t0, 30)
    rig.load.stop()  # each client's completion in flight now is its last
    os.kill(rig.engine.scheduler(), signal.SIGKILL)
    t1 = time.monotonic()
    faces: list[tuple[float, int]] = []

    def gone() -> bool:
        status = get(rig.engine.url, "/metrics", 1.0)[0]
        if not faces or faces[-1][1] != status:
            faces.append((time.monotonic() - t1, status))
        return status == 0

    wait_for(gone, 60, "the SGLang server exits", 0.05)
    TIMINGS["scheduler_kill_to_refused_seconds"] = time.monotonic() - t1
    results = rig.load.wait(30)
    assert rig.load.last() == [0] * SEQS and set(results) <= {200, 0}, rig.load.per_client
    assert faces[-1][1] == 0 and {s for _, s in faces} <= {200, -1, -2, 0}, faces
    TIMINGS["scheduler_kill_to_down_seconds"] = took = rig.timeline.wait("down", t1, KILL_BOUND + 5)
    assert took <= KILL_BOUND, (took, rig.story(t1))
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 0.5, "--timeout", READ_TIMEOUT)
    assert code == 2 and out.startswith("CRITICAL: down"), out

    rig.engine.stop()  # reaps what is left of its group
    t2 = time.monotonic()
    rig.engine.start()
    rig.engine.ready(START_TIMEOUT)
    TIMINGS["restart_ready_seconds"] = time.monotonic() - t2
    TIMINGS["restart_to_restarted_seconds"] = rig.timeline.wait("restarted", t2, START_TIMEOUT)
    reason = next(r for t, v, r, _ in list(rig.timeline.seen) if t >= t2 and v == "restarted")
    # the exporter's own evidence, checked against the old server: the counter it names had at least
    # the old page's value before (counters only grew until the kill) and less after. A later page of
    # the new server is no evidence: its warm-up and idle probes may have stepped it past the old value.
    went = re.search(r"counter (\w+) went backwards \(([^ ]+) -> ([^ )]+)\)", reason)
    assert went, reason
    name, before, after = went.group(1), float(went.group(2)), float(went.group(3))
    was = old.server.get(name, old.engines["0"].counters.get(name))
    assert was is not None and before >= was > after, (reason, was)
    rig.timeline.wait("idle", t2, 60)
    code, out = check(rig.proxy.url, "--readings", 2, "--interval", 1, "--timeout", READ_TIMEOUT)
    assert code == 0, out
