"""Benchmark "faults": kill -9, SIGSTOP and PostgreSQL restarts at random moments while restarts are under
way, on two remediators sharing one PostgreSQL (docs/ha.md). Counted: double restarts (must be 0) and lost
incidents (must be 0).

Two real `llm-health remediator` processes (gunicorn, 1 worker each, poll_interval 0.2 s: the shortest
lease, 5 s) on a throw-away PostgreSQL. Every backend is verified `down` (nothing listens), restarted by an
action that appends "<backend> <epoch>" to a file as it starts and then takes ACTION_SECONDS, and its
warm-up never ends (after `warmup_timeout` the incident needs a person: no repeat). Each trial alerts
PER_TRIAL new backends, waits a random time (0 to SPREAD seconds: the fault lands in a verification, a
claim, an action or a warm-up, of these incidents or earlier ones) and then, in turn:

* `kill -9` of the leader's process group (started again, as systemd would);
* SIGSTOP of the leader until the other instance holds the lease, then SIGCONT (it must not act on what it
  had in hand when it froze);
* PostgreSQL stopped (fast: every connection cut) and started again.

Alertmanager is modelled as an HA pair would behave: each notification goes to both remediators and is
retried (every 0.5 s) to one that did not answer 2xx, until it does. At the end, every backend alerted must
have been restarted exactly once, or be held for a person with its outcome unknown (a fault between the
recorded intent and the action: never a blind repeat); a double restart shows in the action's file, a lost
incident as a backend alerted, accepted, and neither restarted nor held.
"""

from __future__ import annotations

import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from llm_health.drill.ha import Member, leaders, one_leader, restart_alert, restarts
from llm_health.drill.postgres import PostgresServer, bin_dir, postgres_server
from llm_health.drill.procs import WaitTimeout, free_port, wait_until

TOKEN = "bench-faults-token"
POLL = 0.2                 # remediator.poll_interval: the lease is max(5 s, 10 x poll)
ACTION_SECONDS = 1.0       # the restart action's run time
WARMUP_SECONDS = 4.0       # remediator.warmup_timeout: then the incident needs a person
SPREAD = 3.0               # a fault lands 0..SPREAD s after its trial's alerts
PER_TRIAL = 2
KINDS = ("kill -9", "SIGSTOP", "store restart")
ACTION = ("import os, sys, time\nwith open(sys.argv[1], 'a') as f:\n"
          "    f.write(f\"{os.environ['LLM_HEALTH_BACKEND']} {os.environ['LLM_HEALTH_EPOCH']}\\n\")\n"
          "time.sleep(float(sys.argv[2]))\n")
SETTLED = {"needs_ack", "observed", "closed"}


class Alertmanagers:
    """Each notification to every member, retried to a member until it answers 2xx (what an HA pair of
    Alertmanagers does with a webhook receiver that failed): a thread per member (a frozen one delays no
    other), a 2 s deadline per post."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.pending: list[list[str]] = [[] for _ in members]     # per member: backends not yet accepted
        self.accepted: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(members))]
        for t in self._threads:
            t.start()

    def send(self, backend: str) -> None:
        with self._lock:
            self.accepted.setdefault(backend, set())
            for todo in self.pending:
                todo.append(backend)

    def idle(self) -> bool:
        with self._lock:
            return not any(self.pending)

    def _post(self, backend: str, i: int) -> bool:
        m = self.members[i]
        try:
            r = requests.post(m.url + "/webhook", json=restart_alert(backend), headers=m.headers, timeout=2)
            return 200 <= r.status_code < 300
        except requests.RequestException:
            return False

    def _run(self, i: int) -> None:
        while not self._stop.is_set():
            with self._lock:
                todo = list(self.pending[i])
            failed = False
            for backend in todo:
                if self._stop.is_set():
                    return
                if self._post(backend, i):
                    with self._lock:
                        self.pending[i].remove(backend)
                        self.accepted[backend].add(i)
                else:
                    failed = True
                    break                                   # retried in 0.5 s, in order
            self._stop.wait(0.5 if failed else 0.05)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)


def incident_states(members: list[Member]) -> dict[str, str | None] | None:
    """backend -> its incident's state (None: no active incident), from whichever member answers."""
    for m in members:
        try:
            rows = requests.get(m.url + "/api/backends", headers=m.headers, timeout=3).json()["backends"]
            return {b["backend"]: (b.get("incident") or {}).get("state") for b in rows}
        except (requests.RequestException, ValueError, KeyError, TypeError):
            continue
    return None


