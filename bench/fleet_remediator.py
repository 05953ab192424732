"""Benchmark "fleet under trouble", remediator part: time from alert to restart for 20 incidents at once.

A real `llm-health remediator` (gunicorn, 2 workers) and `bench.pageserver` on loopback. 20 backends
serve a frozen page (work in flight, counters still: stalled); one Alertmanager notification fires a
restart-worthy alert for all of them at once. Each incident goes the whole way: the real verification
(`exporter.check.verify`, 2 readings 5 s apart: a 5 s window), the stalled drain (1 s), the claim, a
slow restart action (a script that logs its start time, takes 2 s, then un-freezes its page), warm-up.
Figure: for each backend, the time from posting the alert to the start of its restart action.

`python -m bench.fleet_remediator --before PYTHON [--before-label TEXT]` also measures another checkout
(PYTHON is that checkout's venv interpreter, e.g. the main branch before the concurrent authority) and
stores it in `bench/results/fleet_remediator_before.json`; `make bench` measures the current code and
shows the stored BEFORE figures beside it.
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

from llm_health.drill.procs import ManagedProcess, free_port, python_module, wait_until

TOKEN = "bench-fleet-token"
N = 20
ACTION_SECONDS = 2.0
VERIFY = {"verify_readings": 2, "verify_interval": 5.0}
ROOT = Path(__file__).resolve().parent.parent
BEFORE_JSON = ROOT / "bench" / "results" / "fleet_remediator_before.json"
RECORDER = """import sys, time, urllib.request, os
calls, fix, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(calls, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, f"{os.environ.get('LLM_HEALTH_BACKEND')} {time.time():.3f}\\n".encode())
os.close(fd)
time.sleep(delay)
urllib.request.urlopen(urllib.request.Request(fix, data=b"", method="POST"), timeout=5).read()
"""


def _config(tmp: Path, page_port: int, names: list[str], extra: dict[str, Any]) -> Path:
    (tmp / "token").write_text(TOKEN)
    (tmp / "record.py").write_text(RECORDER)
    calls = str(tmp / "calls.txt")
    cfg = {
        "backends": [{"name": b, "url": f"http://127.0.0.1:{page_port}/s/{b}", "host": f"node-{i}",
                      "restart": [sys.executable, str(tmp / "record.py"), calls,
                                  f"http://127.0.0.1:{page_port}/fix/{b}", str(ACTION_SECONDS)]}
                     for i, b in enumerate(names)],
        "exporter": {"read_timeout": 1.0, "probe_timeout": 2.0},
        "remediator": {
            "state": "state.db", "token_file": "token", "workers": 2, "poll_interval": 0.5, **VERIFY,
            "warmup_poll": 0.5, "warmup_timeout": 600, "action_timeout": 60, "drain_timeout": 5,
            "stalled_drain_timeout": 1,
            # 20 restarts at once: above the default budget/breaker (which would rightly stop at 5)
            "budget": {"restarts": 100, "window": 3600}, "breaker": {"restarts": 100, "window": 3600},
            **extra,
        },
    }
    path = tmp / "llm-health.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _alerts(names: list[str]) -> dict[str, Any]:
    alerts = [{"status": "firing", "fingerprint": f"fp-{b}", "startsAt": "2026-12-01T00:00:00Z",
               "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus:9090/graph",
               "labels": {"alertname": "LLMBackendStalled", "backend": b, "severity": "critical",
                          "remediation": "restart"}, "annotations": {}} for b in names]
    return {"version": "4", "status": "firing", "receiver": "llm-health", "groupKey": "bench-fleet",
            "truncatedAlerts": 0, "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093", "alerts": alerts}


def measure(python: str, cwd: Path, extra: dict[str, Any], quick: bool) -> dict[str, Any]:
    """One run against the remediator run by `python` (a checkout's venv interpreter) from `cwd`."""
    names = [f"stalled-{i:02d}" for i in range(4 if quick else N)]
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        page_port, port = free_port(), free_port()
        # the backends serve (pages move) until every one is READY, then stall at once (POST /stall)
        pages = ManagedProcess(python_module("bench.pageserver", "--port", page_port, "--variants", 16,
                                             "--every", 2, "--simple", "--moving"), "pageserver", tmp, cwd=ROOT)
        rem = None
        try:
            pages.wait_http(f"http://127.0.0.1:{page_port}/s/ready/health", timeout=60)
            config = _config(tmp, page_port, names, extra)
            rem = ManagedProcess([python, "-m", "llm_health.cli", "remediator", "--config", str(config),
                                  "--listen", f"127.0.0.1:{port}"], "remediator", tmp, cwd=cwd)
            base = f"http://127.0.0.1:{port}"
            rem.wait_http(f"{base}/healthz", timeout=30)

            def all_ready() -> bool:
                view = requests.get(f"{base}/api/backends", timeout=10).json()["backends"]
                return all(b["lifecycle"]["state"] == "ready" for b in view)
            # a backend seen for the first time is READY only once it verifies healthy (the warm-up gate)
            wait_until(all_ready, timeout=120, interval=0.2, what="every backend READY")
            for b in names:
                requests.post(f"http://127.0.0.1:{page_port}/stall/{b}", timeout=5).raise_for_status()
            alerted = time.time()
            r = requests.post(f"{base}/webhook", json=_alerts(names), timeout=30,
                              headers={"Authorization": f"Bearer {TOKEN}"})
            r.raise_for_status()
            calls = tmp / "calls.txt"

            def started() -> dict[str, float] | None:
                if not calls.exists():
                    return None
                seen = {ln.split()[0]: float(ln.split()[1]) for ln in calls.read_text().splitlines() if ln.strip()}
                return seen if len(seen) >= len(names) else None
            seen = wait_until(started, timeout=900, interval=0.5, what="every restart action started")
            recovered = wait_until(
                lambda: len(requests.get(f"{base}/api/events", params={"kind": "recovered", "limit": 1000},
                                         timeout=10).json()["events"]) >= len(names) or None,
                timeout=300, interval=0.5, what="every incident recovered")
            all_done = time.time() - alerted
            restarts = len(calls.read_text().splitlines())
        finally:
            if rem is not None:
                rem.stop()
            pages.stop()
    delays = sorted(seen[b] - alerted for b in names)
    return {"incidents": len(names), "delays_s": delays, "first_s": delays[0], "median_s": statistics.median(delays),
            "last_s": delays[-1], "all_recovered_s": all_done, "restarts": restarts, "settings": extra,
            "recovered": bool(recovered)}


def _row(label: str, m: dict[str, Any]) -> str:
    return (f"| {label} | {m['incidents']} | {m['first_s']:.1f} s | {m['median_s']:.1f} s | **{m['last_s']:.1f} s** | "
            f"{m['all_recovered_s']:.1f} s | {m['restarts']} |")


def run(out_dir: Path, quick: bool) -> tuple[str, dict[str, Any]]:
    defaults = measure(sys.executable, ROOT, {}, quick)
    wide = measure(sys.executable, ROOT, {"max_concurrent_incidents": N, "max_concurrent_restarts": N}, quick)
    before = None
    try:
        before = json.loads(BEFORE_JSON.read_text())
    except (OSError, ValueError):
        pass
    window = VERIFY["verify_interval"] * (VERIFY["verify_readings"] - 1)
    one = window + 1 + ACTION_SECONDS      # one incident: verification window + stalled drain + action
    targets = {
        f"every restart starts within one verification window + 5 s of the alert ({window + 5:g} s), "
        "concurrency limits raised to 20": wide["last_s"] < window + 5,
        "one restart per incident": defaults["restarts"] == defaults["incidents"] and wide["restarts"] == wide["incidents"],
    }
    lines = [
        "## 4. Fleet under trouble: remediator",
        "",
        f"{defaults['incidents']} stalled backends (frozen `bench.pageserver` pages, each on its own host) alerted in "
        "one Alertmanager notification, into `llm-health remediator --workers 2` on loopback. Each incident: "
        f"the real verification ({VERIFY['verify_readings']} readings {VERIFY['verify_interval']:g} s apart), "
        f"the stalled drain (1 s), the claim, a restart action that takes {ACTION_SECONDS:g} s, warm-up. Budget "
        "and breaker raised to 100 for the run. Time from posting the alert to the start of each restart action "
        f"(one incident alone needs about {one:g} s of that):",
        "",
        "| code | incidents | first restart | median | last restart | all recovered | restarts |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    if before:
        lines.append(_row(f"BEFORE: {before.get('label', 'main')}, measured "
                          f"{before.get('date', '?')}", before))
    lines += [
        _row("AFTER: concurrent authority, defaults (max_concurrent_incidents 16, max_concurrent_restarts 8)",
             defaults),
        _row("AFTER: concurrent authority, both limits 20", wide),
        "",
        "With the defaults, 8 restarts run at once; the 9th starts when one of them is warm again (here within "
        "seconds; with a real model, warm-up takes minutes, and the bound is what keeps a mass event from "
        "restarting the whole fleet at once). The BEFORE row was measured by "
        "`python -m bench.fleet_remediator --before <venv python of a main checkout>` (stored in "
        "`bench/results/fleet_remediator_before.json`; `make bench` re-measures only the AFTER rows).",
        "",
        "Targets:",
        *[f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in targets.items()],
        "",
    ]
    return "\n".join(lines), {"defaults": defaults, "wide": wide, "before": before, "targets": targets,
                              "quick": quick}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_remediator", description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="venv python of the checkout to measure as BEFORE")
    p.add_argument("--before-cwd", help="that checkout's folder (default: two levels above PYTHON's venv)")
    p.add_argument("--before-label", default="main", help="how the BEFORE row names that code")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    from bench.run import machine

    cwd = Path(args.before_cwd) if args.before_cwd else Path(args.before).absolute().parents[2]
    m = measure(args.before, cwd, {}, args.quick)
    m.update(label=args.before_label, date=machine()["date"], machine=machine())
    BEFORE_JSON.write_text(json.dumps(m, indent=1))
    print(json.dumps({k: v for k, v in m.items() if k != "delays_s"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
