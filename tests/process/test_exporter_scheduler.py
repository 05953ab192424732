"""Acceptance (issue 11, exporter): no backend waits for another. Real processes on 127.0.0.1.

A fleet of simulator processes: an idle member, a member whose engine wedges while idle (the page
keeps showing 0 running / 0 waiting with frozen counters, every generation request waits forever),
a busy member that stalls; beside them, bad neighbours: one hung (accepts, answers nothing), one
slow (/metrics answers just under the read timeout), one dead (connection refused). The same
timings must hold with and without the bad neighbours.

Plus the scheduler's own guarantees, in process: backends added and removed at run time, one read
at a time per backend (a read due while the previous one runs is skipped and counted), phases
spread over the interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
import requests

from llm_health.config import Backend, ExporterSettings
from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.exporter.scheduler import ReadScheduler, phase_of
from llm_health.httpserver import QuietHandler

INTERVAL = 1.0
READ_TIMEOUT = 0.8
PROBE_TIMEOUT = 0.8
STALL_AFTER = 3.0
DOWN_AFTER = 2
WEDGE_BOUND = PROBE_TIMEOUT + DOWN_AFTER * INTERVAL + INTERVAL     # the bounds
STALL_BOUND = STALL_AFTER + 2 * INTERVAL
LOAD_SLACK = INTERVAL        # the 2-core machine is shared: one interval of slack on top of each bound


class Sim:
    def __init__(self, launch: Callable[..., ManagedProcess], name: str) -> None:
        port, control = free_port(), free_port()
        self.proc = launch(llm_health("sim", "--port", port, "--control-port", control), name)
        self.url = f"http://127.0.0.1:{port}"
        self.control = f"http://127.0.0.1:{control}"

    def ready(self) -> None:
        self.proc.wait_http(self.control + "/sim/stats")
        self.proc.wait_http(self.url + "/v1/models")

    def fault(self, name: str, seconds: float | None = None) -> None:
        body: dict[str, Any] = {"fault": name}
        if seconds is not None:
            body["seconds"] = seconds
        r = requests.post(self.control + "/sim/fault", json=body, timeout=5)
        assert r.status_code == 200, r.text

    def probes(self) -> int:
        return int(requests.get(self.control + "/sim/stats", timeout=5).json()["probes"])


def load(url: str, n: int) -> None:
    """`n` long completions (plain clients, not probes); they end when the simulator stops."""
    def one() -> None:
        try:
            requests.post(url + "/v1/completions", json={"model": "sim-model", "prompt": "work " * 20,
                                                         "max_tokens": 4000}, timeout=120)
        except requests.RequestException:
            pass

    for _ in range(n):
        threading.Thread(target=one, daemon=True).start()


def run_fleet(launch: Callable[..., ManagedProcess], neighbours: bool) -> dict[str, float]:
    sims = {name: Sim(launch, name) for name in ("idle", "wedge", "stall")}
    if neighbours:
        sims["hung"] = Sim(launch, "hung")
        sims["slow"] = Sim(launch, "slow")
    for s in sims.values():
        s.ready()
    load(sims["stall"].url, 2)
    urls = {name: s.url for name, s in sims.items()}
    if neighbours:
        sims["hung"].fault("hang")
        sims["slow"].fault("slow_metrics", 0.85 * READ_TIMEOUT)
        urls["dead"] = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    argv = ["exporter", "--listen", f"127.0.0.1:{port}", "--interval", INTERVAL, "--read-timeout", READ_TIMEOUT,
            "--probe-timeout", PROBE_TIMEOUT, "--stall-after", STALL_AFTER, "--down-after", DOWN_AFTER,
            "--probe-every", 0]
    for name, url in urls.items():
        argv += ["--backend", f"{name}={url}"]
    exporter = launch(llm_health(*argv), "exporter")
    base = f"http://127.0.0.1:{port}"
    exporter.wait_http(base + "/health")

    def backends() -> dict[str, dict[str, Any]]:
        return {b["backend"]: b for b in requests.get(base + "/verdicts", timeout=5).json()["backends"]}

    def settled() -> bool:
        b = backends()
        good = ("probe answered" in b["idle"]["reason"] and "probe answered" in b["wedge"]["reason"]
                and b["stall"]["verdict"] == "busy")
        if neighbours:
            good = good and b["hung"]["verdict"] == "down" and b["dead"]["verdict"] == "down" and \
                "probe answered" in b["slow"]["reason"]
        return good

    wait_until(settled, timeout=30, interval=0.1, what="fleet settled")
    before = backends()
    t1, sent1, seen1 = time.monotonic(), before["idle"]["probes_sent"], sims["idle"].probes()
    sims["wedge"].fault("wedge")
    wedged_at = time.monotonic()
    sims["stall"].fault("stall")
    stalled_at = time.monotonic()
    found: dict[str, float] = {}

    def judged() -> bool:
        b = backends()
        now = time.monotonic()
        if "wedge" not in found and b["wedge"]["verdict"] == "down":
            found["wedge"] = now - wedged_at
        if "stall" not in found and b["stall"]["verdict"] == "stalled":
            found["stall"] = now - stalled_at
        assert b["idle"]["verdict"] == "idle", b["idle"]
        return len(found) == 2 and now - t1 >= 6 * INTERVAL

    wait_until(judged, timeout=STALL_BOUND + 20, interval=0.05, what="wedge down and stall stalled")
    after = backends()
    t2 = time.monotonic()
    intervals = (t2 - t1) / INTERVAL
    found["idle_probes_per_interval"] = (after["idle"]["probes_sent"] - sent1) / intervals
    found["idle_probes_seen"] = sims["idle"].probes() - seen1
    found["idle_probes_sent"] = after["idle"]["probes_sent"] - sent1
    found["intervals"] = intervals
    found["idle_skipped"] = after["idle"]["readings_skipped"]
    return found


def test_no_backend_waits_for_another(launch) -> None:
    alone = run_fleet(launch, neighbours=False)
    crowd = run_fleet(launch, neighbours=True)
    for label, r in (("alone", alone), ("with hung/slow/dead neighbours", crowd)):
        # the idle member is probed every interval: one probe per interval, give or take the window's ends
        assert r["idle_probes_sent"] >= int(r["intervals"]) - 1, (label, r)
        assert r["idle_probes_per_interval"] <= 1.0 + 1.5 / r["intervals"], (label, r)
        assert r["idle_probes_seen"] >= r["idle_probes_sent"] - 1, (label, r)   # sent means sent
        assert r["idle_skipped"] == 0, (label, r)
        assert r["wedge"] <= WEDGE_BOUND + LOAD_SLACK, (label, r)
        assert r["stall"] <= STALL_BOUND + LOAD_SLACK, (label, r)
    # the neighbours change nothing: same timings within one interval (each is on a phase of its own)
    assert abs(crowd["wedge"] - alone["wedge"]) <= INTERVAL + 0.5, (alone, crowd)
    assert abs(crowd["stall"] - alone["stall"]) <= INTERVAL + 0.5, (alone, crowd)


# ------------------------------------------------------------------------------------ the scheduler


class Pages(ThreadingHTTPServer):
    """Idle vLLM-like pages on /<name>/metrics; `/hang/...` never answers until released."""

    daemon_threads = True

    def __init__(self) -> None:
        from llm_health.simulator.engine import Engine
        from llm_health.simulator.metrics import Flavour, render

        self.page = render([Engine(index=0)], Flavour()).encode()
        busy = Engine(index=0)
        busy.submit(100, 10_000)
        busy.advance_to(1.0)
        self.frozen = render([busy], Flavour()).encode()   # work in flight, counters that never move
        self.reads: dict[str, list[float]] = {}
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(QuietHandler):
    protocol_version = "HTTP/1.1"
    server: Pages

    def do_GET(self) -> None:  # noqa: N802
        name = self.path.split("/")[1]
        if self.path.endswith("/metrics"):
            self.server.reads.setdefault(name, []).append(time.monotonic())
        if name == "hang":
            self.server.release.wait(30)
            self.close_connection = True
            return
        page = self.server.frozen if name == "frozen" else self.server.page
        body = page if self.path.endswith("/metrics") else b"{}"
        self.reply(200, body)

    def do_POST(self) -> None:  # noqa: N802
        body = b'{"choices": [{"text": "x"}]}'
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply(200, body)


@pytest.fixture
def pages() -> Any:
    srv = Pages()
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def running(fleet: ReadScheduler) -> Callable[[], None]:
    stop = threading.Event()
    t = threading.Thread(target=fleet.run_forever, args=(stop,), daemon=True)
    t.start()

    def end() -> None:
        stop.set()
        t.join(5)
        fleet.close()

    return end


def verdicts(fleet: ReadScheduler) -> dict[str, Any]:
    return {b.name: b for b in fleet.snapshot().backends}


def test_backends_are_added_and_removed_at_run_time(pages) -> None:
    settings = ExporterSettings(interval=0.3, read_timeout=0.5, probe_timeout=1.0)
    fleet = ReadScheduler([Backend(name="a", url=pages.url + "/a")], [], settings)
    stop = running(fleet)
    try:
        wait_until(lambda: verdicts(fleet)["a"].verdict.value == "idle", timeout=10, what="a idle")
        fleet.add_backend(Backend(name="b", url=pages.url + "/b"))
        wait_until(lambda: "b" in verdicts(fleet) and verdicts(fleet)["b"].verdict.value == "idle", timeout=10,
                   what="b added and idle")
        kept = verdicts(fleet)["b"].readings["ok"]
        fleet.set_backends([Backend(name="b", url=pages.url + "/b", host="h2"),
                            Backend(name="c", url=pages.url + "/c")])
        assert set(verdicts(fleet)) == {"b", "c"}
        assert verdicts(fleet)["b"].readings["ok"] >= kept > 0          # same name and URL: state kept
        removed_at = time.monotonic()
        wait_until(lambda: verdicts(fleet)["c"].verdict.value == "idle", timeout=10, what="c idle")
        wait_until(lambda: len([t for t in pages.reads["b"] if t > removed_at]) >= 3, timeout=10,
                   what="b still read")
        # a is no longer read (one read may have been in flight when it was removed)
        assert len([t for t in pages.reads["a"] if t > removed_at + 0.1]) == 0
        fleet.remove_backend("b")
        assert set(verdicts(fleet)) == {"c"}
        # a backend that changes its URL starts afresh
        fleet.set_backends([Backend(name="c", url=pages.url + "/c2")])
        wait_until(lambda: "c2" in pages.reads, timeout=10, what="c read at its new URL")
    finally:
        stop()


def test_a_hung_read_is_never_doubled_and_the_skip_is_counted(pages) -> None:
    # the read timeout is longer than the interval, so the next read is due while the hung one runs
    settings = ExporterSettings(interval=0.3, read_timeout=1.0, probe_timeout=1.0)
    fleet = ReadScheduler([Backend(name="hang", url=pages.url + "/hang"), Backend(name="ok", url=pages.url + "/ok")],
                  [], settings)
    stop = running(fleet)
    try:
        wait_until(lambda: verdicts(fleet)["hang"].reads_skipped >= 4, timeout=10, what="skipped reads")
        hung = pages.reads["hang"]
        # never two reads at once: each new read started after the previous timed out (read_timeout)
        assert all(b - a >= 0.9 for a, b in zip(hung, hung[1:], strict=False)), hung
        ok = pages.reads["ok"]
        gaps = [b - a for a, b in zip(ok, ok[1:], strict=False)]
        assert gaps and max(gaps) < 0.3 * 1.8, gaps      # the healthy one keeps its cadence
        assert verdicts(fleet)["ok"].reads_skipped == 0
        assert verdicts(fleet)["ok"].probes_sent >= len(gaps) - 1
    finally:
        pages.release.set()
        stop()


def test_phases_spread_a_fleet_over_the_interval() -> None:
    phases = sorted(phase_of(f"gpu-{i}", 15.0) for i in range(1000))
    assert 0 <= phases[0] and phases[-1] < 15.0
    buckets = [0] * 15
    for p in phases:
        buckets[int(p)] += 1
    assert min(buckets) > 40 and max(buckets) < 100, buckets   # ~67 per second of the interval
    assert phase_of("gpu-1", 15.0) == phase_of("gpu-1", 15.0)


def test_a_wall_clock_step_moves_no_stall_clock(pages) -> None:
    """Schedules and the stall clock run on the monotonic clock; the wall clock only labels exported times."""
    step = [0.0]
    settings = ExporterSettings(interval=0.2, read_timeout=0.5, probe_timeout=1.0, stall_after=2.0)
    fleet = ReadScheduler([Backend(name="frozen", url=pages.url + "/frozen"), Backend(name="a", url=pages.url + "/a",
                                                                            model="m")],
                  [], settings, clock=lambda: time.time() + step[0])
    stop = running(fleet)
    try:
        wait_until(lambda: verdicts(fleet)["frozen"].readings["ok"] >= 2, timeout=10, what="two readings")
        since = verdicts(fleet)["frozen"].since
        slot = next(s for s in fleet.backends if s.backend.name == "frozen")
        stuck = min(t.stuck_since for t in slot.state.engines.values() if t.stuck_since is not None)
        assert time.monotonic() - stuck < 2.0 - 0.5, "the jump must come well before the stall is due"
        step[0] = 3600.0                     # the wall clock jumps an hour ahead
        wait_until(lambda: verdicts(fleet)["frozen"].verdict.value == "stalled", timeout=10, what="stalled")
        # stalled after stall_after of real (monotonic) time since the counters froze, not at the jump
        assert time.monotonic() >= stuck + 2.0
        assert verdicts(fleet)["a"].verdict.value == "idle"
        # exported times follow the new wall clock
        assert verdicts(fleet)["frozen"].since > since + 3000
        assert abs(fleet.snapshot().at - (time.time() + 3600)) < 5
    finally:
        stop()