def fault(kind: str, members: list[Member], pg: PostgresServer, ttl: float) -> float | None:
    """Apply one fault to the current leader (or the store); seconds until exactly one member leads again
    (None: the other did not take over from a frozen leader within 3 leases; the run goes on once one leads)."""
    now = one_leader(members, 3 * ttl, "a leader before the fault")
    other = next(m for m in members if m is not now)
    t0 = time.monotonic()
    took: float | None = 0.0
    if kind == "kill -9":
        now.proc.kill9()
        now.proc = now.start()
    elif kind == "SIGSTOP":
        now.signal(signal.SIGSTOP)
        try:
            wait_until(other.leads, timeout=3 * ttl, interval=0.05, what="the other takes over")
        except WaitTimeout:
            took = None
        finally:
            now.signal(signal.SIGCONT)
    else:
        pg.stop("fast")
        pg.start()
    one_leader(members, 20 * ttl, f"one leader after {kind}")
    return None if took is None else time.monotonic() - t0


def measure(trials: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    names = [f"gpu-{i:03d}" for i in range(trials * PER_TRIAL)]
    with postgres_server(bin_dir()) as pg, tempfile.TemporaryDirectory(prefix="llmh-faults-") as tmp:
        folder = Path(tmp)
        actions = folder / "actions.txt"
        (folder / "restart.py").write_text(ACTION)
        config = {                                    # nothing listens: every backend is verified down
            "backends": [{"name": n, "url": f"http://127.0.0.1:{free_port()}", "host": f"node-{n}",
                          "restart": [sys.executable, str(folder / "restart.py"), str(actions),
                                      str(ACTION_SECONDS)]} for n in names],
            "remediator": {"state": pg.new_database(), "token_file": "token", "poll_interval": POLL,
                           "verify_readings": 2, "verify_interval": 0.25, "warmup_timeout": WARMUP_SECONDS,
                           "drain_timeout": 0, "exporter_url": "none",
                           "backoff": {"initial": 0, "factor": 2, "cap": 0, "stable_after": 3600},
                           "budget": {"restarts": 100000, "window": 3600},
                           "breaker": {"restarts": 100000, "window": 3600}},
        }
        ttl = max(5.0, 10 * POLL)
        members: list[Member] = []
        rows: list[dict[str, Any]] = []
        am: Alertmanagers | None = None
        try:
            for name in ("remediator-1", "remediator-2"):
                members.append(Member(folder / name, config, TOKEN))
            one_leader(members, 60)
            am = Alertmanagers(members)
            for n in range(trials):
                batch = names[n * PER_TRIAL:(n + 1) * PER_TRIAL]
                for b in batch:
                    am.send(b)
                time.sleep(rng.uniform(0, SPREAD))     # the fault's random moment
                kind = KINDS[n % len(KINDS)]
                states = incident_states(members) or {}
                hit = Counter(s for s in states.values() if s is not None and s not in SETTLED)
                took = fault(kind, members, pg, ttl)
                rows.append({"trial": n + 1, "fault": kind, "recovered_s": None if took is None else round(took, 2),
                             "hit": dict(hit)})

            final: dict[str, str | None] | None

            def settled() -> dict[str, str | None] | None:
                if am is None or not am.idle():
                    return None
                states = incident_states(members)
                if states is None or any(states.get(b) not in SETTLED | {None} for b in names):
                    return None
                return states
            try:
                final = wait_until(settled, timeout=WARMUP_SECONDS + 6 * ttl + 60, interval=0.5,
                                   what="every incident restarted or held for a person")
            except WaitTimeout:
                final = incident_states(members)
            leading = len(leaders(members))
        finally:
            if am is not None:
                am.stop()
            for m in members:
                m.stop()
        runs = Counter(line.split()[0] for line in restarts(actions))
        accepted = {b for b, by in (am.accepted.items() if am else ()) if by}
    double = sorted(b for b, k in runs.items() if k > 1)
    held = sorted(b for b in names if runs[b] == 0 and final is not None and final.get(b) == "needs_ack")
    lost = sorted(b for b in accepted if runs[b] == 0 and b not in held)
    unsettled = sorted(b for b in names if final is None or final.get(b) not in SETTLED | {None})
    hits: Counter[str] = Counter()
    for r in rows:
        hits.update(r["hit"])
    per_kind = {k: [r["recovered_s"] for r in rows if r["fault"] == k and r["recovered_s"] is not None] for k in KINDS}
    no_takeover = sum(1 for r in rows if r["recovered_s"] is None)
    return {
        "trials": rows, "faults": len(rows), "backends": len(names), "accepted": len(accepted), "seed": seed,
        "ttl_s": ttl, "poll_interval_s": POLL, "action_s": ACTION_SECONDS, "warmup_s": WARMUP_SECONDS,
        "restarted_once": sum(1 for b in names if runs[b] == 1), "double_restarts": len(double), "double": double,
        "held_outcome_unknown": len(held), "lost_incidents": len(lost), "lost": lost, "unsettled": unsettled,
        "states_hit": dict(hits), "leaders_at_end": leading, "no_takeover": no_takeover,
        "recovered": {k: {"n": len(v), "p50_s": statistics.median(v), "max_s": max(v)} for k, v in per_kind.items() if v},
    }


def run(out_dir: Path, quick: bool) -> tuple[str, dict[str, Any]]:
    want = 3 if quick else 201
    r = measure(want, seed=1)
    targets = {
        "no double restart": r["double_restarts"] == 0,
        "no lost incident: every accepted alert restarted once or held for a person": r["lost_incidents"] == 0,
        f"{want} faults injected (at least 200 in the full run)": r["faults"] >= want,
        "exactly one leader at the end": r["leaders_at_end"] == 1,
        "after every fault one instance leads again (a frozen leader taken over within 3 leases)": r["no_takeover"] == 0,
        "every incident settled (restarted and held after its warm-up, or held)": not r["unsettled"],
    }
    rec = r["recovered"]
    lines = [
        "## 7b. Fault injection: remediators on PostgreSQL",
        "",
        f"Two `llm-health remediator` processes (poll_interval {r['poll_interval_s']:g} s: a {r['ttl_s']:g} s lease) "
        f"on one throw-away PostgreSQL. {r['faults']} trials; each alerts {PER_TRIAL} new backends (verified down; "
        f"an action of {r['action_s']:g} s that records each start; a warm-up that never ends, held for a person "
        f"after {r['warmup_s']:g} s), waits 0-{SPREAD:g} s at random and injects, in turn, `kill -9` of the "
        "leader (started again), SIGSTOP of the leader until the other leads (then SIGCONT), or a PostgreSQL "
        "stop and start. Each notification goes to both remediators, retried to one that did not answer 2xx.",
        "",
        f"**{r['double_restarts']} double restarts, {r['lost_incidents']} lost incidents** over {r['faults']} faults "
        f"and {r['backends']} incidents: {r['restarted_once']} restarted exactly once, {r['held_outcome_unknown']} "
        "held for a person with the outcome unknown (the fault fell between the recorded intent and the action's "
        "start: never repeated blindly).",
        "",
        "Incidents under way at the moment of a fault, by step (summed over the faults): "
        + (", ".join(f"{k} {v}" for k, v in sorted(r["states_hit"].items())) or "none") + ".",
        "",
        "| fault | trials | one leader again after p50 (s) | max (s) |",
        "|---|---:|---:|---:|",
        *[f"| {k} | {v['n']} | {v['p50_s']:.2f} | {v['max_s']:.2f} |" for k, v in rec.items()],
        "",
        "Targets:",
        *[f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in targets.items()],
        "",
    ]
    return "\n".join(lines), {**r, "targets": targets, "quick": quick}
