"""Benchmark "failover": how long the cluster is without an acting restart authority, and that no restart
is repeated, with remediators on one PostgreSQL (docs/ha.md).

Two real `llm-health remediator` processes (gunicorn, 1 worker each, the default `poll_interval` 1 s, so
a 10 s lease renewed every 2.5 s) on a throw-away PostgreSQL (llm_health.drill.postgres). One backend,
verified `down` (nothing listens), gets one restart (a script that appends the epoch it ran under to a
file); its warm-up never ends, so any repeated restart would show. Then, trial after trial, the leader is
either killed (`kill -9` of its process group, then started again as systemd would) or frozen (SIGSTOP
until the other holds the lease, then SIGCONT); each trial the alert is delivered again to both. Measured
per trial: from the fault to the other instance holding the lease (its /healthz `holds_lease`, polled
every 50 ms). At the end: restarts run (must be 1) and the incident still open (must be).
"""

from __future__ import annotations

import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from llm_health.drill.ha import Member, one_leader, recorder_argv, restart_alert, restarts
from llm_health.drill.postgres import bin_dir, postgres_server
from llm_health.drill.procs import free_port, wait_until

TOKEN = "bench-failover-token"
ALERT = restart_alert("gpu-a")


def measure(trials: int, poll_interval: float) -> dict[str, Any]:
    with postgres_server(bin_dir()) as pg, tempfile.TemporaryDirectory(prefix="llmh-failover-") as tmp:
        folder = Path(tmp)
        actions = folder / "actions.txt"
        config = {
            "backends": [{"name": "gpu-a", "url": f"http://127.0.0.1:{free_port()}",
                          "restart": recorder_argv(folder, actions)}],
            "remediator": {"state": pg.new_database(), "token_file": "token", "poll_interval": poll_interval,
                           "verify_readings": 2, "verify_interval": 0.5, "warmup_timeout": 3600, "drain_timeout": 0},
        }
        ttl = max(5.0, 10 * poll_interval)
        members: list[Member] = []
        rows: list[dict[str, Any]] = []
        try:
            for name in ("remediator-1", "remediator-2"):
                members.append(Member(folder / name, config, TOKEN))
            one_leader(members, 60).deliver(ALERT)
            wait_until(lambda: restarts(actions), timeout=60, interval=0.1, what="the one restart")
            for n in range(trials):
                kind = "kill -9" if n % 2 == 0 else "SIGSTOP"
                now = one_leader(members, 3 * ttl)
                other = next(m for m in members if m is not now)
                t0 = time.monotonic()
                if kind == "kill -9":
                    now.proc.kill9()
                else:
                    now.signal(signal.SIGSTOP)
                try:
                    wait_until(other.leads, timeout=3 * ttl, interval=0.05, what="the other takes over")
                    took = time.monotonic() - t0
                finally:
                    if kind == "SIGSTOP":
                        now.signal(signal.SIGCONT)
                if kind == "kill -9":
                    now.proc = now.start()
                other.deliver(ALERT)                  # Alertmanager's repeat: the same alert again
                rows.append({"trial": n + 1, "fault": kind, "takeover_s": round(took, 2)})
            one_leader(members, 3 * ttl, "one leader at the end")
            (b,) = requests.get(members[0].url + "/api/backends", timeout=5).json()["backends"]
            epochs = [line.split()[1] for line in restarts(actions)]
        finally:
            for m in members:
                m.stop()
    takes = [r["takeover_s"] for r in rows]
    return {"trials": rows, "ttl_s": ttl, "renew_s": ttl / 4, "poll_interval_s": poll_interval,
            "p50_s": statistics.median(takes), "max_s": max(takes), "restarts": len(epochs), "epochs": epochs,
            "incident_open": (b.get("incident") or {}).get("state")}


def run(out_dir: Path, quick: bool) -> tuple[str, dict[str, Any]]:
    trials, poll = (2, 0.2) if quick else (10, 1.0)
    r = measure(trials, poll)
    targets = {
        "failover (fault -> the other instance holds the lease) within 30 s at the defaults, every trial":
            r["max_s"] <= 30.0,
        "no restart repeated: exactly one restart through every fault": r["restarts"] == 1,
        "the incident kept through every fault (still warming)": r["incident_open"] == "warming",
    }
    lines = [
        "## 7. Failover: remediators on PostgreSQL",
        "",
        f"Two `llm-health remediator` processes (1 worker each, poll_interval {poll:g} s: a {r['ttl_s']:g} s lease "
        f"renewed every {r['renew_s']:g} s) on one throw-away PostgreSQL; one backend restarted once, whose warm-up "
        "never ends (a repeated restart would show); then the leader killed (`kill -9`, started again) or frozen "
        "(SIGSTOP until the other leads) in turn, the alert delivered again each trial. Takeover: from the fault to "
        "the other instance's /healthz saying `holds_lease` (polled every 50 ms).",
        "",
        f"Takeover p50 **{r['p50_s']:.2f} s**, max **{r['max_s']:.2f} s** over {len(r['trials'])} trials; restarts "
        f"run: **{r['restarts']}** (epoch {', '.join(r['epochs'])}); the incident at the end: {r['incident_open']}.",
        "",
        "| trial | fault | takeover (s) |",
        "|---:|---|---:|",
        *[f"| {t['trial']} | {t['fault']} | {t['takeover_s']:.2f} |" for t in r["trials"]],
        "",
        "Expected: the lease's remaining time (up to its length) plus up to one renewal interval. Faults at random "
        "points of restarts under way: section 7b; the webhook storm on PostgreSQL: section 3b.",
        "",
        "Targets:",
        *[f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in targets.items()],
        "",
    ]
    return "\n".join(lines), {**r, "targets": targets, "quick": quick}
