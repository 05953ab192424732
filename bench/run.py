"""`python -m bench.run [--only replay|path|scale|storm|fleet_remediator|fleet|slowclients|failover|faults] [--quick] [--out DIR]` (what `make bench` runs).

Each benchmark writes its section (markdown + JSON figures) to `bench/results/` (or, with `--out DIR`,
to `<DIR>/bench-results/`), its plots to `<DIR>/img/`; then `<DIR>/benchmarks.md` is assembled
from every section present, so
`--only NAME` re-measures one benchmark and keeps the others' last figures (each section states
its own command and date). `--quick` is a tiny configuration for smoke tests (use it with --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llm_health.drill.procs import interrupt_on_termination

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("replay", "path", "scale", "storm", "fleet_remediator", "fleet", "slowclients", "failover", "faults")


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _runner(name: str) -> Callable[[Path, bool], tuple[str, dict[str, Any]]]:
    if name == "replay":
        from bench import replay
        return replay.run
    if name == "path":
        from bench import path
        return path.run
    if name == "scale":
        from bench import scale
        return scale.run
    if name == "fleet":
        from bench import fleet
        return fleet.run
    if name == "fleet_remediator":
        from bench import fleet_remediator
        return fleet_remediator.run
    if name == "slowclients":
        from bench import slowclients
        return slowclients.run
    if name == "failover":
        from bench import failover
        return failover.run
    if name == "faults":
        from bench import faults
        return faults.run
    from bench import storm
    return storm.run


def _load(results: Path, name: str) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def headline(results: Path) -> list[str]:
    """The figures that matter, one line per benchmark, from the sections' JSON."""
    lines = ["## Headline", ""]
    r = _load(results, "replay")
    if r:
        a, b = r["old_watchdog"], r["llm_health"]
        delays = [s["detected_after"] for s in b["stalls"] if s["detected_after"] is not None]
        lines.append(
            f"- **Incident day replayed** (same traffic, same {len(b['stalls'])} injected stalls): the old watchdog "
            f"restarted {a['restarts']} times, **{a['false_restarts']} of them a server that was not stalled**, "
            f"failing {a['requests_failed_by_restarts']} requests and sending "
            f"{a['generation_requests_to_busy_server']} chat requests to a busy server; llm-health restarted "
            f"{b['restarts']} times, **{b['false_restarts']} false**, detected every stall in at most "
            f"{max(delays) if delays else float('nan'):.0f} s (limit {r['stall_window']:g} s), and "
            f"{b['generation_requests_to_busy_server']} of its {b['generation_requests_sent_by_checker']} probes met "
            f"work in flight ({b['busy_by_cause']['stalled']} on a stalled engine with frozen gauges, "
            f"{b['busy_by_cause']['race']} within one engine step of a request's arrival; "
            f"{b['busy_by_cause']['visible']} where the page showed work).")
    if r and r.get("path"):
        aft, bef = r["path"]["after"]["with work"], r["path"]["before"]["with work"]
        hard = r.get("harder_day") or {}
        if aft.get("frozen -> restarted") and bef.get("frozen -> restarted"):
            a_, b_ = aft["frozen -> restarted"], bef["frozen -> restarted"]
            lines.append(
                f"- **From a frozen engine to a started restart** (replay, {a_['n']} stalls with work over the seeds): "
                f"p50 {a_['p50']:.0f} s, p95 {a_['p95']:.0f} s, max {a_['max']:.0f} s at the shipped defaults, against "
                f"p50 {b_['p50']:.0f} s, p95 {b_['p95']:.0f} s before (verdict at stall_after for every engine, "
                "`for: 1m`, group_wait 10s, verification 3 x 10 s)"
                + (f"; the harder day: {sum(x['after']['false_restarts'] for x in hard.get('summary', []))} false "
                   f"restarts, p95 {hard['with_work']['p95']:.0f} s" if hard.get("with_work") else "") + ".")
    pth = _load(results, "path")
    if pth and pth["summary"].get("frozen -> restarted") and not pth.get("quick"):
        v = pth["summary"]["frozen -> restarted"]
        lines.append(f"- **The same path on the real stack** (real Prometheus, Alertmanager, exporter, remediator at "
                     f"the shipped settings, {v['n']} stalls): p50 {v['p50']:.0f} s, p95 {v['p95']:.0f} s, "
                     f"max {v['max']:.0f} s.")
    s = _load(results, "scale")
    if s:
        big, fl = s["cycles"][-1], s.get("fleet")
        if fl:
            lines.append(
                f"- **Exporter scale**: {fl['backends']} backends on the real {fl['interval_s']:g} s schedule took "
                f"{fl['core_fraction']:.2f} of one core ({fl['cpu_ms_per_reading']:.3f} ms CPU per reading"
                + (f", {s['before']['fleet']['cpu_ms_per_reading']:.3f} ms before the parser's fast path"
                   if s.get("before") else "")
                + f"), reading gap p99 {fl['gap_p99']:.2f} intervals; a {big['backends']}-backend cycle takes "
                f"{big['cycle_s_median']:.2f} s; our parser is "
                f"{s['parsers']['full']['prometheus_client_us'] / s['parsers']['full']['ours_keep_us']:.0f}x faster "
                "than prometheus_client's on a realistic vLLM page.")
        else:
            lines.append(
                f"- **Exporter scale**: {big['backends']} backends read over HTTP and judged in "
                f"{big['cycle_s_median']:.2f} s per cycle ({big['cpu_ms_per_backend']:.2f} ms CPU per backend).")
    t = _load(results, "storm")
    if t:
        ok = all(v for k, v in t["targets"].items() if "p99" not in k)     # the latency goal is said apart
        pg = t.get("postgresql")
        lines.append(
            f"- **Alert storm**: {t['notifications']} webhook notifications at "
            f"{t['throughput_per_s_in_bursts']:.0f}/s, p50 {t['p50_ms']:.1f} ms, p99 {_p99s(t)}"
            + (f" (state on PostgreSQL: {pg['throughput_per_s_in_bursts']:.0f}/s, p50 {pg['p50_ms']:.1f} ms, "
               f"p99 {_p99s(pg)})" if pg else "") + "; restarts: "
            + ("exactly one per backend where one was due, none elsewhere." if ok else
               "targets NOT met, see section 3."))
    f = _load(results, "fleet_remediator")
    if f:
        before = f.get("before")
        lines.append(
            f"- **Fleet under trouble, remediator**: {f['wide']['incidents']} incidents alerted at once; the last "
            f"restart started {f['wide']['last_s']:.1f} s after the alert ({f['defaults']['last_s']:.1f} s with the "
            "default concurrency bound)"
            + (f", against {before['last_s']:.1f} s when the authority carried incidents one at a time." if before
               else "."))
    f = _load(results, "fleet")
    if f:
        reads, probes = f["reads"], f["probes"]
        found = [v for v in f["detected"].values() if v is not None]
        lines.append(
            f"- **Fleet under trouble, exporter** ({f['backends']} backends, {f['by_kind']['hang']} hung, "
            f"{f['by_kind']['slow']} slow, {f['by_kind'].get('drip', 0)} dripping, {f['by_kind']['refuse']} "
            "refusing): healthy members read with a p99 gap "
            f"of {max(reads['idle']['p99'], reads['busy']['p99']):.2f} intervals, idle ones probed with a p99 gap "
            f"of {probes['p99']:.2f} intervals; {len(found)} of {len(f['detected'])} wedged/stalled members "
            f"judged" + (f", the last after {max(found):.0f} s." if found else "."))
    c = _load(results, "slowclients")
    if c:
        worst = max(c["after"], key=lambda r: r["slow_clients"])
        before = c.get("before")
        old = max(before["rows"], key=lambda r: r["slow_clients"]) if before else None
        lines.append(
            f"- **Slow clients, remediator**: with {worst['slow_clients']} clients sending a byte or a line per "
            f"second, /healthz answered in at most {worst['max_ms']:.0f} ms (p99 {worst['p99_ms']:.0f} ms) at the "
            "default 2 x 16 threads"
            + (f"; before, with {old['slow_clients']}: {old['failed']} of {old['asked']} asks not answered within "
               f"5 s (worst answered: {old['max_ms'] / 1000:.1f} s)." if old and old["failed"] < old["asked"] else
               f"; before, with {old['slow_clients']}: not one of {old['asked']} asks answered within 5 s." if old
               else "."))
    o = _load(results, "failover")
    if o:
        lines.append(
            f"- **Failover on PostgreSQL**: leader killed or frozen, {len(o['trials'])} trials at the defaults: the "
            f"other remediator held the lease after p50 {o['p50_s']:.1f} s, max {o['max_s']:.1f} s "
            f"({o['ttl_s']:g} s lease); restarts run through all of them: {o['restarts']} (one was due).")
    fi = _load(results, "faults")
    if fi and not fi.get("quick"):
        lines.append(
            f"- **Fault injection on PostgreSQL**: {fi['faults']} faults (kill -9, SIGSTOP, store restart) at random "
            f"moments of {fi['backends']} restarts under way: **{fi['double_restarts']} double restarts, "
            f"{fi['lost_incidents']} lost incidents** ({fi['restarted_once']} restarted once, "
            f"{fi['held_outcome_unknown']} held for a person with the outcome unknown).")
    lines.append("")
    return lines


