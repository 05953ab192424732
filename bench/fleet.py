"""Benchmark 5: fleet under trouble (exporter). Do bad members change the good members' cadence?

One `llm-health exporter` process (its shipped defaults, only `listen` set) watches 200 backends
served by one in-process HTTP server in this process (a distinct URL path per backend; the refused
ones point at a bound socket that never listens, so the connection is refused):

* healthy idle (25 %): a 0 running / 0 waiting page; the probe (`POST /v1/completions`) answers at once;
* healthy busy (25 %): a page whose counters rise with time (engine progressing);
* hang (10 %): the connection is accepted and nothing is ever answered;
* slow (10 %): `/metrics` answers a busy, progressing page just under the read timeout (90 % of it);
* drip (10 %): every answer (`/metrics`, `/health`) comes one header byte per second, each member on a
  port of its own (`llm_health.drill.hostile.DripServer`): a wedged buffering proxy or a half-dead host, which
  a per-read timeout never ends;
* refuse (5 %): connection refused;
* wedge (5 %): idle, probes answer until the fault time; then the page stays 0/0 with frozen counters
  and every probe waits forever (an engine wedged while idle: only the probe can catch it);
* stall (5 %): busy and progressing until the fault time; then the same page forever (work in flight,
  counters frozen).

The server notes when each backend's `/metrics` and probes arrive (the backend's own view of the
exporter's cadence); a poller reads `/verdicts` every 0.5 s to see when each wedged / stalled member is
judged `down` / `stalled`. Loopback only; the run lasts until every faulty member is judged or the
bound (`stall_after` + 4 intervals after the fault) passes.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from bench.pages import FLAVOUR, page_variants
from llm_health.config import ExporterSettings
from llm_health.drill.hostile import DripServer
from llm_health.drill.procs import ManagedProcess, free_port, llm_health
from llm_health.httpserver import QuietHandler
from llm_health.simulator.engine import Engine
from llm_health.simulator.metrics import format_families, process_families, vllm_families

KINDS = (("idle", 0.25), ("busy", 0.25), ("hang", 0.10), ("slow", 0.10), ("drip", 0.10), ("refuse", 0.05),
         ("wedge", 0.05), ("stall", 0.05))
ANSWER = b'{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x"}]}'
MODELS = b'{"object": "list", "data": [{"id": "sim-model", "object": "model"}]}'
BEFORE = Path(__file__).resolve().parent / "results" / "fleet-before.json"   # the same run on the old code
PAGE_EVERY = 1.0   # seconds of wall time between two busy page variants


@dataclass
class Member:
    name: str
    kind: str
    reads: list[float] = field(default_factory=list)      # monotonic arrival of each GET /metrics
    probes: list[float] = field(default_factory=list)     # monotonic arrival of each probe
    frozen: int | None = None                              # busy page index at the stall


class World:
    """What every backend shows, by kind and time; the fault time is `faults_at` (monotonic)."""

    def __init__(self, members: dict[str, Member], slow: float, run_seconds: float) -> None:
        self.members = members
        self.slow = slow
        self.t0 = time.monotonic()
        self.faults_at = float("inf")
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.idle = idle_page().encode()
        self.busy = [p.encode() for p in page_variants(int(run_seconds / PAGE_EVERY) + 30, full=False,
                                                        every=PAGE_EVERY)]

    def busy_index(self, now: float) -> int:
        return min(int((now - self.t0) / PAGE_EVERY), len(self.busy) - 1)

    def faulted(self, now: float) -> bool:
        return now >= self.faults_at

    def hang(self) -> None:
        self.stop.wait(120)


def idle_page() -> str:
    engines = [Engine(index=i, step_seconds=0.1, max_num_seqs=64, kv_blocks=65_536) for i in range(2)]
    start = 1_764_400_000.0
    return format_families(process_families(start) + vllm_families(engines, FLAVOUR, start), False)


class Handler(QuietHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def _member(self) -> tuple[Member | None, str]:
        parts = self.path.split("/", 3)   # "", "f", "<name>", "rest"
        if len(parts) < 4 or parts[1] != "f":
            return None, ""
        return self.server.world.members.get(parts[2]), "/" + parts[3]

    def do_GET(self) -> None:  # noqa: N802
        world: World = self.server.world
        m, rest = self._member()
        if m is None:
            self.reply(404, b"{}", "application/json")
            return
        now = time.monotonic()
        if m.kind == "hang":
            world.hang()
            self.close_connection = True
            return
        if rest == "/metrics":
            with world.lock:
                m.reads.append(now)
            if m.kind == "slow":
                time.sleep(world.slow)
            if m.kind in ("idle", "wedge"):
                body = world.idle
            else:
                k = world.busy_index(now)
                if m.kind == "stall" and world.faulted(now):
                    with world.lock:
                        m.frozen = k if m.frozen is None else m.frozen
                    k = m.frozen
                body = world.busy[k]
            self.reply(200, body, "text/plain; version=0.0.4; charset=utf-8")
        elif rest == "/health":
            self.reply(200, b"", "application/json")
        elif rest == "/v1/models":
            self.reply(200, MODELS, "application/json")
        else:
            self.reply(404, b"{}", "application/json")

    def do_POST(self) -> None:  # noqa: N802
        world: World = self.server.world
        m, rest = self._member()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if m is None or rest != "/v1/completions":
            self.reply(404, b"{}", "application/json")
            return
        now = time.monotonic()
        with world.lock:
            m.probes.append(now)
        if m.kind == "hang" or (m.kind == "wedge" and world.faulted(now)):
            world.hang()
            self.close_connection = True
            return
        self.reply(200, ANSWER, "application/json")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def fleet_of(size: int) -> list[Member]:
    members: list[Member] = []
    for kind, share in KINDS[2:]:
        members += [Member(f"{kind}-{i}", kind) for i in range(max(1, round(size * share)))]
    healthy = size - len(members)
    members += [Member(f"idle-{i}", "idle") for i in range(healthy // 2)]
    members += [Member(f"busy-{i}", "busy") for i in range(healthy - healthy // 2)]
    return members


def gaps(times: list[float], since: float) -> list[float]:
    ts = [t for t in times if t >= since]
    return [b - a for a, b in zip(ts, ts[1:], strict=False)]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def measure(size: int, settings: ExporterSettings, warm: float, quick: bool) -> dict[str, Any]:
    i, pt, rt = settings.interval, settings.probe_timeout, settings.read_timeout
    wedge_bound = pt + settings.down_after * i + i
    stall_bound = settings.stall_after + 2 * i
    run_cap = warm + max(wedge_bound, stall_bound) + 2 * i
    members = {m.name: m for m in fleet_of(size)}
    world = World(members, slow=0.9 * rt, run_seconds=run_cap + 30)
    httpd = Server(("127.0.0.1", 0), Handler)
    httpd.world = world  # type: ignore[attr-defined]
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    import socket

    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))          # bound, never listening: connections are refused
    dead_port = dead.getsockname()[1]
    dripping = [m.name for m in members.values() if m.kind == "drip"]
    drip = DripServer(ports=max(1, len(dripping)), mode="headers", every=1.0, max_seconds=run_cap + 60)
    drip_url = dict(zip(dripping, drip.urls, strict=False))
    listen = free_port()
    detected: dict[str, float | None] = {n: None for n, m in members.items() if m.kind in ("wedge", "stall")}
    seen_before: dict[str, set[str]] = {}       # every verdict seen before the fault (a late read: "unknown")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "llm-health.yml"
        lines = ["backends:"]
        for m in members.values():
            url = (f"http://127.0.0.1:{dead_port}/f/{m.name}" if m.kind == "refuse"
                   else drip_url[m.name] if m.kind == "drip" else f"http://127.0.0.1:{port}/f/{m.name}")
            lines += [f"  - name: {m.name}", f"    url: {url}", "    model: sim-model"]
        lines += ["exporter:"] + [f"  {k}: {v}" for k, v in (
            ("interval", i), ("read_timeout", rt), ("probe_timeout", pt), ("stall_after", settings.stall_after),
            ("down_after", settings.down_after), ("probe_every", settings.probe_every))]
        cfg.write_text("\n".join(lines) + "\n")
        proc = ManagedProcess(llm_health("exporter", "--config", cfg, "--listen", f"127.0.0.1:{listen}"),
                              "exporter", tmp)
        base = f"http://127.0.0.1:{listen}"
        try:
            proc.wait_http(base + "/health", timeout=60)
            started = time.monotonic()
            world.faults_at = started + warm
            while True:
                now = time.monotonic()
                try:
                    doc = requests.get(base + "/verdicts", timeout=5).json()
                except requests.RequestException:
                    doc = {"backends": []}
                seen = time.monotonic()
                for b in doc["backends"]:
                    name = b["backend"]
                    if name not in detected:
                        continue
                    want = "down" if members[name].kind == "wedge" else "stalled"
                    if seen < world.faults_at:
                        seen_before.setdefault(name, set()).add(b["verdict"])
                    elif detected[name] is None and b["verdict"] == want:
                        detected[name] = seen - world.faults_at
                if all(v is not None for v in detected.values()) and now > world.faults_at + 2 * i:
                    break
                if now - started > run_cap:
                    break
                time.sleep(0.5)
            ended = time.monotonic()
            exporter_metrics = requests.get(base + "/metrics", timeout=5).text
        finally:
            proc.stop()
            world.stop.set()
            httpd.shutdown()
            httpd.server_close()
            dead.close()
            drip.stop()
    since = started + 2 * i   # after the first readings (connections opened, phases settled)

    def cadence(kind: str, what: str) -> dict[str, float]:
        g: list[float] = []
        for m in members.values():
            if m.kind == kind:
                g += gaps(getattr(m, what), since)
        return {"gaps": len(g), "p50": pct(g, 0.5) / i, "p99": pct(g, 0.99) / i, "max": max(g, default=0) / i}

    intervals = (ended - since) / i
    idle = [m for m in members.values() if m.kind == "idle"]
    probes_per_interval = [len([t for t in m.probes if t >= since]) / intervals for m in idle]
    return {
        "backends": size, "by_kind": {k: sum(1 for m in members.values() if m.kind == k) for k, _ in KINDS},
        "settings": {"interval": i, "read_timeout": rt, "probe_timeout": pt, "stall_after": settings.stall_after,
                     "down_after": settings.down_after, "probe_every": settings.probe_every},
        "slow_answer_s": world.slow, "warm_s": warm, "observed_s": ended - since,
        "reads": {k: cadence(k, "reads") for k in ("idle", "busy", "slow")},
        "probes": cadence("idle", "probes"),
        "probes_per_interval": {"min": min(probes_per_interval, default=0.0),
                                "median": statistics.median(probes_per_interval) if idle else 0.0},
        "wedge_bound_s": wedge_bound, "stall_bound_s": stall_bound,
        "detected": {n: detected[n] for n in sorted(detected)},
        "verdicts_before_fault": {n: sorted(v) for n, v in sorted(seen_before.items())},
        "cycle_series": "llm_health_cycle_duration_seconds" in exporter_metrics,
        "quick": quick,
    }


SHORT = ExporterSettings(interval=1.0, read_timeout=0.5, probe_timeout=0.5, stall_after=3.0)


def targets(r: dict[str, Any]) -> dict[str, bool]:
    wedge = [v for n, v in r["detected"].items() if n.startswith("wedge")]
    stall = [v for n, v in r["detected"].items() if n.startswith("stall")]
    i = r["settings"]["interval"]
    return {
        f"every wedged member down within {r['wedge_bound_s']:g} s ({i:g} s interval)": all(
            v is not None and v <= r["wedge_bound_s"] for v in wedge),
        f"every stalled member stalled within {r['stall_bound_s']:g} s ({i:g} s interval)": all(
            v is not None and v <= r["stall_bound_s"] for v in stall),
        f"healthy members read every interval (p99 gap <= 1.2 intervals; {i:g} s interval)": all(
            r["reads"][k]["p99"] <= 1.2 for k in ("idle", "busy")),
        f"idle members probed every interval (p99 gap <= 1.2 intervals; {i:g} s interval)": r["probes"]["p99"] <= 1.2,
    }


def run(out_dir: Path, quick: bool) -> tuple[str, dict[str, Any]]:
    if quick:
        r = measure(20, SHORT, warm=4.0, quick=True)
        r["targets"] = targets(r)
    else:
        r = measure(200, ExporterSettings(), warm=45.0, quick=False)
        r["short"] = measure(200, SHORT, warm=5.0, quick=False)     # the same fleet on a 1 s interval
        r["targets"] = {**targets(r), **targets(r["short"])}
    if not quick and BEFORE.exists():
        r["before"] = json.loads(BEFORE.read_text())
    return markdown(r), r


def _fmt(v: float | None) -> str:
    return "not detected" if v is None else f"{v:.0f} s"


def markdown(r: dict[str, Any]) -> str:
    s = r["settings"]
    rows = ["| members | gaps | p50 gap / interval | p99 gap / interval | max gap / interval |",
            "|---|---:|---:|---:|---:|"]
    for label, c in (("healthy idle: readings", r["reads"]["idle"]), ("healthy busy: readings", r["reads"]["busy"]),
                     ("slow (answer at 90 % of the read timeout): readings", r["reads"]["slow"]),
                     ("healthy idle: probes", r["probes"])):
        rows.append(f"| {label} | {c['gaps']} | {c['p50']:.2f} | {c['p99']:.2f} | {c['max']:.2f} |")
    wedge = {n: v for n, v in r["detected"].items() if n.startswith("wedge")}
    stall = {n: v for n, v in r["detected"].items() if n.startswith("stall")}

    def summary(d: dict[str, float | None]) -> str:
        found = [v for v in d.values() if v is not None]
        text = f"{len(found)} of {len(d)} detected"
        if found:
            text += f", median {statistics.median(found):.0f} s, max {max(found):.0f} s"
        return text + " (each: " + ", ".join(_fmt(v) for v in d.values()) + ")"

    kinds = ", ".join(f"{n} {k}" for k, n in r["by_kind"].items())
    return "\n".join([
        "## 5. Fleet under trouble: exporter",
        "",
        f"One `llm-health exporter` process at its defaults (interval {s['interval']:g} s, read timeout "
        f"{s['read_timeout']:g} s, probe timeout {s['probe_timeout']:g} s, stall after {s['stall_after']:g} s, "
        f"down after {s['down_after']}, probe every {s['probe_every']:g} s) watches {r['backends']} backends "
        f"served by one in-process HTTP server, the dripping ones by a dripping server with a port each "
        f"({kinds}). See `bench/fleet.py` for what each kind does. "
        f"Wedge and stall start {r['warm_s']:g} s after the exporter; cadence is measured by the backends "
        f"(arrival of each `/metrics` request and each probe) over the last {r['observed_s']:.0f} s.",
        "",
        *rows,
        "",
        f"Idle probes per healthy idle member per interval: median {r['probes_per_interval']['median']:.2f}, "
        f"min {r['probes_per_interval']['min']:.2f} (1.00 = every interval).",
        "",
        f"- Wedged while idle (judged `down`; bound probe timeout + down_after intervals + one interval = "
        f"{r['wedge_bound_s']:g} s): {summary(wedge)}.",
        f"- Stalled while busy (judged `stalled`; bound stall_after + 2 intervals = {r['stall_bound_s']:g} s): "
        f"{summary(stall)}.",
        "",
        *side_by_side(r),
        "The remediator half of this benchmark (time from alert to restart for 20 simultaneous incidents) is "
        "section 4, `bench/fleet_remediator.py`.",
        "",
    ])


def side_by_side(r: dict[str, Any]) -> list[str]:
    """The same benchmark on the code before issue 11 (one fleet-wide cycle) and now."""
    b = r.get("before")
    if not b:
        return []

    def det(d: dict[str, Any], kind: str) -> str:
        v = [x for n, x in d["detected"].items() if n.startswith(kind)]
        found = [x for x in v if x is not None]
        if not found:
            return f"0 of {len(v)} detected"
        digits = 1 if d["settings"]["interval"] < 5 else 0
        return (f"{len(found)} of {len(v)}; median {statistics.median(found):.{digits}f} s, "
                f"max {max(found):.{digits}f} s")

    rows = [
        ("healthy idle readings: p50 / p99 gap (intervals)", lambda d: f"{d['reads']['idle']['p50']:.2f} / "
         f"{d['reads']['idle']['p99']:.2f}"),
        ("healthy busy readings: p50 / p99 gap (intervals)", lambda d: f"{d['reads']['busy']['p50']:.2f} / "
         f"{d['reads']['busy']['p99']:.2f}"),
        ("healthy idle probes: p50 / p99 / max gap (intervals)", lambda d: f"{d['probes']['p50']:.2f} / "
         f"{d['probes']['p99']:.2f} / {d['probes']['max']:.2f}"),
        ("probes per idle member per interval: median / min", lambda d: f"{d['probes_per_interval']['median']:.2f}"
         f" / {d['probes_per_interval']['min']:.2f}"),
        (f"wedged idle -> down (bound {r['wedge_bound_s']:g} s)", lambda d: det(d, "wedge")),
        (f"stalled busy -> stalled (bound {r['stall_bound_s']:g} s)", lambda d: det(d, "stall")),
    ]
    when = b.get("machine", {}).get("date", "?")
    lines = [
        f"Before and after, same machine: before = {b.get('code', 'the code before issue 11')}, "
        f"measured {when}, on a fleet without the dripping members (200 backends, 60 % healthy); after = "
        "the per-backend scheduler with its deadline client and read lanes, measured above with 20 dripping "
        "members among the 200. Slow members (answers at 90 % of the read timeout) now wait in the suspect lane "
        "with the hung ones, whose host:port they share here: their gap p50 above 1.",
        "",
        "| defaults (15 s interval) | before (one fleet-wide cycle) | after (every backend on its own clock) |",
        "|---|---|---|",
        *[f"| {label} | {fn(b)} | {fn(r)} |" for label, fn in rows],
        "",
    ]
    lines += [
        "Note: at 200 backends the old cycle mostly kept probing, because its healthy readings completed late "
        "enough in the cycle to still count as fresh when it judged them after the hung reads' socket timeout; "
        "it lost probes only at the edge (the 2-interval gaps above). With a few backends the same race starves "
        "the probe: `tests/test_exporter_fleet.py` (1 s interval, 0.8 s read timeout, one hung, one slow and "
        "one dead neighbour) run once on main's exporter (2026-12-01) saw 3 probes of the idle member in 6 "
        "intervals and the wedge caught after 5.9 s (bound 3.8 s; 2.0 s without the neighbours); the new "
        "scheduler passes it with 6 of 6 and 2.3 s.",
        "",
    ]
    if "short" in b and "short" in r:
        sb, sr = b["short"], r["short"]
        st = sr["settings"]
        short_rows = rows[:4] + [
            (f"wedged idle -> down (bound {sr['wedge_bound_s']:g} s)", lambda d: det(d, "wedge")),
            (f"stalled busy -> stalled (bound {sr['stall_bound_s']:g} s)", lambda d: det(d, "stall")),
        ]
        lines += [
            f"The same fleet on a short interval ({st['interval']:g} s, read timeout {st['read_timeout']:g} s, "
            f"probe timeout {st['probe_timeout']:g} s, stall after {st['stall_after']:g} s; faults "
            f"{sr['warm_s']:g} s after the start), where the old fleet-wide cycle's wait for the slowest read "
            "is a large part of the interval:",
            "",
            f"| {st['interval']:g} s interval | before | after |",
            "|---|---|---|",
            *[f"| {label} | {fn(sb)} | {fn(sr)} |" for label, fn in short_rows],
            "",
        ]
    return lines
