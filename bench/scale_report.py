"""The scale benchmark's report (bench/scale.py measures): the plot and the markdown section, BEFORE and
AFTER side by side when the BEFORE figures are there."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(rows: list[dict[str, Any]], parsers: dict[str, dict[str, float]], path: Path, interval: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    n = [r["backends"] for r in rows]
    a.plot(n, [r["cycle_s_median"] for r in rows], "o-", label="full cycle over HTTP (median)")
    a.plot(n, [r["cpu_s_per_cycle"] for r in rows], "s--", label="exporter CPU per cycle")
    a.axhline(interval, color="#d62728", lw=1, ls=":", label=f"the {interval:g} s interval")
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("backends")
    a.set_ylabel("seconds")
    a.set_title("Exporter cycle vs fleet size (2-core machine)", fontsize=10)
    a.grid(alpha=0.3, which="both")
    a.legend(fontsize=8)
    labels = ["realistic v1 page\n(~780 lines)", "simulator page\n(~260 lines)"]
    keys = [("ours_keep_us", "ours, as the exporter calls it"), ("ours_all_us", "ours, every sample"),
            ("prometheus_client_us", "prometheus_client")]
    width = 0.27
    for i, (key, label) in enumerate(keys):
        vals = [parsers["full"][key] / 1000, parsers["simulator"][key] / 1000]
        b.bar([x + (i - 1) * width for x in range(2)], vals, width, label=label)
    b.set_xticks(range(2), labels)
    b.set_ylabel("ms per page")
    b.set_title("Parsing one page", fontsize=10)
    b.legend(fontsize=8)
    b.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fleet_row(label: str, f: dict[str, Any]) -> str:
    per = f["cpu_s_per_interval"]
    return (f"| {label} | {f['backends']} | {f['cpu_s'] / f['intervals']:.2f} s ({min(per):.2f}-{max(per):.2f}) | "
            f"**{f['core_fraction']:.3f}** | {f['cpu_ms_per_reading']:.3f} ms | "
            f"{f['readings']} / {f['readings_expected']} | {f['gap_p50']:.2f} / **{f['gap_p99']:.2f}** / "
            f"{f['gap_max']:.2f} | {f['lag_s_max']:.2f} s | {f['reads_skipped']} | "
            + ", ".join(f"{k} {v}" for k, v in sorted(f["verdicts"].items()))
            + f" | {f['server_core_fraction']:.2f} |")


def _cycle_rows(label: str, rows: list[dict[str, Any]]) -> list[str]:
    return [f"| {label} | {r['backends']} | {r['cycle_s_median'] * 1000:.0f} ms ({r['cycle_s_max'] * 1000:.0f} ms) | "
            f"{r['first_cycle_s'] * 1000:.0f} ms | {r['cpu_s_per_cycle'] * 1000:.0f} ms | "
            f"{r['cpu_ms_per_backend']:.3f} ms | "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["verdicts"].items())) + " |" for r in rows]


def _split_table(m: dict[str, Any], before: dict[str, Any] | None, blabel: str, after: str) -> list[str]:
    rows = ([(blabel, before["split"])] if before and before.get("split") else []) + [(after, m["split"])]
    return [
        f"Where a reading's CPU goes ({m['split']['backends']} backends per cycle, by the reading threads' own "
        "CPU clock): the HTTP exchange (`Target.get`: `http.client`, the deadline socket), the page into a "
        "Reading (`read_text`: parser and reading), the rest (the pool, scheduling, judging, publishing):",
        "",
        "| code | CPU per reading | HTTP | page -> Reading | the rest |",
        "|---|---:|---:|---:|---:|",
        *[f"| {label} | {r['total_ms']:.3f} ms | {r['http_ms']:.3f} ms | {r['read_text_ms']:.3f} ms | "
          f"{r['rest_ms']:.3f} ms |" for label, r in rows],
        "",
    ]


def _pure(label: str, cpu: dict[str, float]) -> str:
    return (f"| {label} | {cpu['parse_keep_us']:.0f} us | {cpu['reading_us']:.0f} us | {cpu['judge_us']:.0f} us | "
            f"**{cpu['total_us']:.0f} us** |")


def markdown(m: dict[str, Any], before: dict[str, Any] | None, limit_pure: float, limit_http: float,
             targets: dict[str, bool]) -> str:
    rows, f, cpu, parsers = m["cycles"], m["fleet"], m["pure_cpu_us"], m["parsers"]
    after = "AFTER" if before else "this code"
    blabel = f"BEFORE ({before.get('label', 'main')})" if before else ""
    fleet = [
        "| code | backends | exporter CPU per interval, mean (min-max) | of one core | CPU per reading | "
        "readings / expected | reading gap p50 / p99 / max (intervals) | schedule lag at the end | reads skipped | "
        "verdicts | page server, of one core |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for key in ("fleet_small", "fleet"):
        if before and before.get(key):
            fleet.append(_fleet_row(blabel, before[key]))
        if m.get(key):
            fleet.append(_fleet_row(after, m[key]))
    cycles = [
        "| code | backends | full cycle, median (max) | first cycle (connects) | exporter CPU per cycle | "
        "CPU per backend reading | verdicts |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    if before:
        cycles += _cycle_rows(blabel, before["cycles"])
    cycles += _cycle_rows(after, rows)
    pure = ["| code | parse | reading | judge | together |", "|---|---:|---:|---:|---:|"]
    if before:
        pure.append(_pure(blabel, before["pure_cpu_us"]))
    pure.append(_pure(after, cpu))
    ptable = [
        "| code | page | lines / bytes | full parse, all samples | full parse, names kept | as the exporter calls it "
        "| prometheus_client | speed-up (exporter's call) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for code, ps in ([(blabel, before["parsers"])] if before else []) + [(after, parsers)]:
        for label, key in (("realistic v1, 2 engines, 13 histograms", "full"), ("simulator page as rendered", "simulator")):
            p = ps[key]
            ptable.append(
                f"| {code} | {label} | {p['lines']:.0f} / {p['bytes'] / 1000:.0f} KB | {p['ours_all_us']:.0f} us | "
                f"{p.get('ours_full_keep_us', p['ours_keep_us']):.0f} us | {p['ours_keep_us']:.0f} us | "
                f"{p['prometheus_client_us']:.0f} us | {p['prometheus_client_us'] / p['ours_keep_us']:.1f}x |")
    big = rows[-1]
    goal_core = m["goal_core"]
    met = f["core_fraction"] <= goal_core
    kept_up = f["gap_p99"] <= 1.2 and f["readings"] >= 0.98 * f["readings_expected"]
    goal = (f"**Goal ({f['backends']} backends within {goal_core:g} of one core at a {f['interval_s']:g} s "
            f"interval): {'met' if met else 'NOT met'}**: {f['core_fraction']:.3f} of one core, "
            f"{f['cpu_ms_per_reading']:.3f} ms of CPU per reading, "
            + ("every backend read every interval" if kept_up else
               f"{f['readings']} of {f['readings_expected']} readings made (one core is not enough)")
            + f", p99 reading gap {f['gap_p99']:.2f} intervals")
    if before:
        b = before["fleet"]
        goal += (f"; before: {b['core_fraction']:.3f} of one core, {b['cpu_ms_per_reading']:.3f} ms per reading "
                 f"({b['cpu_ms_per_reading'] / f['cpu_ms_per_reading']:.1f}x the CPU per reading)")
    goal += "."
    profile_before = []
    if before and before.get("profile"):
        profile_before = ["", "<details><summary>The same profile on the BEFORE code</summary>", "", "```",
                          before["profile"], "```", "", "</details>"]
    sm = m.get("fleet_small")
    small_text = f"{sm['backends']} and " if sm else ""
    small_intervals = f"{sm['intervals']} (the {sm['backends']}) or " if sm else ""
    return "\n".join([
        "## 2. Exporter scale",
        "",
        f"**{small_text}{f['backends']} backends on the real schedule.** "
        "`exporter.scheduler.ReadScheduler.run_forever()` at the "
        f"default settings ({f['interval_s']:g} s interval, {f.get('read_timeout_s', 5.0):g} s read timeout, "
        f"{f.get('per_endpoint', 16)} reads per host:port), every backend "
        "on its own phase of the interval; one interval to open the connections, then "
        f"{small_intervals}{f['intervals']} measured intervals ({f['window_s']:.0f} s). The backends are one "
        f"`bench.pageserver` process (asyncio, HTTP/1.1 keep-alive, {f['backends'] // f['ports']} backends per port, a distinct URL path "
        "per backend, pre-rendered "
        "~80 KB busy vLLM v1 pages that change at every reading, so the verdicts are `busy`) on the other core; "
        "the exporter is this process (its scheduler thread, worker lanes, `http.client` connections, parser, "
        "reading and `judge`). 'CPU' is this process' user + sys time (`os.times()`, all threads); 'of one core' "
        "is that CPU over the wall time of the window. The reading gap is the time between two `/metrics` "
        "requests of one backend as the page server saw them, in intervals; a backend still not read again when "
        "the window closes counts with its wait so far (since its last reading, or since the start). The page "
        "server's own CPU shows it "
        "kept up (it answers each request from a pre-built buffer). Both processes ran at nice "
        f"{f.get('nice', 0)} (the page server is this process' child), on the machine named above.",
        "",
        *fleet,
        "",
        goal,
        "",
        *_floor(m),
        f"**Cycles** (`read_all()`: every backend read at once, each judged as its read completes), "
        f"{m['cycles_measured']} measured cycles per size after one that opens the connections, all backends on one "
        "host:port of the same page server:",
        "",
        *cycles,
        "",
        *_split_table(m, before, blabel, after),
        "![exporter scale](img/scale.png)",
        "",
        "Pure CPU per backend, no I/O (the realistic page; 'together' is parse + reading + judge measured as one call):",
        "",
        *pure,
        "",
        "Parser, per page (same pages):",
        "",
        *ptable,
        "",
        f"**Limit.** At {f['cpu_ms_per_reading']:.3f} ms of exporter CPU per reading on the schedule, one core reads "
        f"about **{f['interval_s'] / (f['cpu_ms_per_reading'] / 1000):.0f} backends per {f['interval_s']:g} s** "
        f"(the {big['backends']}-backend cycle: {big['cpu_ms_per_backend']:.3f} ms per backend, ~{limit_http:.0f}; "
        f"parse + reading + judge alone, {cpu['total_us'] / 1000:.3f} ms: ~{limit_pure:.0f}). The GIL keeps the "
        "exporter on one core: past that, or to keep its core mostly free, run one exporter per shard of the "
        "fleet (each backend is judged independently).",
        "",
        f"Where the time goes: cProfile of reading + judging {big['backends']} backends one after another "
        "(the pool's work serialised in one thread so the profiler sees it), top entries by own time:",
        "",
        "```",
        m["profile"],
        "```",
        *profile_before,
        "",
        "Targets:",
        *[f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in targets.items()],
        "",
        *_how(m, before),
    ])


def _floor(m: dict[str, Any]) -> list[str]:
    """What the parser cannot fix: the HTTP exchange and the rest of a reading, for the fleet's size."""
    f, sp = m["fleet"], m["split"]
    other = sp["http_ms"] + sp["rest_ms"]
    share = other / 1000 * f["backends"] / f["interval_s"]
    return [
        f"What is left is not the parser's alone: the HTTP exchange and the rest of a reading ({other:.2f} ms, "
        "the split below) would by themselves take "
        f"{share:.2f} of a core for {f['backends']} backends every {f['interval_s']:g} s, whatever the parser "
        "costs. Under the goal that needs a cheaper HTTP client and fewer thread hand-offs per reading too, or "
        "one exporter per shard of the fleet (each backend is judged on its own).",
        "",
    ]


