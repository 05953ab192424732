"""Acceptance: a real `llm-health remediator` under gunicorn (4 workers), real simulators on loopback,
the real exporter.check.verify, and a restart action that records its calls and then restarts the
simulator through `python -m llm_health.simulator.ctl restart`.

With nothing but incident dedup (no backoff, a large budget) a storm still gives one restart per
incident, and a hung server (accepts connections, never answers) is restarted exactly once, only
after `unresponsive_after`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.simulator.server import SimConfig, Simulator
from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.paths import REPO

TOKEN = "process-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

RECORDER = '''
import os, subprocess, sys, time
calls, delay, ctl = sys.argv[1], float(sys.argv[2]), sys.argv[3]
with open(calls, "a") as f:
    f.write(f"{os.getpid()} {os.environ.get('LLM_HEALTH_BACKEND')} {os.environ.get('LLM_HEALTH_INCIDENT')}\\n")
time.sleep(delay)
sys.exit(subprocess.call([sys.executable, "-m", "llm_health.simulator.ctl", "restart", ctl],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
'''


@dataclass
class Rig:
    url: str
    proc: ManagedProcess
    sims: dict[str, Simulator]
    calls: Path
    config: Path

    def calls_for(self, backend: str) -> list[str]:
        if not self.calls.exists():
            return []
        return [ln for ln in self.calls.read_text().splitlines() if ln.split()[1] == backend]

    def events(self, backend: str = "", kind: str = "") -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/api/events", params={"backend": backend, "kind": kind, "limit": 1000},
                         timeout=5)
        r.raise_for_status()
        return list(r.json()["events"])

    def wait_event(self, backend: str, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            ev = self.events(backend, kind)
            return ev[0] if ev else None
        try:
            return wait_until(found, timeout=timeout, interval=0.1, what=f"{kind} event for {backend}")
        except AssertionError:
            print(self.proc.log()[-4000:])
            print(self.events()[:40])
            raise

    def post(self, body: Any, headers: dict[str, str] | None = None, **kw: Any) -> requests.Response:
        return requests.post(f"{self.url}/webhook", json=body, headers=AUTH if headers is None else headers,
                             timeout=10, **kw)


def start_sim() -> Simulator:
    sim = Simulator(SimConfig(port=free_port(), control_port=free_port(), restart_seconds=0.3)).start()
    wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="simulator up")
    return sim


def write_config(tmp: Path, sims: dict[str, Simulator], delays: dict[str, float]) -> Path:
    (tmp / "token").write_text(TOKEN)
    (tmp / "record.py").write_text(RECORDER)
    backends = [
        {"name": name, "url": sim.url,
         "restart": [sys.executable, str(tmp / "record.py"), str(tmp / "calls.txt"), str(delays.get(name, 0)),
                     sim.control_url]}
        for name, sim in sims.items()
    ]
    cfg = {
        "backends": backends,
        "exporter": {"read_timeout": 1.0, "probe_timeout": 2.0},
        "remediator": {
            "state": "state.db", "token_file": "token", "busy_dir": "busy", "dedup_window": 30,
            "verify_readings": 2, "verify_interval": 0.2, "poll_interval": 0.1, "warmup_poll": 0.2,
            "warmup_timeout": 20, "action_timeout": 20, "max_body_bytes": 65536,
            "backoff": {"initial": 60, "factor": 2, "cap": 600, "stable_after": 3600},
        },
    }
    path = tmp / "llm-health.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_remediator(tmp: Path, config: Path, port: int, name: str) -> ManagedProcess:
    proc = ManagedProcess(llm_health("remediator", "--config", config, "--listen", f"127.0.0.1:{port}",
                                     "--workers", 4), name=name, log_dir=tmp, cwd=REPO)
    proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
    return proc


def kill_recorded(calls: Path) -> None:
    """Stop any restart action still running (they run in their own session)."""
    if not calls.exists():
        return
    for line in calls.read_text().splitlines():
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError, PermissionError):
            pass


@contextmanager
def running_rig(tmp: Path, names: tuple[str, ...], name: str,
                tweak: Callable[[dict[str, Any]], None] | None = None) -> Iterator[Rig]:
    """Simulators, a config (changed by `tweak` if given) and a real remediator under gunicorn;
    everything is stopped afterwards, restart actions still running included, also on failure."""
    sims: dict[str, Simulator] = {}
    proc = None
    try:
        for sim_name in names:
            sims[sim_name] = start_sim()
        config = write_config(tmp, sims, {})
        if tweak is not None:
            cfg = yaml.safe_load(config.read_text())
            tweak(cfg)
            config.write_text(yaml.safe_dump(cfg))
        port = free_port()
        proc = start_remediator(tmp, config, port, name)
        url = f"http://127.0.0.1:{port}"
        # a backend seen for the first time passes the warm-up gate before it is READY (and may be drained)
        wait_until(lambda: {b["lifecycle"]["state"] for b in requests.get(url + "/api/backends", timeout=5)
                            .json()["backends"]} == {"ready"}, timeout=60, what="every backend READY")
        yield Rig(url, proc, sims, tmp / "calls.txt", config)
    finally:
        if proc is not None:
            proc.stop()
        kill_recorded(tmp / "calls.txt")
        for sim in sims.values():
            sim.stop()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with running_rig(tmp_path_factory.mktemp("remediator"), ("storm", "healthy", "busy"), "remediator") as r:
        yield r


def fire_at_once(rig: Rig, bodies: list[Any]) -> list[int]:
    """POST every body to the webhook from its own thread, all released together; the status codes."""
    answers: list[int] = []
    barrier = threading.Barrier(len(bodies))

    def fire(body: Any) -> None:
        barrier.wait()
        answers.append(rig.post(body).status_code)

    threads = [threading.Thread(target=fire, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def crash(sim: Simulator) -> None:
    requests.post(sim.control_url + "/sim/fault", json={"fault": "crash"}, timeout=5).raise_for_status()


def test_duplicate_storm_on_four_workers_gives_one_restart(rig: Rig) -> None:
    crash(rig.sims["storm"])
    first = payload(alert("storm"))
    bodies = [first] * 6 + [payload(alert("storm"), external="http://am-1:9093")] * 4 + [
        payload(alert("storm", alertname="LLMBackendDown")),
        payload(alert("storm", alertname="LLMHighErrorRate", restart=False)),
    ]
    assert fire_at_once(rig, bodies) == [202] * len(bodies)
    rig.wait_event("storm", "recovered")
    dedup_before = len(rig.events("", "deduplicated"))
    rig.post(first)                                                 # late resends after recovery:
    rig.post(payload(alert("storm", alertname="LLMBackendDown")))   # both were in the storm already
    wait_until(lambda: len(rig.events("", "deduplicated")) >= dedup_before + 2, timeout=30,
               what="both late resends recorded as duplicates")
    assert len(rig.calls_for("storm")) == 1
    stats = requests.get(rig.sims["storm"].control_url + "/sim/stats", timeout=5).json()
    assert stats["restarts"] == 1
    assert len(rig.events("storm", "restarting")) == 1
    assert len(rig.events("", "deduplicated")) >= 9
    assert len(rig.events("", "lease_acquired")) == 1          # one authority among the 4 workers
    metrics = requests.get(f"{rig.url}/metrics", timeout=5).text
    assert has_sample(metrics, 'llm_health_remediator_restarts_total{backend="storm",result="ok"} 1')


def test_backend_that_recovered_is_not_restarted(rig: Rig) -> None:
    assert rig.post(payload(alert("healthy"))).status_code == 202
    ev = rig.wait_event("healthy", "verified_healthy")
    assert "idle_ok" in ev["reason"]
    assert rig.calls_for("healthy") == []
    assert requests.get(rig.sims["healthy"].control_url + "/sim/stats", timeout=5).json()["restarts"] == 0


def test_busy_marker_defers_until_the_job_ends(rig: Rig, tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = [sys.executable, "-c",
           f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nsys.exit(3)"]
    (tmp_path / "token").write_text(TOKEN)
    busy = ManagedProcess(llm_health("busy", "--backend", "busy", "--ttl", "30", "--remediator", rig.url,
                                     "--token-file", tmp_path / "token", "--owner", "nightly-eval", "--", *job),
                          name="busy", log_dir=tmp_path)
    try:
        wait_until(lambda: any(b["markers"] for b in requests.get(f"{rig.url}/api/backends", timeout=5)
                               .json()["backends"] if b["backend"] == "busy"), what="marker set")
        crash(rig.sims["busy"])
        rig.post(payload(alert("busy")))
        ev = rig.wait_event("busy", "deferred_marker")
        assert "nightly-eval" in ev["reason"]
        assert rig.calls_for("busy") == []
        go.write_text("")
        assert busy.proc.wait(timeout=20) == 3               # the job's exit code
        rig.wait_event("busy", "recovered")
        assert len(rig.calls_for("busy")) == 1
    finally:
        busy.stop()


def test_bad_requests_change_nothing(rig: Rig) -> None:
    before = requests.get(f"{rig.url}/metrics", timeout=5).text
    evil = "x; touch /tmp/pwned-$(id) `reboot` | rm -rf ~"
    assert rig.post(payload(alert("storm")), headers={}).status_code == 401
    assert rig.post(payload(alert("storm")), headers={"Authorization": "Bearer nope"}).status_code == 401
    r = requests.post(f"{rig.url}/webhook", data=b"{oops", headers={**AUTH, "Content-Type": "application/json"},
                      timeout=5)
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    big = requests.post(f"{rig.url}/webhook", data=b"[" + b" " * 100_000 + b"]", headers=AUTH, timeout=5)
    assert big.status_code == 413 and "too large" in big.json()["error"]
    assert requests.post(f"{rig.url}/api/breaker/reset", timeout=5).status_code == 401
    assert requests.post(f"{rig.url}/api/busy", json={"backend": "storm", "owner": "x"}, timeout=5).status_code == 401
    after = requests.get(f"{rig.url}/metrics", timeout=5).text

    def ours(text: str) -> list[str]:   # the state's series; process_*/python_* describe whichever worker answered
        return [ln for ln in text.splitlines() if "llm_health_remediator_" in ln
                and "lease_seconds_left" not in ln]      # the lease's time left moves with the clock

    assert ours(before) == ours(after)
    assert rig.post(payload(alert(evil, job=evil), alert(None, instance=evil))).status_code == 202
    wait_until(lambda: len(rig.events("", "ignored")) == 2, what="both alerts ignored")
    labels = [e["detail"]["labels"] for e in rig.events("", "ignored")]
    assert {lb.get("backend") for lb in labels} == {evil, None}
    assert {lb.get("instance") for lb in labels} == {evil, None}
    assert not list(Path("/tmp").glob("pwned*"))
    names = {ln.split()[1] for ln in rig.calls.read_text().splitlines()} if rig.calls.exists() else set()
    assert names <= {"storm", "busy"}
    page = requests.get(rig.url + "/", timeout=5)
    assert page.status_code == 200 and "llm-health remediator" in page.text


def lease_holder_pid(url: str) -> int:
    """The pid of the gunicorn worker whose authority holds the lease (from its lease_acquired event)."""
    r = requests.get(f"{url}/api/events", params={"kind": "lease_acquired", "limit": 1}, timeout=5)
    holder = r.json()["events"][0]["reason"].split(" ")[0]          # host:pid:tag is the restart authority
    return int(holder.split(":")[1])


@pytest.mark.parametrize("crash_what", ["whole remediator", "lease-holding worker"])
def test_kill9_mid_restart_collects_the_real_outcome(tmp_path: Path, crash_what: str) -> None:
    """Issue 12, finding 8: the authority dies while the restart action runs; the action exits 0. The
    next authority collects that exit status (the wrapper outlived us and wrote it) and records the
    restart as done: no `interrupted`, no ERROR, no escalation, and never a second restart."""
    sim = start_sim()
    calls = tmp_path / "calls.txt"
    proc = None
    try:
        config = write_config(tmp_path, {"slow": sim}, {"slow": 2.0})
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_remediator(tmp_path, config, port, "remediator-1")
        crash(sim)
        requests.post(f"{url}/webhook", json=payload(alert("slow")), headers=AUTH, timeout=5).raise_for_status()
        wait_until(lambda: calls.exists() and calls.read_text().strip(), timeout=20, what="action started")
        if crash_what == "whole remediator":
            proc.kill9()                                       # crash in the middle of the restart
            proc = start_remediator(tmp_path, config, port, "remediator-2")
        else:
            os.kill(lease_holder_pid(url), signal.SIGKILL)     # gunicorn respawns it; another worker takes over
        rig = Rig(url, proc, {"slow": sim}, calls, config)
        ev = rig.wait_event("slow", "restarted", timeout=30)
        assert "collected" in ev["detail"] and ev["detail"]["exit_code"] == 0, ev
        # alerts keep coming: absorbed, never a second restart
        requests.post(f"{url}/webhook", json=payload(alert("slow", alertname="LLMBackendDown")), headers=AUTH,
                      timeout=5).raise_for_status()
        rig.wait_event("slow", "absorbed")
        rig.wait_event("slow", "recovered", timeout=30)
        assert len(rig.events("", "lease_acquired")) == 2
        assert len(rig.calls_for("slow")) == 1
        assert len(rig.events("slow", "restarting")) == 1
        assert rig.events("slow", "interrupted") == [] and rig.events("slow", "escalated") == []
        assert "error" not in [e["detail"].get("target") for e in rig.events("slow", "lifecycle")]
        metrics = requests.get(f"{url}/metrics", timeout=5).text
        assert has_sample(metrics, 'llm_health_remediator_restarts_total{backend="slow",result="ok"} 1')
    finally:
        if proc is not None:
            proc.stop()
        kill_recorded(calls)
        sim.stop()


# -- nothing but incident dedup, and a hung server --------------------------------------------------
UNRESPONSIVE_AFTER = 3.0


def dedup_and_hang_settings(cfg: dict[str, Any]) -> None:
    cfg["exporter"]["read_timeout"] = 0.5
    cfg["remediator"].update({
        "backoff": {"initial": 0, "factor": 2, "cap": 0, "stable_after": 3600},   # nothing but dedup
        "budget": {"restarts": 100, "window": 3600}, "breaker": {"restarts": 100, "window": 3600},
        "unresponsive_after": UNRESPONSIVE_AFTER, "stalled_drain_timeout": 0.5,
    })


@pytest.fixture(scope="module")
def dedup_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with running_rig(tmp_path_factory.mktemp("remediator-dedup"), ("storm", "hung"), "remediator-dedup",
                     dedup_and_hang_settings) as r:
        yield r


def fault(sim: Simulator, name: str) -> None:
    requests.post(sim.control_url + "/sim/fault", json={"fault": name}, timeout=5).raise_for_status()


def test_dedup_alone_gives_one_restart_per_incident(dedup_rig: Rig) -> None:
    fault(dedup_rig.sims["storm"], "crash")
    first = payload(alert("storm"))
    bodies = [first] * 6 + [payload(alert("storm"), external="http://am-1:9093")] * 4 + [
        payload(alert("storm", alertname="LLMBackendDown")),
    ]
    assert fire_at_once(dedup_rig, bodies) == [202] * len(bodies)
    dedup_rig.wait_event("storm", "recovered")
    assert len(dedup_rig.events("storm", "incident_opened")) == 1
    assert len(dedup_rig.events("storm", "restarting")) == 1
    assert len(dedup_rig.calls_for("storm")) == 1
    assert requests.get(dedup_rig.sims["storm"].control_url + "/sim/stats", timeout=5).json()["restarts"] == 1
    assert dedup_rig.events("storm", "deferred_backoff") == []          # backoff never held anything back


def test_hung_server_is_restarted_once_after_unresponsive_after(dedup_rig: Rig) -> None:
    sim = dedup_rig.sims["hung"]
    fault(sim, "hang")
    assert dedup_rig.post(payload(alert("hung"))).status_code == 202
    dedup_rig.wait_event("hung", "recovered", timeout=60)
    deferred = [e for e in reversed(dedup_rig.events("hung", "deferred_unknown")) if "unresponsive" in e["reason"]]
    restarting = dedup_rig.events("hung", "restarting")
    draining = dedup_rig.events("hung", "draining")
    assert deferred, dedup_rig.events("hung")
    assert len(restarting) == 1 and len(dedup_rig.calls_for("hung")) == 1
    assert restarting[0]["at"] - deferred[0]["at"] >= UNRESPONSIVE_AFTER    # not before the window
    assert len(draining) == 1 and "no answer to /metrics for" in draining[0]["reason"], dedup_rig.events("hung")
    assert requests.get(sim.control_url + "/sim/stats", timeout=5).json()["restarts"] == 1
    assert requests.get(sim.url + "/health", timeout=5).ok
