"""Benchmark "slow clients": /healthz latency of the remediator while N clients send their requests slowly.

A real `llm-health remediator` at its defaults (gunicorn, 2 workers x 16 threads) on loopback. N slow
clients (`llm_health.drill.slowclients`: half send a header byte per second, a quarter a header line per
second, a quarter complete headers and then a body byte per second; spread over 10 loopback
addresses; reconnecting when cut off) run while /healthz is asked again and again, one request after
another on new connections, for a window longer than `request_timeout` (so the cut-offs and
reconnects are inside it). Figures: p50, p99 and worst /healthz latency; a request not answered
within 5 s counts as 5 s and as failed.

`python -m bench.slowclients --before-label TEXT` measures the code checked out now and stores it
as the BEFORE row (`bench/results/slowclients_before.json`); `make bench` re-measures the AFTER row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.drill.slowclients import Drip, SlowClients

TOKEN = "bench-slow-clients-token"
ROOT = Path(__file__).resolve().parent.parent
BEFORE_JSON = ROOT / "bench" / "results" / "slowclients_before.json"
SOURCES = tuple(f"127.0.0.{i}" for i in range(2, 12))
ASK_TIMEOUT = 5.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ask(url: str, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            ok = requests.get(url + "/healthz", timeout=ASK_TIMEOUT).status_code == 200
        except requests.RequestException:
            ok = False
        out.append(time.monotonic() - start if ok else -1.0)
    return out


def measure(counts: tuple[int, ...], window: float) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as d:
        tmp = Path(d)
        (tmp / "token").write_text(TOKEN)
        (tmp / "llm-health.yml").write_text(yaml.safe_dump({
            "backends": [{"name": "gpu-a", "url": f"http://127.0.0.1:{free_port()}"}],
            "remediator": {"state": "state.db", "token_file": "token"}}))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        rem = ManagedProcess(llm_health("remediator", "--config", tmp / "llm-health.yml", "--listen",
                                        f"127.0.0.1:{port}"), "remediator", tmp, cwd=ROOT)
        try:
            rem.wait_http(url + "/healthz", timeout=30)
            for n in counts:
                kinds = ((Drip.HEADER_BYTES, n // 2), (Drip.HEADER_LINES, n // 4), (Drip.BODY_BYTES, n - n // 2 - n // 4))
                drips = [SlowClients("127.0.0.1", port, k, drip=kind, sources=SOURCES, seconds=window + 60)
                         for kind, k in kinds if k]
                try:
                    for c in drips:
                        c.start()
                    wait_until(lambda: sum(c.snapshot().opened for c in drips) >= n, timeout=60,   # noqa: B023
                               what=f"{n} slow clients connected")
                    samples = _ask(url, window)
                    cut = sum(c.snapshot().closed_by_server for c in drips)
                finally:
                    for c in drips:
                        c.stop()
                answered = [s for s in samples if s >= 0]
                latencies = [s if s >= 0 else ASK_TIMEOUT for s in samples]
                rows.append({"slow_clients": n, "asked": len(samples), "failed": len(samples) - len(answered),
                             "p50_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * _percentile(latencies, 0.99),
                             "max_ms": 1000 * max(latencies), "cut_off": cut, "window_s": window})
                print(f"   {rows[-1]}", flush=True)
                # the next count starts once this one's connections are gone
                wait_until(lambda: requests.get(url + "/healthz", timeout=ASK_TIMEOUT).ok, timeout=30, what="calm")
        finally:
            rem.stop()
    return rows


def _table(label: str, rows: list[dict[str, Any]]) -> list[str]:
    return [f"| {label} | {r['slow_clients']} | {r['asked']} | {r['failed']} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | **{r['max_ms']:.1f}** |" for r in rows]


def run(out_dir: Path, quick: bool) -> tuple[str, dict[str, Any]]:
    counts, window = ((0, 20), 3.0) if quick else ((0, 100, 200, 500), 13.0)
    after = measure(counts, window)
    before = None
    try:
        before = json.loads(BEFORE_JSON.read_text())
    except (OSError, ValueError):
        pass
    targets = {"/healthz answers within 1 s every time with up to 500 slow clients":
               all(r["failed"] == 0 and r["max_ms"] < 1000 for r in after)}
    lines = [
        "## 6. Slow clients: remediator",
        "",
        "`llm-health remediator` at its defaults (2 workers x 16 threads) on loopback; N slow clients (half send a "
        "header byte per second, a quarter a header line per second, a quarter a body byte per second after "
        "complete headers; 10 loopback addresses; reconnecting when cut off) while /healthz is asked one request "
        f"after another for {window:g} s (longer than `request_timeout`, 10 s). Latency in ms; a request not "
        f"answered within {ASK_TIMEOUT:g} s counts as {ASK_TIMEOUT:g} s and as failed.",
        "",
        "| code | slow clients | asked | failed | p50 | p99 | worst |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    if before:
        lines += _table(f"BEFORE: {before.get('label', 'main')}, {before.get('date', '?')}", before["rows"])
    lines += _table("AFTER: requests read in the event loop (remediator/serving.py)", after)
    lines += [
        "",
        "The BEFORE rows were measured by `python -m bench.slowclients --before-label TEXT` on that code (stored "
        "in `bench/results/slowclients_before.json`; `make bench` re-measures only the AFTER rows).",
        "",
        "Targets:",
        *[f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in targets.items()],
        "",
    ]
    return "\n".join(lines), {"after": after, "before": before, "targets": targets, "quick": quick}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.slowclients", description=__doc__.splitlines()[0])
    p.add_argument("--before-label", required=True, help="how the BEFORE row names the code checked out now")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    from bench.run import machine

    counts, window = ((0, 20), 3.0) if args.quick else ((0, 100, 200, 500), 13.0)
    rows = measure(counts, window)
    BEFORE_JSON.write_text(json.dumps({"label": args.before_label, "date": machine()["date"], "rows": rows},
                                      indent=1))
    print(f"wrote {BEFORE_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
