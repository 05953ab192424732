"""Benchmark 3: the remediator under an alert storm.

A real `llm-health remediator` under gunicorn (`--workers 4`, dry_run false) receives notifications
from two sender processes posing as an Alertmanager HA pair: both send the same seeded stream (HA
copies, in their own order inside a burst), in bursts, over keep-alive connections, 4 concurrent
requests each (`http.client`, nearer to Alertmanager's light Go client than `requests`, which these
senders used before: the same remediator's p50 on SQLite went 12 -> 8 ms, the p99 stayed; the senders'
own CPU per notification is reported). The stream covers 50 backends:

* `stalled-*` (10): `bench.pageserver` serves them a moving page until the fleet is READY (a backend
  seen for the first time passes the warm-up gate), then a frozen one (work in flight, counters still):
  verification says `no_progress`, a restart is due; the restart action "fixes" it (the page moves
  again) so the warm-up sees a healthy server and the incident closes; later copies of the same
  alerts must not restart it again;
* `down-*` (10): URLs on closed ports: verification says `down`, a restart is due; they never come
  back (the incident stays in warm-up, later alerts are absorbed);
* `healthy-*` (30): pages whose counters move: alerts about them fire and resolve in episodes
  (a flapping rule); verification says `progress`: never restart.

The same storm runs twice: the state in SQLite (the embedded default), then on a throw-away PostgreSQL
(section 3b; skipped when its server programs are not installed).

The restart action is a tiny script that appends `backend incident action` to a file (and POSTs
`/fix/<backend>` to the page server for the stalled ones). Figures: webhook throughput, p50/p99
response time seen by the senders, and restarts per incident from that file.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import multiprocessing as mp
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
import yaml

from llm_health.drill.postgres import bin_dir, postgres_server
from llm_health.drill.procs import ManagedProcess, free_port, llm_health, python_module, wait_until

TOKEN = "bench-storm-token"
P99_GOAL_MS = 50.0
P99_GOAL = f"webhook p99 under {P99_GOAL_MS:g} ms (issue 24's goal for both stores)"
REPEATS = 3          # storms per store: the p99 goal must hold in each
EARLY_S = 3.0        # the storm's first seconds, reported apart (_split_p99)
UNSETTLED = ("open", "draining", "restarting")   # incident states in which the authority still has work
SETTLE_TIMEOUT = 300.0
RECORDER = """import os, socket, sys
calls, fix = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
line = f"{os.environ.get('LLM_HEALTH_BACKEND')} {os.environ.get('LLM_HEALTH_INCIDENT')} {os.environ.get('LLM_HEALTH_ACTION')}\\n"
fd = os.open(calls, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
if fix:     # POST http://host:port/path, HTTP/1.0 on a raw socket: urllib's imports cost 50 ms of CPU per restart
    host, _, path = fix.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    with socket.create_connection((name, int(port)), timeout=5) as s:
        s.sendall(f"POST /{path} HTTP/1.0\\r\\nHost: {host}\\r\\nContent-Length: 0\\r\\n\\r\\n".encode())
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    if not answer.startswith((b"HTTP/1.0 2", b"HTTP/1.1 2")):
        sys.exit(f"POST {fix}: {answer[:100]!r}")
"""
#: the recorder's interpreter without site-packages or the user's environment: 20 ms of CPU per restart, not 75
RECORDER_PYTHON = [sys.executable, "-I", "-S"]


def _alert(backend: str, alertname: str, status: str, starts: str) -> dict[str, Any]:
    labels = {"alertname": alertname, "backend": backend, "severity": "critical", "remediation": "restart",
              "job": "llm-health-exporter"}
    return {
        "status": status, "labels": labels,
        "annotations": {"summary": f"{alertname} on {backend}"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else starts.replace(":00Z", ":30Z"),
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": hashlib.sha256(f"{backend}/{alertname}".encode()).hexdigest()[:16],
    }


def _payload(backend: str, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return {"receiver": "llm-health-remediator", "status": status, "alerts": alerts,
            "groupLabels": {"backend": backend}, "commonLabels": {"backend": backend},
            "commonAnnotations": {}, "externalURL": "http://alertmanager-0:9093", "version": "4",
            "groupKey": '{}/{remediation="restart"}:{backend="' + backend + '"}', "truncatedAlerts": 0}


def stream(seed: int, per_sender: int, stalled: list[str], down: list[str], healthy: list[str]) -> list[dict]:
    """One sender's notifications: bursts of groups; due backends fire all along (repeats, and the
    Down alert joining the Stalled one); healthy ones fire and resolve in episodes."""
    rng = random.Random(seed)
    episode = dict.fromkeys(healthy, 0)
    firing = dict.fromkeys(healthy, False)
    out: list[dict] = []
    everyone = stalled + down + healthy
    while len(out) < per_sender:
        for b in rng.sample(everyone, k=len(everyone) // 2):
            if b in episode:
                if firing[b] and rng.random() < 0.25:
                    firing[b] = False
                    starts = f"2026-11-30T{episode[b] // 60:02d}:{episode[b] % 60:02d}:00Z"
                    out.append(_payload(b, [_alert(b, "LLMBackendStalled", "resolved", starts)]))
                    episode[b] += 1
                    continue
                firing[b] = True
                starts = f"2026-11-30T{episode[b] // 60:02d}:{episode[b] % 60:02d}:00Z"
                out.append(_payload(b, [_alert(b, "LLMBackendStalled", "firing", starts)]))
            else:
                alerts = [_alert(b, "LLMBackendStalled" if b in stalled else "LLMBackendDown", "firing",
                                 "2026-11-30T00:00:00Z")]
                if rng.random() < 0.3:    # the other alert joins the group
                    alerts.append(_alert(b, "LLMBackendDown" if b in stalled else "LLMBackendStalled", "firing",
                                         "2026-11-30T00:01:00Z"))
                out.append(_payload(b, alerts))
    return out[:per_sender]


def _send(args: tuple[str, list[dict], str, int, int, int]) -> dict[str, Any]:
    """One Alertmanager replica: bursts of `burst` notifications, `threads` in parallel, keep-alive."""
    url, bodies, external, burst, threads, seed = args
    rng = random.Random(seed)
    target = urllib.parse.urlsplit(url)
    local = threading.local()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def post(body: dict) -> tuple[float, int, float]:
        data = json.dumps({**body, "externalURL": external}).encode()
        at = time.time()
        t0 = time.perf_counter()
        try:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            conn.request("POST", target.path, body=data, headers=headers)
            answer = conn.getresponse()
            answer.read()
            code = answer.status
        except (OSError, http.client.HTTPException):
            local.conn = None
            code = 0
        return time.perf_counter() - t0, code, at

    latencies: list[float] = []
    sent_at: list[float] = []
    codes: Counter[int] = Counter()
    busy = 0.0
    started = time.perf_counter()
    cpu = os.times()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for i in range(0, len(bodies), burst):
            chunk = bodies[i:i + burst]
            order = list(range(len(chunk)))
            for j in range(0, len(order) - 1, 2):           # replicas differ a little in order
                if rng.random() < 0.5:
                    order[j], order[j + 1] = order[j + 1], order[j]
            t0 = time.perf_counter()
            for lat, code, at in pool.map(post, [chunk[k] for k in order]):
                latencies.append(lat)
                sent_at.append(at)
                codes[code] += 1
            busy += time.perf_counter() - t0
            time.sleep(0.2)                                  # the gap between bursts
    done = os.times()
    return {"latencies": latencies, "sent_at": sent_at, "codes": dict(codes), "busy": busy,
            "wall": time.perf_counter() - started, "cpu_s": done.user + done.system - cpu.user - cpu.system}


def _config(tmp: Path, page_port: int, stalled: list[str], down: list[str], healthy: list[str],
            workers: int, state: str) -> Path:
    (tmp / "token").write_text(TOKEN)
    (tmp / "record.py").write_text(RECORDER)
    calls = str(tmp / "calls.txt")
    backends = []
    for b in stalled:
        backends.append({"name": b, "url": f"http://127.0.0.1:{page_port}/s/{b}",
                         "restart": [*RECORDER_PYTHON, str(tmp / "record.py"), calls,
                                     f"http://127.0.0.1:{page_port}/fix/{b}"]})
    for b in down:
        backends.append({"name": b, "url": f"http://127.0.0.1:{free_port()}",
                         "restart": [*RECORDER_PYTHON, str(tmp / "record.py"), calls]})
    for b in healthy:
        backends.append({"name": b, "url": f"http://127.0.0.1:{page_port}/b/{b}",
                         "restart": [*RECORDER_PYTHON, str(tmp / "record.py"), calls]})
    cfg = {
        "backends": backends,
        "exporter": {"read_timeout": 1.0, "probe_timeout": 2.0},
        "remediator": {
            "state": state, "token_file": "token", "dry_run": False, "workers": workers,
            "dedup_window": 300, "verify_readings": 2, "verify_interval": 0.2, "poll_interval": 0.1,
            "warmup_poll": 0.5, "warmup_timeout": 3600, "action_timeout": 30,
            "drain_timeout": 5, "stalled_drain_timeout": 1,
            # 20 backends are due at once: above the default fleet breaker (5 restarts/h), which would
            # (rightly) stop after 5. Raised here so the benchmark measures "exactly one per incident".
            "breaker": {"restarts": 100, "window": 3600},
        },
    }
    path = tmp / "llm-health.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _split_p99(senders: list[dict[str, Any]], seconds: float) -> tuple[float, float]:
    """The p99 (ms) of the notifications sent in the storm's first `seconds`, and of the rest (0.0: none):
    where the tail comes from. At the start every due backend's first alert arrives together, and the
    authority verifies and claims their restarts while the webhooks queue for the same write lock."""
    sent = [(at, lat) for s in senders for at, lat in zip(s["sent_at"], s["latencies"], strict=True)]
    if not sent:
        return 0.0, 0.0
    start = min(at for at, _ in sent)
    early = [lat for at, lat in sent if at - start < seconds]
    late = [lat for at, lat in sent if at - start >= seconds]
    return (_percentile(early, 0.99) * 1000 if early else 0.0, _percentile(late, 0.99) * 1000 if late else 0.0)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(out_dir: Path, quick: bool) -> tuple[str, dict[str, Any]]:
    """The storm with the state in SQLite (the embedded default), then the same storm on PostgreSQL (when
    its server programs are installed); each REPEATS times, a fresh state and remediator each time."""
    repeats = 1 if quick else REPEATS
    text, results = repeated([measure(out_dir, quick, None) for _ in range(repeats)])
    if bin_dir() is None:
        return text, results
    with postgres_server(bin_dir()) as pg:
        pg_text, pg_results = repeated([measure(out_dir, quick, pg.new_database()) for _ in range(repeats)])
    results["postgresql"] = pg_results
    results["targets"].update({f"PostgreSQL: {k}": v for k, v in pg_results["targets"].items()})
    return text + "\n" + pg_text, results


def repeated(runs: list[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    """The last run's report, figures and plot, with the p99 of every run beside it: the latency goal is
    met only when every run meets it (one run's p99 on a shared 2-core machine moves by 10 ms and more)."""
    text, results = runs[-1]
    p99s = [r["p99_ms"] for _, r in runs]
    met = all(p < P99_GOAL_MS for p in p99s)
    results["p99_ms_runs"] = p99s
    results["targets"][P99_GOAL] = met
    text = re.sub(f"- (PASS|FAIL): {re.escape(P99_GOAL)}", f"- {'PASS' if met else 'FAIL'}: {P99_GOAL}, in every run",
                  text)
    if len(runs) > 1:
        text = text.replace("Targets:\n", f"The same storm {len(runs)} times (a fresh state and remediator each "
                            "time; the figures above are the last run's): p99 "
                            + " / ".join(f"{p:.1f}" for p in p99s) + " ms, p50 "
                            + " / ".join(f"{r['p50_ms']:.1f}" for _, r in runs) + " ms, throughput "
                            + " / ".join(f"{r['throughput_per_s_in_bursts']:.0f}" for _, r in runs)
                            + " notifications/s.\n\nTargets:\n", 1)
        for _, r in runs[:-1]:
            for k, v in r["targets"].items():
                if k != P99_GOAL:
                    results["targets"][k] = results["targets"][k] and v
    return text, results


def measure(out_dir: Path, quick: bool, state: str | None) -> tuple[str, dict[str, Any]]:
    """One storm; `state` a PostgreSQL URL, None: SQLite (a file in the run's folder)."""
    n_stalled, n_down, n_healthy = (2, 2, 6) if quick else (10, 10, 30)
    total = 400 if quick else 10_000
    workers = 4
    stalled = [f"stalled-{i:02d}" for i in range(n_stalled)]
    down = [f"down-{i:02d}" for i in range(n_down)]
    healthy = [f"healthy-{i:02d}" for i in range(n_healthy)]
    bodies = stream(8, total // 2, stalled, down, healthy)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        page_port, port = free_port(), free_port()
        # the stalled ones serve until the whole fleet is READY (the warm-up gate), then stall (POST /stall)
        pages = ManagedProcess(python_module("bench.pageserver", "--port", page_port, "--variants", 128,
                                             "--every", 2, "--simple", "--moving"), "pageserver", tmp)
        rem = None
        try:
            pages.wait_http(f"http://127.0.0.1:{page_port}/b/ready/health", timeout=60)
            config = _config(tmp, page_port, stalled, down, healthy, workers, state or "state.db")
            rem = ManagedProcess(llm_health("remediator", "--config", config, "--listen", f"127.0.0.1:{port}",
                                            "--workers", workers), "remediator", tmp,
                                 cwd=Path(__file__).resolve().parent.parent)
            base = f"http://127.0.0.1:{port}"
            rem.wait_http(f"{base}/healthz", timeout=30)

            def serving() -> bool:       # the down ones (closed ports) never answer: never READY
                view = requests.get(f"{base}/api/backends", timeout=10).json()["backends"]
                return all(b["lifecycle"]["state"] == "ready" for b in view if not b["backend"].startswith("down-"))
            wait_until(serving, timeout=120, interval=0.2, what="the serving backends READY")
            for b in stalled:
                requests.post(f"http://127.0.0.1:{page_port}/stall/{b}", timeout=5).raise_for_status()
            started = time.perf_counter()
            ctx = mp.get_context("spawn")
            with ctx.Pool(2) as pool:
                senders = pool.map(_send, [(f"{base}/webhook", bodies, f"http://alertmanager-{i}:9093",
                                            50 if quick else 500, 4, i) for i in range(2)])
            storm_wall = time.perf_counter() - started

            def settled() -> list[dict[str, Any]] | None:
                view = requests.get(f"{base}/api/backends", timeout=10).json()["backends"]
                restarted = _restarted(tmp / "calls.txt")
                return None if [b for b in view if _pending(b, restarted)] else view

            stuck: list[dict[str, Any]] = []
            try:
                view = wait_until(settled, timeout=60.0 if quick else SETTLE_TIMEOUT, interval=0.5,
                                  what="the authority to work through the storm")
            except AssertionError:
                view = requests.get(f"{base}/api/backends", timeout=10).json()["backends"]
                restarted = _restarted(tmp / "calls.txt")
                stuck = [{"backend": b["backend"], "incident": b["incident"], "last_decision": b["last_decision"]}
                         for b in view if _pending(b, restarted)]
                print(json.dumps(stuck, indent=1)[:6000], file=sys.stderr)
                print(rem.log()[-4000:], file=sys.stderr)
            settle_wall = time.perf_counter() - started
            events = all_events(base, limit=10000)
            opened_events = all_events(base, kind="incident_opened")
            calls = (tmp / "calls.txt").read_text().splitlines() if (tmp / "calls.txt").exists() else []
            metrics = requests.get(f"{base}/metrics", timeout=10).text
        finally:
            if rem is not None:
                rem.stop()
            pages.stop()
    image = "storm.png" if state is None else "storm-postgresql.png"
    plot(senders, out_dir / "img" / image)
    return _report(senders, storm_wall, settle_wall, view, events, opened_events, calls, metrics, stalled, down,
                   healthy, total, workers, quick, stuck, state is not None, image)


def _restarted(calls: Path) -> set[str]:
    """The backends the restart recorder was called for so far."""
    return {ln.split()[0] for ln in calls.read_text().splitlines() if ln.strip()} if calls.exists() else set()


def _held_by_backoff(b: dict[str, Any], restarted: set[str]) -> bool:
    """An incident opened after its backend's restart (a notification variant first seen after the recovery:
    the alert it restarted for is still firing) waits out the backoff by design, then verifies."""
    return bool(b["incident"]) and b["incident"]["state"] == "open" and b["backend"] in restarted and \
        (b["last_decision"] or {}).get("kind") == "deferred_backoff"


def _pending(b: dict[str, Any], restarted: set[str]) -> bool:
    """The authority still has work on this backend's incident now (not only later, when a backoff ends)."""
    return bool(b["incident"]) and b["incident"]["state"] in UNSETTLED and not _held_by_backoff(b, restarted)


def all_events(base: str, kind: str = "", limit: int = 1_000_000) -> list[dict[str, Any]]:
    """The audit log, newest first, page by page (GET /api/events answers at most retention.page_size)."""
    out: list[dict[str, Any]] = []
    before: int | None = None
    while len(out) < limit:
        params: dict[str, Any] = {"limit": 10000, "kind": kind, **({"before": before} if before else {})}
        doc = requests.get(f"{base}/api/events", params=params, timeout=30).json()
        out += doc["events"]
        before = doc["next_before"]
        if before is None:
            break
    return out[:limit]


def plot(senders: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(min(s["sent_at"]) for s in senders)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [2, 1]})
    for i, s in enumerate(senders):
        a.scatter([t - t0 for t in s["sent_at"]], [x * 1000 for x in s["latencies"]], s=2, alpha=0.5,
                  label=f"alertmanager-{i}")
    a.set_yscale("log")
    a.set_xlabel("seconds into the storm")
    a.set_ylabel("webhook response time (ms)")
    a.set_title("Every notification's response time, both senders", fontsize=10)
    a.legend(markerscale=4, fontsize=8)
    a.grid(alpha=0.3)
    all_ms = sorted(x * 1000 for s in senders for x in s["latencies"])
    b.plot(all_ms, [i / len(all_ms) for i in range(len(all_ms))])
    b.set_xscale("log")
    b.set_xlabel("response time (ms)")
    b.set_ylabel("fraction of notifications")
    b.set_title("Cumulative distribution", fontsize=10)
    b.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _report(senders: list[dict[str, Any]], storm_wall: float, settle_wall: float, view: list[dict[str, Any]],
            events: list[dict[str, Any]], opened_events: list[dict[str, Any]], calls: list[str], metrics: str, stalled: list[str], down: list[str],
            healthy: list[str], total: int, workers: int, quick: bool,
            stuck: list[dict[str, Any]], postgresql: bool = False, image: str = "storm.png") -> tuple[str, dict[str, Any]]:
    latencies = [x for s in senders for x in s["latencies"]]
    codes: Counter[str] = Counter()
    for s in senders:
        codes.update({str(k): v for k, v in s["codes"].items()})
    busy = max(s["busy"] for s in senders)
    restarts = Counter(ln.split()[0] for ln in calls)
    per_incident = Counter((ln.split()[0], ln.split()[1]) for ln in calls)
    kinds = Counter(e["kind"] for e in events)
    decisions = {ln.split('decision="', 1)[1].split('"', 1)[0]: float(ln.rsplit(" ", 1)[1])
                 for ln in metrics.splitlines() if ln.startswith("llm_health_remediator_decisions_total{")}
    opened = Counter(e["backend"] for e in opened_events)
    due = stalled + down
    p99_ms = _percentile(latencies, 0.99) * 1000
    early_ms, late_ms = _split_p99(senders, EARLY_S)
    targets = {
        "every notification answered 2xx": set(codes) <= {"200", "202"},
        "exactly 1 restart for each backend where one is due": all(restarts[b] == 1 for b in due),
        "0 restarts of healthy backends": all(restarts[b] == 0 for b in healthy),
        "no incident restarted twice": all(n == 1 for n in per_incident.values()),
        f"the authority worked through every incident within {SETTLE_TIMEOUT:g} s": not stuck,
        P99_GOAL: p99_ms < P99_GOAL_MS,
    }
    results = {
        "notifications": len(latencies), "codes": dict(codes),
        "throughput_per_s_in_bursts": len(latencies) / busy, "throughput_per_s_overall": len(latencies) / storm_wall,
        "p50_ms": _percentile(latencies, 0.5) * 1000, "p99_ms": p99_ms,
        "max_ms": max(latencies) * 1000, "mean_ms": statistics.mean(latencies) * 1000,
        "p99_first_seconds_ms": early_ms, "p99_after_ms": late_ms,
        "sender_cpu_ms": sum(s.get("cpu_s", 0.0) for s in senders) / max(1, len(latencies)) * 1000,
        "storm_wall_s": storm_wall, "settled_after_s": settle_wall,
        "restarts": dict(restarts), "incidents_opened": dict(opened), "events": dict(kinds),
        "decisions": decisions,
        "targets": targets, "quick": quick, "stuck": stuck,
        "final_states": Counter((b["incident"] or {}).get("state", "none") for b in view),
        "held_by_backoff": sorted(b["backend"] for b in view if _held_by_backoff(b, set(restarts))),
    }
    def group(names: list[str]) -> str:
        n_inc = sum(opened[b] for b in names)
        n_res = sum(restarts[b] for b in names)
        per = Counter(restarts[b] for b in names)
        return (f"{len(names)} | {n_inc} | {n_res} | "
                + ", ".join(f"{k} restart(s): {v} backends" for k, v in sorted(per.items())))

    lines = [
        "### 3b. The same storm, the state on PostgreSQL" if postgresql else "## 3. Remediator under an alert storm",
        "",
        *(["`remediator.state` a database of a throw-away PostgreSQL on this machine (Debian's server, "
           "fsync off as in the tests), everything else as above.", ""] if postgresql else []),
        f"{len(latencies)} webhook notifications ({total // 2} per sender, two sender processes posing as an "
        "Alertmanager HA pair, each 4 requests in parallel, bursts of "
        f"{50 if quick else 500} with a 0.2 s gap) about {len(stalled) + len(down) + len(healthy)} backends, into "
        f"`llm-health remediator --workers {workers}` (gunicorn, gthread, dry_run false) on this machine, "
        "with the senders, the page server and the remediator sharing its cores.",
        "",
        "| webhook | |",
        "|---|---:|",
        f"| throughput while sending (both senders) | **{results['throughput_per_s_in_bursts']:.0f} notifications/s** |",
        f"| throughput over the whole storm, gaps included | {results['throughput_per_s_overall']:.0f} /s |",
        f"| response time p50 / p99 / max | **{results['p50_ms']:.1f} ms / {results['p99_ms']:.1f} ms** / "
        f"{results['max_ms']:.0f} ms |",
        f"| p99 in the first {EARLY_S:g} s (the due backends' restarts begin) / after | {early_ms:.1f} ms / "
        f"{late_ms:.1f} ms |",
        f"| answers | {', '.join(f'HTTP {k}: {v}' for k, v in sorted(codes.items()))} |",
        f"| storm sent in / authority done after | {storm_wall:.1f} s / {settle_wall:.1f} s |",
        f"| the senders' own CPU per notification (http.client, keep-alive) | {results['sender_cpu_ms']:.2f} ms |",
        "",
        f"![storm](img/{image})",
        "",
        *(["(Every notification is one write transaction under the cluster's write lock (an advisory lock), so "
           "the answers queue for it: BEGIN, the lock and the state id's check are one round trip, and the "
           "transaction's blind writes travel with its next read or its COMMIT (remediator/store/postgresql/"
           "conn.py BatchedDb): 2 round trips for an HA copy, 5 for a notification that opens an incident, "
           "about 8 and 13 before. Where the tail comes from, measured on 2026-12-07 by timing every write "
           "transaction: the storm's first seconds, when every due backend's first alert arrives together and "
           "the authority verifies and claims 20 restarts at once. A claim's transaction re-reads the incident "
           "and every gate under the lock, 16 to 18 round trips, and held it 20 to 40 ms; the lock was busy "
           "91-98 % then and the webhooks' p50 rose to 40-116 ms. After that the p99 was 43-46 ms. The lock is "
           "first come, first served, and those claims queued together in front of every webhook: now the "
           "authority's write transactions take turns in their process first (remediator/store/single_writer.py), "
           "so at most one of them is in the lock's queue and a webhook waits for at most one (measured on "
           "2026-12-08, alternating runs: p99 44 and 51 ms with the turn, 68 and 53 ms without; first 3 s: 68-76 "
           "against 93-112 ms). Tried and dropped, measured the same way: recording an HA copy outside the lock "
           "(its p50 fell to 4 ms, but the copies took the CPU the lock's holders needed: p99 84-86 ms against "
           "59-70); reading a batch's keys ahead in one round trip; a lower GIL switch interval.)", ""] if postgresql else [
            "(Every notification is written under SQLite's write lock (`BEGIN IMMEDIATE`), so the workers' "
            "threads queue for it: they take turns in a queue in front of it (first come, first served in a "
            "process, then a `flock()` on `<state>-writer` across processes: remediator/store/sqlite/turn.py) "
            "instead of SQLite's busy handler, whose growing sleeps let newcomers pass a long waiter by: single "
            "waits over 1 s before, with the median at a few milliseconds. The lock, not the CPU, set the pace "
            "(held about 85 % of the storm), so a worker's notifications of one moment share one transaction "
            "(remediator/store/group.py: 10 000 notifications in about 5 000 transactions), and the worker that "
            "holds the authority leaves new connections to the other three (remediator/serving.py: the webhooks "
            "it served had a p99 of 127 ms, 33 ms in the others).)", ""]),
        "| backends | count | incidents opened | restarts (action calls) | restarts per backend |",
        "|---|---:|---:|---:|---|",
        f"| stalled (frozen page; restart due) | {group(stalled)} |",
        f"| down (closed port; restart due) | {group(down)} |",
        f"| healthy (counters moving; alerts flap) | {group(healthy)} |",
        "",
        "Targets:",
        *[f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in targets.items()],
        *([f"- held by the backoff after their restart (a new incident opened by a notification variant first "
            f"seen after the recovery; verified when the backoff ends): {', '.join(results['held_by_backoff'])}"]
          if results["held_by_backoff"] else []),
        *([f"- stuck after {SETTLE_TIMEOUT:g} s: " + "; ".join(
            f"{x['backend']} {x['incident']['state']} ({(x['last_decision'] or {}).get('kind', '')})" for x in stuck)]
          if stuck else []),
        "",
        "Decisions, from the remediator's `/metrics` (`llm_health_remediator_decisions_total`): "
        + (", ".join(f"{k} {v:g}" for k, v in sorted(decisions.items(), key=lambda kv: -kv[1]) if v) or "none")
        + ". Audit events by kind (the last 10,000 of the log): "
        + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])) + ".",
        "",
        "Setup: the stream is seeded; both senders send the same notifications (HA copies: same content, "
        "their own `externalURL`, slightly different order). Due backends fire all along (repeats of the "
        "same alert, sometimes the other restart-worthy alert joining the group); healthy ones fire and "
        "resolve in episodes (new `startsAt` per episode), so each episode is a new incident that "
        "verification must reject. Restart due = verification (the real `exporter.check.verify`, 2 "
        "readings 0.2 s apart) says `no_progress` (frozen page of `bench.pageserver`) or `down` (closed "
        "port). The fleet breaker is raised to 100/h for this run: with the default (5 per hour across the "
        "fleet) the 20 due restarts would stop at 5, by design.",
        "",
    ]
    return "\n".join(lines), results
