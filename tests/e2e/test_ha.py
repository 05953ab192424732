"""One restart authority across hosts (issue 24): three real remediators (gunicorn processes) on one real
PostgreSQL, two real Alertmanagers in a cluster that both deliver every notification to all three.

One incident is carried through the failures that matter, and its restart action (a script that appends
the epoch it was started under to actions.txt) must run exactly once through all of them:

* every remediator accepts and records the deliveries; only the leader acts: one restart;
* `kill -9` of the leader during the warm-up: a follower holds the lease within the lease time plus one
  renewal, and does not repeat the restart;
* the new leader frozen with SIGSTOP past its lease: the third takes over; resumed, the frozen one finds
  its term gone (holds nothing, starts nothing);
* PostgreSQL stopped: webhooks are answered 503 (Alertmanager retries), and within the lease time no one
  leads; started again: exactly one leader, without a person, and the incident is still there.

The backend listens nowhere, so verification says `down` (a restart is due) and the warm-up never ends:
any repeated restart would show in actions.txt. Timings: poll_interval 0.2 s, so the lease lasts 5 s and
is renewed every 1.25 s (remediator/authority.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.postgres import PostgresServer
from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from tests.support.alertmanager import AM_BINARY, running_alertmanager, shipped_config_to

TOKEN = "ha-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TTL, RENEW = 5.0, 5.0 / 4
TAKEOVER_BOUND = TTL + RENEW + 3.0     # the lease runs out, the next renewal takes it; slack for a loaded machine

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(AM_BINARY is None, reason="prometheus-alertmanager not installed (make debs)"),
]


class Instance:
    def __init__(self, name: str, folder: Path, url: str, actions: Path, backend_url: str) -> None:
        folder.mkdir()
        (folder / "token").write_text(TOKEN + "\n")
        os.chmod(folder / "token", 0o600)
        script = folder.parent / "restart.py"
        script.write_text("import os, sys\nwith open(sys.argv[1], 'a') as f:\n"
                          "    f.write(f\"{os.environ['LLM_HEALTH_BACKEND']} {os.environ['LLM_HEALTH_EPOCH']}\\n\")\n")
        cfg = {
            "backends": [{"name": "gpu-a", "url": backend_url, "restart": [sys.executable, str(script), str(actions)]}],
            "remediator": {"state": url, "token_file": "token", "poll_interval": 0.2, "verify_readings": 2,
                           "verify_interval": 0.2, "warmup_timeout": 600, "warmup_poll": 0.5,
                           "drain_timeout": 0, "state_timeout": 3},
        }
        (folder / "llm-health.yml").write_text(yaml.safe_dump(cfg))
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = ManagedProcess(llm_health("remediator", "--config", folder / "llm-health.yml", "--listen",
                                              f"127.0.0.1:{self.port}", "--workers", 1), name=name, log_dir=folder,
                                   cwd=folder)

    def health(self) -> dict[str, Any] | None:
        try:
            return dict(requests.get(self.url + "/healthz", timeout=2).json())
        except (requests.RequestException, ValueError):
            return None

    def leads(self) -> bool:
        h = self.health()
        return bool(h and h.get("holds_lease"))


def leaders(instances: list[Instance]) -> list[Instance]:
    return [i for i in instances if i.leads()]


def one_leader(instances: list[Instance], timeout: float, what: str) -> Instance:
    def found() -> Instance | None:
        now = leaders(instances)
        return now[0] if len(now) == 1 else None
    return wait_until(found, timeout=timeout, interval=0.1, what=what)


def restarts(actions: Path) -> list[str]:
    return actions.read_text().splitlines() if actions.exists() else []


def backend(inst: Instance) -> dict[str, Any]:
    (b,) = requests.get(inst.url + "/api/backends", timeout=5).json()["backends"]
    return dict(b)


def events(inst: Instance, kind: str) -> list[dict[str, Any]]:
    r = requests.get(inst.url + "/api/events", params={"kind": kind, "limit": 1000}, headers=AUTH, timeout=5)
    r.raise_for_status()
    return list(r.json()["events"])


def am_config(tmp: Path, instances: list[Instance]) -> Path:
    config = shipped_config_to([i.url for i in instances], TOKEN, tmp)
    for route in config["route"]["routes"]:
        if route["receiver"] == "llm-health-remediator":
            route["group_wait"] = "1s"
            route["group_interval"] = "2s"
            route["repeat_interval"] = "5s"
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def cluster(tmp_path: Path, pg_server: PostgresServer) -> Iterator[tuple[list[Instance], Path, PostgresServer]]:
    url = pg_server.new_database()
    actions = tmp_path / "actions.txt"
    backend_url = f"http://127.0.0.1:{free_port()}"          # nothing listens: verified down
    instances = [Instance(f"remediator-{n}", tmp_path / n, url, actions, backend_url) for n in ("a", "b", "c")]
    try:
        for inst in instances:
            inst.proc.wait_http(inst.url + "/healthz", timeout=60)
        yield instances, actions, pg_server
    finally:
        for inst in instances:
            try:
                os.killpg(inst.proc.proc.pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
            inst.proc.stop()
        if not pg_server.running():
            pg_server.start()


def test_one_restart_through_leader_kills_freezes_and_a_database_restart(
        tmp_path: Path, cluster: tuple[list[Instance], Path, PostgresServer]) -> None:
    instances, actions, pg = cluster
    first = one_leader(instances, 30, "one leader among three")
    assert len(leaders(instances)) == 1
    cluster_port = free_port()
    config = am_config(tmp_path, instances)
    with running_alertmanager(config, tmp_path, cluster=True, cluster_port=cluster_port, name="am-1") as am1, \
            running_alertmanager(config, tmp_path, cluster=True, peers=[f"127.0.0.1:{cluster_port}"],
                                 name="am-2") as am2:
        alert = [{"labels": {"alertname": "LLMBackendStalled", "severity": "critical", "remediation": "restart",
                             "backend": "gpu-a"}, "annotations": {"summary": "test"}}]
        for am in (am1, am2):
            assert requests.post(f"{am}/api/v2/alerts", json=alert, timeout=5).status_code == 200

        # every remediator hears the deliveries; only the leader restarts, once
        wait_until(lambda: restarts(actions), timeout=60, interval=0.1, what="the restart")
        wait_until(lambda: (backend(first).get("incident") or {}).get("state") == "warming", timeout=30,
                   interval=0.1, what="the restart's warm-up")
        epoch_1 = int((first.health() or {})["epoch"])
        assert restarts(actions) == [f"gpu-a {epoch_1}"]                     # started under the leader's term

        # kill -9 of the leader in the warm-up: a follower takes over within the lease time + one renewal
        first.proc.kill9()
        t0 = time.monotonic()
        rest = [i for i in instances if i is not first]
        second = one_leader(rest, TAKEOVER_BOUND + 5, "a follower takes over")
        took = time.monotonic() - t0
        print(f"\nHA: kill -9 of the leader -> a follower holds the lease: {took:.2f} s (bound {TAKEOVER_BOUND:g} s)")
        assert took <= TAKEOVER_BOUND, took
        wait_until(lambda: any(e["detail"].get("epoch", 0) > epoch_1 for e in events(second, "lease_acquired")),
                   timeout=10, interval=0.1, what="a new term recorded")

        # the new leader frozen past its lease: the third takes over; resumed, the frozen one acts on nothing
        os.killpg(second.proc.proc.pid, signal.SIGSTOP)
        try:
            t1 = time.monotonic()
            third = one_leader([i for i in rest if i is not second], TAKEOVER_BOUND + 5, "the third takes over")
            print(f"HA: leader frozen (SIGSTOP) -> the third holds the lease: {time.monotonic() - t1:.2f} s")
        finally:
            os.killpg(second.proc.proc.pid, signal.SIGCONT)
        wait_until(lambda: leaders(rest) == [third], timeout=10, interval=0.1,
                   what="the resumed one knows it lost its term")
        assert (backend(third).get("incident") or {}).get("state") == "warming"

        # PostgreSQL stopped: 503 to webhooks, nobody leads within the lease; started: one leader again
        pg.stop("fast")
        try:
            r = requests.post(third.url + "/webhook", json={"version": "4", "status": "firing", "alerts": []},
                              headers=AUTH, timeout=15)
            assert r.status_code == 503, r.text
            wait_until(lambda: leaders(rest) == [], timeout=TTL + 10, interval=0.2, what="no leader without a state")
        finally:
            pg.start()
        t2 = time.monotonic()
        one_leader(rest, 60, "one leader after the database came back")
        print(f"HA: PostgreSQL started again -> one leader: {time.monotonic() - t2:.2f} s")
        wait_until(lambda: (backend(rest[0]).get("incident") or {}).get("state") == "warming", timeout=30,
                   interval=0.2, what="the incident kept")
        assert len(leaders(rest)) == 1

    assert len(restarts(actions)) == 1, restarts(actions)
