"""Acceptance: backends from a REAL Prometheus' file_sd targets, for the real exporter and the real
remediator (gunicorn, 2 workers). Simulated vLLM servers are the targets.

* a target added to the file_sd file appears in the exporter's verdicts; removed, it stays for the
  grace period and then disappears; a static backend of the same name wins;
* a discovered backend is restarted with argv filled from its target labels (a script records argv);
* a target whose `pod` label is hostile is watched but never restarted, and that is audited;
* Prometheus gone: the exporter keeps the last good list and says it is stale.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from llm_health.simulator.server import SimConfig, Simulator
from test_remediator_helpers import alert, payload

from llm_health.procs import ManagedProcess, WaitTimeout, free_port, llm_health, wait_until

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")

TOKEN = "discovery-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GRACE = 8.0
HOSTILE_POD = "sim-c;$(touch pwned)"

# the restart action: records its argv (one JSON line), then restarts the simulator it was given
RECORDER = '''
import json, subprocess, sys
calls, ctl_map, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(calls, "a") as f:
    f.write(json.dumps(rest) + "\\n")
ctl = json.load(open(ctl_map))[rest[-1]]
sys.exit(subprocess.call([sys.executable, "-m", "llm_health.simulator.ctl", "restart", ctl],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
'''


@dataclass
class World:
    tmp: Path
    sims: dict[str, Simulator]
    sd_file: Path
    prometheus: ManagedProcess
    prometheus_url: str
    exporter_url: str = ""
    remediator_url: str = ""
    procs: list[ManagedProcess] = field(default_factory=list)

    def publish(self, groups: list[dict[str, Any]]) -> None:
        """Rewrite the file_sd file atomically (Prometheus never reads half a file)."""
        tmp = self.sd_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.sd_file)

    def group(self, sim: str, **labels: str) -> dict[str, Any]:
        return {"targets": [self.sims[sim].url.split("://", 1)[1]], "labels": labels}

    def prometheus_targets(self) -> set[str]:
        r = requests.get(f"{self.prometheus_url}/api/v1/targets", params={"state": "active"}, timeout=5)
        return {t["labels"].get("backend", "") for t in r.json()["data"]["activeTargets"]
                if t["labels"].get("job") == "vllm"}

    def verdicts(self) -> dict[str, dict[str, Any]]:
        doc = requests.get(f"{self.exporter_url}/verdicts", timeout=5).json()
        return {b["backend"]: b for b in doc["backends"]}

    def events(self, backend: str = "", kind: str = "") -> list[dict[str, Any]]:
        r = requests.get(f"{self.remediator_url}/api/events",
                         params={"backend": backend, "kind": kind, "limit": 1000}, timeout=5)
        r.raise_for_status()
        return list(r.json()["events"])

    def calls(self) -> list[list[str]]:
        path = self.tmp / "calls.txt"
        return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def start_sim() -> Simulator:
    sim = Simulator(SimConfig(port=free_port(), control_port=free_port(), restart_seconds=0.3)).start()
    wait_until(lambda: requests.get(sim.url + "/health", timeout=1).ok, what="simulator up")
    return sim


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("discovery")
    sims: dict[str, Simulator] = {}
    procs: list[ManagedProcess] = []
    try:
        for name in ("sim-a", "sim-b", "sim-c", "static-twin"):
            sims[name] = start_sim()
        sd_dir = tmp / "sd"
        sd_dir.mkdir()
        sd_file = sd_dir / "vllm.json"
        port = free_port()
        prom_cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [
                {"files": [str(sd_dir / "*.json")], "refresh_interval": "1s"}]}],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        prom = ManagedProcess(
            [shutil.which("prometheus") or "prometheus", f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            "prometheus", tmp)
        procs.append(prom)
        w = World(tmp, sims, sd_file, prom, f"http://127.0.0.1:{port}", procs=procs)
        w.publish([w.group("sim-a", backend="sim-a", namespace="llm", pod="sim-a-0", node="node-1")])
        prom.wait_http(f"{w.prometheus_url}/-/ready", timeout=30)

        (tmp / "token").write_text(TOKEN)
        (tmp / "record.py").write_text(RECORDER)
        (tmp / "ctl.json").write_text(json.dumps({n: s.control_url for n, s in sims.items()}))
        config = {
            # a static backend with the same name as a discovered target: the static one is used
            "backends": [{"name": "static-twin", "url": sims["static-twin"].url}],
            "discovery": {
                "prometheus_url": w.prometheus_url, "selector": 'job="vllm", backend=~"sim-.*|static-twin"',
                "refresh": 0.3, "timeout": 2, "grace": GRACE,
                "restart": [sys.executable, str(tmp / "record.py"), str(tmp / "calls.txt"), str(tmp / "ctl.json"),
                            "{namespace}", "{pod}", "{backend}"],
            },
            "exporter": {"interval": 0.3, "read_timeout": 1.0, "probe_timeout": 2.0},
            "remediator": {
                "state": "state.db", "token_file": "token", "dedup_window": 30, "verify_readings": 2,
                "verify_interval": 0.2, "poll_interval": 0.1, "warmup_poll": 0.2, "warmup_timeout": 20,
                "action_timeout": 20, "backoff": {"initial": 60, "factor": 2, "cap": 600, "stable_after": 3600},
            },
        }
        cfg_path = tmp / "llm-health.yml"
        cfg_path.write_text(yaml.safe_dump(config))
        eport, rport = free_port(), free_port()
        exporter = ManagedProcess(llm_health("exporter", "--config", cfg_path, "--listen", f"127.0.0.1:{eport}"),
                                  "exporter", tmp)
        procs.append(exporter)
        remediator = ManagedProcess(llm_health("remediator", "--config", cfg_path, "--listen",
                                               f"127.0.0.1:{rport}", "--workers", 2), "remediator", tmp, cwd=tmp)
        procs.append(remediator)
        exporter.wait_http(f"http://127.0.0.1:{eport}/health", timeout=30)
        remediator.wait_http(f"http://127.0.0.1:{rport}/healthz", timeout=30)
        w.exporter_url, w.remediator_url = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{rport}"
        yield w
    finally:
        for p in reversed(procs):
            p.stop()
        for s in sims.values():
            s.stop()


def test_targets_come_and_go_in_the_exporter_after_the_grace_period(world: World) -> None:
    w = world
    wait_until(lambda: "sim-a" in w.verdicts(), timeout=30, what="sim-a discovered by the exporter")
    assert w.verdicts()["static-twin"]["url"] == w.sims["static-twin"].url
    wait_until(lambda: w.verdicts()["sim-a"]["verdict"] == "idle", timeout=30, what="sim-a judged idle")

    # add two targets; one claims the static backend's name from another server: static wins
    w.publish([w.group("sim-a", backend="sim-a", namespace="llm", pod="sim-a-0", node="node-1"),
               w.group("sim-b", backend="sim-b", namespace="llm", pod="sim-b-0", node="node-2"),
               w.group("sim-c", backend="static-twin", namespace="llm", pod="twin-0")])
    wait_until(lambda: "sim-b" in w.verdicts(), timeout=30, what="sim-b added to the file -> exporter")
    assert w.sims["sim-b"].url == w.verdicts()["sim-b"]["url"]
    wait_until(lambda: "static-twin" in w.prometheus_targets(), timeout=30, what="twin target scraped")
    wait_until(lambda: requests.get(f"{w.exporter_url}/verdicts", timeout=5).json()["discovery"]["refusals"],
               timeout=30, what="the clash reported")
    assert w.verdicts()["static-twin"]["url"] == w.sims["static-twin"].url     # static wins
    refusals = requests.get(f"{w.exporter_url}/verdicts", timeout=5).json()["discovery"]["refusals"]
    assert any("static backend" in r["reason"] for r in refusals)

    # remove sim-b: Prometheus forgets it at once, the exporter only after the grace period
    w.publish([w.group("sim-a", backend="sim-a", namespace="llm", pod="sim-a-0", node="node-1")])
    wait_until(lambda: "sim-b" not in w.prometheus_targets(), timeout=30, what="Prometheus dropped sim-b")
    doc = requests.get(f"{w.exporter_url}/verdicts", timeout=5).json()
    seen = (doc["discovery"]["refreshes"], doc["cycles"])

    def later() -> dict[str, Any] | None:   # 3 good answers without sim-b, and 2 cycles after them
        d = requests.get(f"{w.exporter_url}/verdicts", timeout=5).json()
        return d if d["discovery"]["refreshes"] >= seen[0] + 3 and d["cycles"] >= seen[1] + 2 else None
    doc = wait_until(later, timeout=GRACE, what="refreshes after the removal")
    assert "sim-b" in {b["backend"] for b in doc["backends"]}, "removed before its grace period"
    wait_until(lambda: "sim-b" not in w.verdicts(), timeout=GRACE + 30, what="sim-b gone after grace")
    assert {"sim-a", "static-twin"} <= set(w.verdicts())
    metrics = requests.get(f"{w.exporter_url}/metrics", timeout=5).text
    assert 'llm_health_verdict_code{backend="sim-b"}' not in metrics
    assert "llm_health_discovery_stale 0.0" in metrics
    assert "llm_health_discovery_errors_total 0.0" in metrics


def test_restart_argv_is_filled_from_labels_and_a_hostile_label_means_no_restart(world: World) -> None:
    w = world
    w.publish([w.group("sim-a", backend="sim-a", namespace="llm", pod="sim-a-0", node="node-1"),
               w.group("sim-c", backend="sim-c", namespace="llm", pod=HOSTILE_POD)])
    # the remediator knows both (each gunicorn worker refreshes on its own)
    wait_until(lambda: {"sim-a", "sim-c"} <= {b["backend"] for b in requests.get(
        f"{w.remediator_url}/api/backends", timeout=5).json()["backends"]}, timeout=30,
        what="remediator sees the discovered backends")
    refused = wait_until(lambda: w.events("sim-c", "discovery_refused"), timeout=30, what="refusal audited")
    assert "$(touch pwned)" in refused[0]["reason"] and "never restarted" in refused[0]["reason"]

    for name in ("sim-a", "sim-c"):
        requests.post(w.sims[name].control_url + "/sim/fault", json={"fault": "crash"}, timeout=5).raise_for_status()
        assert requests.post(f"{w.remediator_url}/webhook", json=payload(alert(name)), headers=AUTH,
                             timeout=10).status_code == 202
    try:
        wait_until(lambda: w.events("sim-a", "recovered"), timeout=60, what="sim-a restarted and recovered")
    except WaitTimeout:
        pytest.fail("sim-a never recovered; its events: "
                    + "; ".join(f"{e['kind']}: {e['reason']}" for e in w.events("sim-a", "")))
    assert w.calls() == [["llm", "sim-a-0", "sim-a"]]
    try:
        not_configured = wait_until(lambda: w.events("sim-c", "not_configured"), timeout=30, what="sim-c not restarted")
    except WaitTimeout:
        pytest.fail("sim-c never reached not_configured; its events: "
                    + "; ".join(f"{e['kind']}: {e['reason']}" for e in w.events("sim-c", "")))
    assert "no restart action" in not_configured[0]["reason"]
    assert w.calls() == [["llm", "sim-a-0", "sim-a"]]
    assert not list(w.tmp.glob("pwned*")) and not list(Path.cwd().glob("pwned*"))
    requests.post(w.sims["sim-c"].control_url + "/sim/fault", json={"fault": "restart"}, timeout=5)
    metrics = requests.get(f"{w.remediator_url}/metrics", timeout=5).text
    assert "llm_health_discovery_last_success_timestamp_seconds" in metrics


def test_prometheus_gone_keeps_the_last_good_list_and_says_stale(world: World) -> None:
    w = world
    before = set(w.verdicts())
    assert "sim-a" in before
    w.prometheus.stop()
    wait_until(lambda: "llm_health_discovery_stale 1.0" in requests.get(f"{w.exporter_url}/metrics", timeout=5).text,
               timeout=30, what="exporter says discovery is stale")
    # far longer than the grace period: nothing is removed on bad answers
    deadline_checks = wait_until(
        lambda: float(next(ln.split()[1] for ln in requests.get(f"{w.exporter_url}/metrics", timeout=5).text
                           .splitlines() if ln.startswith("llm_health_discovery_errors_total"))) >= GRACE / 0.3,
        timeout=60, what="errors for longer than the grace period")
    assert deadline_checks
    assert set(w.verdicts()) == before
    backends = {b["backend"] for b in requests.get(f"{w.remediator_url}/api/backends", timeout=5).json()["backends"]}
    assert {"sim-a", "sim-c", "static-twin"} <= backends
    status = requests.get(f"{w.remediator_url}/api/discovery", timeout=5).json()
    assert status["stale"] and status["errors"] >= 1 and status["last_error"]