def _how(m: dict[str, Any], before: dict[str, Any] | None) -> list[str]:
    f = m["fleet"]
    out = [
        f"How it was run: `make bench-scale` (`nice -n 10 python -m bench.run --only scale`; `make bench` runs it "
        "with the others): two processes, this one (the exporter's code) and its child `bench.pageserver`, both "
        f"at nice {f.get('nice', 0)}, on the 2-CPU machine named at the top of this section, shared with other "
        "work. In this order: the no-I/O figures, the cycles, the split, the profile, then the runs on the "
        f"schedule (each: one {f['interval_s']:g} s interval to connect, then the measured ones); the whole "
        "benchmark takes about 4 minutes. On this shared VM the same figures vary by up to about a third "
        "between runs minutes apart.",
        "",
    ]
    if before:
        out += [
            f"The BEFORE rows are the same benchmark on the exporter of {before.get('label', '?')}, before the "
            "fast path (that commit's `exporter/` first on `PYTHONPATH`, `python -m bench.scale --before-label TEXT`; "
            "`--keep-fleet` re-measures all but the 10 000-backend run), on this machine, the same hour "
            f"({before.get('date', '?')}); stored in `bench/results/scale_before.json`, `make bench` re-measures "
            "only the AFTER rows. The 1 000-backend figures published before (1.16 s per cycle, 1.14 ms of CPU "
            "per backend, 2026-12-01 08:06) came from another, faster host and from before the step-time "
            "histograms were read: the BEFORE rows here are that code re-measured, not those figures.",
            "",
        ]
    return out
