"""`llm-health demo`: the whole pipeline on loopback, then a fire drill, narrated as it happens.

The drill is the first end-to-end scenario: backend sim-b runs a long batch with every slot
full (the incident's batch job), while sim-a stalls with requests in flight. What each part
saw and decided is printed: the exporter's verdicts, Prometheus alerts, the remediator's
decisions, the restart and the recovery. Then a summary, and the stack stays up until Ctrl-C
(`--once` exits after the drill).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from llm_health.drill.stack import Stack


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true", help="exit after the drill instead of waiting for Ctrl-C")
    parser.add_argument("--workdir", help="folder for configs, logs and state (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up on the drill after this many seconds")


class Narrator:
    """Polls every part and prints what changed, with the time since the drill began."""

    def __init__(self, stack: Stack, out: Callable[[str], None]) -> None:
        self.stack = stack
        self.out = out
        self.t0 = time.monotonic()
        self.verdicts: dict[str, str] = {}
        self.alerts: set[tuple[str, str, str]] = set()
        self.seen_events: set[Any] = set()

    def say(self, who: str, text: str) -> None:
        self.out(f"[{time.monotonic() - self.t0:6.1f}s] {who:<12} {text}")

    def poll(self) -> None:
        for fn in (self._verdicts, self._alerts, self._events):
            try:
                fn()
            except requests.RequestException as exc:
                self.say("demo", f"(could not read: {exc.__class__.__name__})")

    def _verdicts(self) -> None:
        for name, v in sorted(self.stack.verdicts().items()):
            if self.verdicts.get(name) != v["verdict"]:
                self.verdicts[name] = v["verdict"]
                self.say("exporter", f"{name}: {v['verdict']} — {v.get('reason', '')}")

    def _alerts(self) -> None:
        now: set[tuple[str, str, str]] = set()
        for s in self.stack.query('ALERTS{alertname=~"LLM.*"}'):
            m = s["metric"]
            now.add((m.get("alertname", ""), m.get("backend", m.get("proxy", "")), m.get("alertstate", "")))
        for alert in sorted(now - self.alerts):
            self.say("prometheus", f"{alert[0]} {alert[2]} for {alert[1] or 'fleet'}")
        for alert in sorted(self.alerts - now):
            if not any(a[0] == alert[0] and a[1] == alert[1] for a in now):
                self.say("prometheus", f"{alert[0]} resolved for {alert[1] or 'fleet'}")
        self.alerts = now

    def _events(self) -> None:
        for e in sorted(self.stack.events(limit=200), key=lambda e: (e.get("at", 0), e.get("id", 0))):
            key = e.get("id", (e.get("at"), e.get("kind"), e.get("backend")))
            if key in self.seen_events:
                continue
            self.seen_events.add(key)
            if e.get("kind") in ("deduplicated",):
                continue  # duplicates are counted in the summary, not narrated one by one
            self.say("remediator", f"{e.get('kind')} {e.get('backend') or ''}: {e.get('reason') or ''}".rstrip(": "))


def drill(stack: Stack, out: Callable[[str], None], timeout: float) -> dict[str, Any]:
    """Scenario 1: sim-a stalls while sim-b is saturated by a batch job. Returns the summary."""
    narrator = Narrator(stack, out)
    narrator.say("demo", "batch job fills all 12 slots of sim-b (the incident's batch job)")
    batch = stack.fill_slots("sim-b", 12)
    stack.wait(lambda: stack.verdicts()["sim-b"]["verdict"] == "busy", 20, "sim-b judged busy")
    # probes are counted from the moment the exporter has seen the batch (a probe allowed by an idle
    # reading may still land within one engine step of the batch's first request: the gauges lag a step)
    before = {name: sim.stats() for name, sim in stack.sims.items()}
    narrator.say("demo", "two long requests on sim-a, then sim-a's engine wedges (fault: stall)")
    victims = stack.fill_slots("sim-a", 2)
    stack.wait(lambda: stack.sims["sim-a"].stats()["running"] >= 2, 20, "requests running on sim-a")
    stack.sims["sim-a"].fault("stall")

    def done() -> bool:
        narrator.poll()
        kinds = [e.get("kind") for e in stack.events("sim-a")]
        recovered = "recovered" in kinds
        resolved = not stack.firing("LLMBackendStalled", "sim-a")
        return recovered and resolved and narrator.verdicts.get("sim-a") in ("idle", "busy")

    try:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the drill did not finish in {timeout:.0f}s")
            time.sleep(0.5)
    finally:
        victims.stop()
        batch.stop()
    a, b = stack.sims["sim-a"].stats(), stack.sims["sim-b"].stats()
    events = stack.events()
    restarts = [e for e in events if e.get("kind") == "restarted"]
    return {
        "restarts_of_stalled": sum(1 for e in restarts if e.get("backend") == "sim-a"),
        "restarts_of_busy": sum(1 for e in restarts if e.get("backend") == "sim-b"),
        "sim_a_restarts": a["restarts"],
        "sim_b_restarts": b["restarts"],
        "probes_to_busy": b["probes_while_busy"] - before["sim-b"]["probes_while_busy"],
        "probes_to_sim_b": b["probes"] - before["sim-b"]["probes"],
        "alerts_received": sum(1 for e in events if e.get("kind") == "received"),
        "duplicates": sum(1 for e in events if e.get("kind") == "deduplicated"),
        "seconds": round(time.monotonic() - narrator.t0, 1),
    }


def run(args: argparse.Namespace) -> int:
    out = print if sys.stdout.isatty() else (lambda s: print(s, flush=True))
    tmp = None
    if args.workdir:
        workdir = Path(args.workdir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="llm-health-demo-")
        workdir = Path(tmp.name)
    out(f"llm-health demo: starting the pipeline on loopback (work folder {workdir})")
    try:
        with Stack(workdir, echo=lambda s: out(f"  {s}")) as stack:
            summary = drill(stack, out, args.timeout)
            out("")
            out("summary:")
            out(f"  stalled backend sim-a restarted {summary['restarts_of_stalled']} time(s) by the remediator "
                f"(simulator counted {summary['sim_a_restarts']})")
            out(f"  busy backend sim-b: {summary['restarts_of_busy']} restarts, "
                f"{summary['probes_to_sim_b']} probes sent to it during the drill")
            out(f"  probes that reached sim-b while it was busy (once the exporter had seen its work): "
                f"{summary['probes_to_busy']}")
            out(f"  alert notifications received: {summary['alerts_received']}, "
                f"of them duplicates: {summary['duplicates']}")
            out(f"  drill took {summary['seconds']}s")
            out("")
            out(f"remediator status page: {stack.remediator_url}/")
            out(f"Prometheus:             {stack.prometheus_url}/alerts")
            out(f"exporter verdicts:      {stack.exporter_url}/verdicts")
            ok = (summary["restarts_of_stalled"] == 1 and summary["restarts_of_busy"] == 0
                  and summary["probes_to_busy"] == 0)
            if not ok:
                out("drill FAILED: expected exactly one restart of sim-a, none of sim-b, no probe to a busy server")
                return 1
            if args.once:
                return 0
            out("stack is running; Ctrl-C to stop")
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                out("stopping")
            return 0
    finally:
        if tmp is not None:
            tmp.cleanup()
