"""Benchmark 2: exporter scale. 10 000 backends on the real schedule, cycles of 10-1000, the pure CPU part.

The backends are one `bench.pageserver` process (asyncio; pre-rendered busy vLLM v1 pages, two engines,
13 histograms, ~780 lines / 81 KB; a distinct URL path per backend, spread over several ports; the page
changes between readings). The exporter side is the project's `exporter.scheduler.ReadScheduler` in
this process, i.e. its scheduler thread, worker lanes, `exporter.backend` HTTP client, parser, reading
and verdict code.

* **The fleet on its schedule**: 1 000, then 10 000 backends, `run_forever()` at the default settings
  (15 s interval), over 2 and 3 intervals after one that opens the connections. Figures: this process' CPU
  (`os.times()`, user + sys, all threads) per interval, per backend reading and as a fraction of one
  core; the reading gap (time between two `/metrics` requests of one backend, as the page server saw
  them) p50 / p99 / max in intervals; the page server's own CPU (it must keep up for the figures to be
  the exporter's).
* **Cycles**: `read_all()` of 10-1000 backends (every backend at once), wall time and CPU; for 500 of
  them, where a reading's CPU goes (HTTP, page -> Reading, the rest).
* **Pure CPU**: parse + reading + judge of one page, no I/O; the parser against prometheus_client.
* **Profile**: cProfile of reading + judging 1000 backends one after another in one thread.

`python -m bench.scale --before-label TEXT` measures the code checked out now and stores it as the
BEFORE figures (`bench/results/scale_before.json`); `make bench` re-measures the AFTER ones.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.pages import page_variants
from bench.scale_report import markdown, plot
from llm_health.config import Backend, ExporterSettings
from llm_health.drill.procs import ManagedProcess, free_port, python_module
from llm_health.exporter.backend import Target, observe
from llm_health.exporter.cli import fds_wanted, raise_fd_limit
from llm_health.exporter.observation import Observation, ReadResult
from llm_health.exporter.parser import parse
from llm_health.exporter.reading import VLLM_RUNNING, from_page, read_text, wanted
from llm_health.exporter.scheduler import ReadScheduler
from llm_health.exporter.verdict import Thresholds, judge
from llm_health.http_client import fetch

try:
    from llm_health.exporter.fastparse import parse_fast
except ImportError:                          # the code before the fast path: how its BEFORE figures are measured
    parse_fast = None  # type: ignore[assignment]

INTERVAL = 15.0
ROOT = Path(__file__).resolve().parent.parent
BEFORE_JSON = ROOT / "bench" / "results" / "scale_before.json"
GOAL_CORE = 0.25            # 10 000 backends within a quarter of one core at the 15 s interval


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _stats(port: int, what: str = "/cpu") -> dict[str, Any]:
    return fetch("GET", f"http://127.0.0.1:{port}{what}", timeout=30).json()  # type: ignore[no-any-return]


def _per_call(fn: Any, arg: Any, min_seconds: float) -> float:
    """Seconds per call: repeat until `min_seconds` have passed (at least 3 calls), best of 3 rounds."""
    best = float("inf")
    for _ in range(3):
        n = 0
        started = time.perf_counter()
        while True:
            fn(arg)
            n += 1
            elapsed = time.perf_counter() - started
            if n >= 3 and elapsed >= min_seconds:
                break
        best = min(best, elapsed / n)
    return best


def measure_cycles(port: int, size: int, cycles: int) -> dict[str, Any]:
    settings = ExporterSettings(interval=INTERVAL, read_timeout=5.0)
    backends = [Backend(name=f"n{size}-{i}", url=f"http://127.0.0.1:{port}/b/n{size}-{i}") for i in range(size)]
    fleet = ReadScheduler(backends, [], settings)
    try:
        first = fleet.read_all()             # opens the kept-alive connections; no previous reading yet
        walls, cpus = [], []
        for _ in range(cycles):
            cpu0 = time.process_time()
            walls.append(fleet.read_all())
            cpus.append(time.process_time() - cpu0)
        verdicts: dict[str, int] = {}
        for b in fleet.snapshot().backends:
            verdicts[b.verdict.value] = verdicts.get(b.verdict.value, 0) + 1
        probes = sum(s.probes_sent for s in fleet.backends)
    finally:
        fleet.close()
        for slot in fleet.backends:
            slot.target.close()
    return {
        "backends": size,
        "first_cycle_s": first,
        "cycle_s_median": statistics.median(walls),
        "cycle_s_max": max(walls),
        "cpu_s_per_cycle": statistics.median(cpus),
        "cpu_ms_per_backend": statistics.median(cpus) / size * 1000,
        "verdicts": verdicts,
        "probes_sent": probes,
    }


def measure_schedule(ports: list[int], size: int, interval: float, intervals: int) -> dict[str, Any]:
    """`size` backends on the real schedule (`run_forever`, default settings but `interval`): one interval
    to open the connections, then `intervals` measured ones. CPU of this process per interval; the reading
    gaps as the page server saw them."""
    raise_fd_limit(fds_wanted(size, 0))          # as `llm-health exporter` does: a socket per backend
    settings = ExporterSettings(interval=interval)
    backends = [Backend(name=f"f{size}-{i}", url=f"http://127.0.0.1:{ports[i % len(ports)]}/b/f{size}-{i}")
                for i in range(size)]
    sched = ReadScheduler(backends, [], settings)
    stop = threading.Event()
    loop = threading.Thread(target=sched.run_forever, args=(stop,), name="scheduler", daemon=True)
    cpu_start = _cpu()
    started = time.monotonic()
    loop.start()
    warm = interval + settings.read_timeout / 2     # every backend read once: its connection is open
    time.sleep(max(0.0, started + warm - time.monotonic()))
    warm_cpu = _cpu() - cpu_start
    server0 = _stats(ports[0])
    t0, c0 = time.monotonic(), _cpu()
    marks = [(t0, c0)]
    for k in range(1, intervals + 1):      # nothing here waits for the scheduler (its lock): marks on time
        time.sleep(max(0.0, t0 + k * interval - time.monotonic()))
        marks.append((time.monotonic(), _cpu()))
    t1, c1 = marks[-1]
    server1 = _stats(ports[0])
    snap = sched.snapshot()                 # as Prometheus would see it at the end of the window
    stop.set()
    loop.join(timeout=30)
    sched.close()
    for slot in sched.backends:
        slot.target.close()
    arrivals = _stats(ports[0], "/stats")["arrivals"]
    gaps: list[float] = []      # between two readings; and a backend waiting at the end: its wait so far
    reads = waiting = 0
    for i in range(size):
        seen = arrivals.get(f"f{size}-{i}", [])
        ts = [t for t in seen if t0 <= t <= t1]
        reads += len(ts)
        seq = [t for t in seen if t < t0][-1:] + ts
        gaps += [(b - a) / interval for a, b in zip(seq, seq[1:], strict=False)]
        wait = (t1 - (seq[-1] if seq else started)) / interval
        if wait > 1:
            gaps.append(wait)
            waiting += 1
    per_interval = [(cb - ca) for (_ta, ca), (_tb, cb) in zip(marks, marks[1:], strict=False)]
    durations = [(tb - ta) for (ta, _ca), (tb, _cb) in zip(marks, marks[1:], strict=False)]
    cpu = c1 - c0
    verdicts: dict[str, int] = {}
    for b in snap.backends:
        verdicts[b.verdict.value] = verdicts.get(b.verdict.value, 0) + 1
    return {
        "backends": size,
        "ports": len(ports),
        "interval_s": interval,
        "intervals": intervals,
        "window_s": t1 - t0,
        "warm_cpu_s": warm_cpu,
        "cpu_s": cpu,
        "cpu_s_per_interval": per_interval,
        "interval_durations_s": durations,
        "core_fraction": cpu / (t1 - t0),
        "readings": reads,
        "readings_expected": size * intervals,
        "cpu_ms_per_reading": cpu / max(reads, 1) * 1000,
        "cpu_ms_per_backend_interval": cpu / (size * intervals) * 1000,
        "gap_p50": _pct(gaps, 0.5),
        "gap_p99": _pct(gaps, 0.99),
        "gap_max": max(gaps, default=float("nan")),
        "gaps": len(gaps),
        "waiting_at_end": waiting,      # backends not read for more than an interval when the window closed
        "lag_s_max": snap.lag_seconds,
        "reads_skipped": sum(b.reads_skipped for b in snap.backends),
        "probes_sent": sum(b.probes_sent for b in snap.backends),
        "verdicts": verdicts,
        "server_core_fraction": (server1["cpu_s"] - server0["cpu_s"]) / (t1 - t0),
        "server_requests": server1["requests"] - server0["requests"],
        "nice": os.nice(0),
        "read_timeout_s": settings.read_timeout,
        "per_endpoint": settings.max_reads_per_endpoint,
    }


def exporter_parse(page: str) -> Any:
    """The parse the exporter makes of a page at every reading: the fast path, or on the code before it
    (the BEFORE figures) the full parse of the kept names."""
    if parse_fast is not None:
        return parse_fast(page, wanted, (VLLM_RUNNING,))
    return parse(page, keep=wanted, helps=(VLLM_RUNNING,))


def pure_cpu(pages: list[str], min_seconds: float) -> dict[str, float]:
    thresholds = Thresholds()
    page = pages[1]
    parsed = exporter_parse(page)
    r0, r1 = read_text(pages[0]), read_text(pages[1])
    prev = judge(None, Observation(ReadResult.OK, reading=r0), 0.0, thresholds)

    def whole(p: str) -> None:
        judge(prev, Observation(ReadResult.OK, reading=read_text(p)), 15.0, thresholds)

    return {
        "parse_keep_us": _per_call(exporter_parse, page, min_seconds) * 1e6,
        "reading_us": _per_call(from_page, parsed, min_seconds) * 1e6,
        "judge_us": _per_call(lambda r: judge(prev, Observation(ReadResult.OK, reading=r), 15.0, thresholds), r1,
                              min_seconds) * 1e6,
        "total_us": _per_call(whole, page, min_seconds) * 1e6,
    }


def parser_compare(page: str, min_seconds: float) -> dict[str, float]:
    return {
        "lines": len(page.splitlines()),
        "bytes": len(page.encode()),
        "ours_all_us": _per_call(parse, page, min_seconds) * 1e6,
        "ours_full_keep_us": _per_call(lambda p: parse(p, keep=wanted, helps=(VLLM_RUNNING,)), page,
                                       min_seconds) * 1e6,
        "ours_keep_us": _per_call(exporter_parse, page, min_seconds) * 1e6,
        "prometheus_client_us": _per_call(lambda p: [s for f in text_string_to_metric_families(p) for s in f.samples],
                                          page, min_seconds) * 1e6,
    }


def cpu_split(port: int, size: int, cycles: int) -> dict[str, float]:
    """Where a reading's CPU goes, by the reading threads' own CPU clock (`time.thread_time`): the HTTP
    exchange (`Target.get`), the page into a Reading (`read_text`), and the rest of the reading
    (scheduling, the pool, judging, publishing), over `cycles` cycles of `size` backends."""
    from llm_health.exporter import backend

    spent = {"http": 0.0, "read_text": 0.0}
    calls = {"http": 0, "read_text": 0}
    lock = threading.Lock()

    def timed(key: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    spent[key] += time.thread_time() - started
                    calls[key] += 1
        return call

    get, read, own = backend.Target.get, backend.read_text, "get" in vars(backend.Target)
    backend.Target.get = timed("http", get)  # type: ignore[method-assign]
    backend.read_text = timed("read_text", read)
    try:
        row = measure_cycles(port, size, cycles)
    finally:
        if own:
            backend.Target.get = get  # type: ignore[method-assign]
        else:
            del backend.Target.get
        backend.read_text = read
    total = row["cpu_ms_per_backend"]
    http = spent["http"] / max(calls["http"], 1) * 1000
    text = spent["read_text"] / max(calls["read_text"], 1) * 1000
    return {"backends": size, "total_ms": total, "http_ms": http, "read_text_ms": text,
            "rest_ms": max(total - http - text, 0.0)}


def profile_sequential(port: int, size: int) -> str:
    """cProfile of reading + judging `size` backends one after another in one thread (the pool's work,
    serialised so the profiler sees all of it)."""
    thresholds = Thresholds()
    targets = [Target(f"http://127.0.0.1:{port}/b/p{size}-{i}", 5.0) for i in range(size)]
    states: list[Any] = [None] * size
    for i, t in enumerate(targets):          # warm: connections open, first reading taken
        states[i] = judge(None, observe(t), 0.0, thresholds)
    prof = cProfile.Profile()
    prof.enable()
    for i, t in enumerate(targets):
        states[i] = judge(states[i], observe(t), 15.0, thresholds)
    prof.disable()
    for t in targets:
        t.close()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    head = [ln for ln in lines[:start] if "function calls" in ln]
    root = str(Path(__file__).resolve().parent.parent) + "/"
    return "\n".join(head + lines[start:]).replace(root, "")


SMALL = 1_000        # backends in the first run on the real schedule
SMALL_INTERVALS = 2  # its measured intervals
FLEET = 10_000       # backends in the second run on the real schedule
FLEET_INTERVALS = 3  # measured intervals of that run, after one that opens the connections
PORTS = 100          # host:port endpoints of the page server in that run (100 backends each)


def measure(quick: bool, fleet_run: bool = True) -> dict[str, Any]:
    """Every figure of this benchmark for the code checked out now (`fleet_run=False`: all but the
    10 000-backend run)."""
    sizes = (10, 50) if quick else (10, 100, 500, 1000)
    cycles = 2 if quick else 5
    min_s = 0.05 if quick else 0.5
    fleet_size, interval, intervals, nports = (100, 1.0, 2, 4) if quick else (FLEET, INTERVAL, FLEET_INTERVALS, PORTS)
    ports = [free_port() for _ in range(nports)]
    full = page_variants(3)                 # the no-I/O figures first, before the fleet's objects exist
    simple = page_variants(2, full=False)
    cpu = pure_cpu(full, min_s)
    parsers = {"full": parser_compare(full[1], min_s), "simulator": parser_compare(simple[1], min_s)}
    with tempfile.TemporaryDirectory() as logs:
        server = ManagedProcess(python_module("bench.pageserver", *[a for p in ports for a in ("--port", p)],
                                              "--variants", 16, "--record"), "pageserver", logs, cwd=ROOT)
        try:
            server.wait_http(f"http://127.0.0.1:{ports[0]}/b/ready/health", timeout=60)
            rows = [measure_cycles(ports[0], n, cycles) for n in sizes]
            gc.collect()
            split = cpu_split(ports[0], sizes[-1] // 2, cycles)
            gc.collect()
            profile = profile_sequential(ports[0], sizes[-1])
            gc.collect()
            small = None if quick else measure_schedule(ports[:SMALL // 100], SMALL, INTERVAL, SMALL_INTERVALS)
            gc.collect()
            fleet = measure_schedule(ports, fleet_size, interval, intervals) if fleet_run else None
        finally:
            server.stop()
    return {"cycles": rows, "fleet": fleet, "fleet_small": small, "pure_cpu_us": cpu, "parsers": parsers, "profile": profile,
            "cycles_measured": cycles, "split": split}


def run(out_dir: Path, quick: bool) -> tuple[str, dict[str, Any]]:
    m = measure(quick)
    before = None
    if not quick:
        try:
            before = json.loads(BEFORE_JSON.read_text())
        except (OSError, ValueError):
            pass
    rows, fleet, cpu = m["cycles"], m["fleet"], m["pure_cpu_us"]
    big = rows[-1]
    limit_pure = INTERVAL / (cpu["total_us"] / 1e6)
    limit_http = INTERVAL / (big["cpu_ms_per_backend"] / 1000)
    targets = {
        f"{big['backends']}-backend cycle inside the {INTERVAL:g} s interval": big["cycle_s_max"] < INTERVAL,
        "every backend judged busy (the pages show progress)": all(
            r["verdicts"].get("busy", 0) == r["backends"] for r in rows)
        and fleet["verdicts"].get("busy", 0) == fleet["backends"],
        "no probe sent (every page shows work)": all(r["probes_sent"] == 0 for r in rows)
        and fleet["probes_sent"] == 0,
        f"{fleet['backends']} backends on the schedule: every backend read every interval (p99 gap <= 1.2)":
            fleet["gap_p99"] <= 1.2 and fleet["readings"] >= 0.98 * fleet["readings_expected"],
    }
    if not quick:      # the goal is for the real size and interval; the quick run is a smoke test
        targets[f"{fleet['backends']} backends within {GOAL_CORE:g} of one core at the {fleet['interval_s']:g} s "
                "interval"] = fleet["core_fraction"] <= GOAL_CORE
    plot(rows, m["parsers"], out_dir / "img" / "scale.png", INTERVAL)
    m["goal_core"] = GOAL_CORE
    text = markdown(m, before, limit_pure, limit_http, targets)
    m.update(targets=targets, before=before, limit_backends_pure=limit_pure, limit_backends_http=limit_http,
             quick=quick)
    return text, m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    p.add_argument("--before-label", required=True, help="how the BEFORE figures name the code checked out now")
    p.add_argument("--out", help="write the figures here instead of bench/results/scale_before.json")
    p.add_argument("--keep-fleet", action="store_true",
                   help="measure all but the 10 000-backend run; keep that run's figures from --out")
    args = p.parse_args(argv)
    from bench.run import machine

    out = Path(args.out) if args.out else BEFORE_JSON
    m = measure(quick=False, fleet_run=not args.keep_fleet)
    if args.keep_fleet:
        m["fleet"] = json.loads(out.read_text())["fleet"]
    m.update(label=args.before_label, date=machine()["date"], machine=machine())
    out.write_text(json.dumps(m, indent=1))
    f = m["fleet"]
    print(f"wrote {out}: {f['backends']} backends, {f['core_fraction']:.3f} of one core, "
          f"{f['cpu_ms_per_reading']:.3f} ms per reading, gap p99 {f['gap_p99']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