def results_dir(out: Path) -> Path:
    """Sections and figures: bench/results/ for the committed docs/, else <out>/bench-results/."""
    if out.resolve() == (ROOT / "docs").resolve():
        return ROOT / "bench" / "results"
    return out / "bench-results"


def _p99s(storm: dict[str, Any]) -> str:
    """The storm's p99: every run's when it was repeated."""
    runs = storm.get("p99_ms_runs") or [storm["p99_ms"]]
    return " / ".join(f"{p:.1f}" for p in runs) + " ms" + (f" ({len(runs)} runs)" if len(runs) > 1 else "")


def assemble(out: Path) -> Path:
    results = results_dir(out)
    m = machine()
    parts = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m bench.run`); one benchmark: `python -m bench.run --only NAME` "
        f"(NAME: {', '.join(NAMES)}). Do not edit by hand.",
        "",
        f"Machine (at assembly): {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}, {m['platform']}.",
        "",
    ]
    parts += headline(results)
    for name in NAMES:
        md = results / f"{name}.md"
        if md.exists():
            parts.append(md.read_text())
    doc = out / "benchmarks.md"
    doc.write_text("\n".join(parts))
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=NAMES, action="append", help="run only this benchmark (repeatable)")
    p.add_argument("--quick", action="store_true", help="tiny configuration (smoke test), no figures worth citing")
    p.add_argument("--out", default=str(ROOT / "docs"), help="output folder (default: docs/)")
    args = p.parse_args(argv)
    interrupt_on_termination()      # a benchmark stopped by `timeout` still stops its servers
    out = Path(args.out)
    rdir = results_dir(out)
    rdir.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.run" + "".join(f" --only {n}" for n in args.only or []) + (
        " --quick" if args.quick else "")
    failed = 0
    for name in args.only or NAMES:
        m = machine()
        print(f"== {name} ...", flush=True)
        started = time.perf_counter()
        text, results = _runner(name)(out, args.quick)
        seconds = time.perf_counter() - started
        header = (f"_Measured {m['date']} by `{command}` on {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}; "
                  f"this benchmark took {seconds:.0f} s._\n\n")
        title, _, body = text.partition("\n\n")
        (rdir / f"{name}.md").write_text(f"{title}\n\n{header}{body}\n")
        results.update(machine=m, command=command, seconds=seconds)
        (rdir / f"{name}.json").write_text(json.dumps(results, indent=1, default=str))
        targets = results.get("targets", {})
        for target, ok in targets.items():
            print(f"   {'PASS' if ok else 'FAIL'} {target}")
        failed += sum(1 for ok in targets.values() if not ok)
        print(f"   {name}: {seconds:.1f} s", flush=True)
    doc = assemble(out)
    print(f"wrote {doc}")
    if failed:
        print(f"{failed} target(s) not met: see the sections above")
    return 0


if __name__ == "__main__":
    sys.exit(main())
