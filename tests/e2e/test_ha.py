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

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llm_health.drill.ha import Member, leaders, one_leader, recorder_argv, restarts
from llm_health.drill.postgres import PostgresServer
from llm_health.drill.procs import free_port, wait_until
from tests.support.alertmanager import AM_BINARY, running_alertmanager, shipped_config_to

TOKEN = "ha-test-token"
TTL, RENEW = 5.0, 5.0 / 4
TAKEOVER_BOUND = TTL + RENEW + 3.0     # the lease runs out, the next renewal takes it; slack for a loaded machine

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(AM_BINARY is None, reason="prometheus-alertmanager not installed (make debs)"),
]


def remediator_config(url: str, actions: Path, backend_url: str, folder: Path) -> dict[str, Any]:
    return {
        "backends": [{"name": "gpu-a", "url": backend_url, "restart": recorder_argv(folder, actions)}],
        "remediator": {"state": url, "token_file": "token", "poll_interval": 0.2, "verify_readings": 2,
                       "verify_interval": 0.2, "warmup_timeout": 600, "warmup_poll": 0.5,
                       "drain_timeout": 0, "state_timeout": 3},
    }


def backend(inst: Member) -> dict[str, Any]:
    (b,) = requests.get(inst.url + "/api/backends", timeout=5).json()["backends"]
    return dict(b)


def events(inst: Member, kind: str) -> list[dict[str, Any]]:
    r = requests.get(inst.url + "/api/events", params={"kind": kind, "limit": 1000}, headers=inst.headers,
                     timeout=5)
    r.raise_for_status()
    return list(r.json()["events"])


def am_config(tmp: Path, instances: list[Member]) -> Path:
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
def cluster(tmp_path: Path, pg_server: PostgresServer) -> Iterator[tuple[list[Member], Path, PostgresServer]]:
    actions = tmp_path / "actions.txt"
    # nothing listens at the backend: verified down
    config = remediator_config(pg_server.new_database(), actions, f"http://127.0.0.1:{free_port()}", tmp_path)
    instances: list[Member] = []
    try:
        for n in ("a", "b", "c"):
            instances.append(Member(tmp_path / f"remediator-{n}", config, TOKEN))
        yield instances, actions, pg_server
    finally:
        for inst in instances:
            inst.stop()
        if not pg_server.running():
            pg_server.start()


def test_one_restart_through_leader_kills_freezes_and_a_database_restart(
        tmp_path: Path, cluster: tuple[list[Member], Path, PostgresServer]) -> None:
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
        second.signal(signal.SIGSTOP)
        try:
            t1 = time.monotonic()
            third = one_leader([i for i in rest if i is not second], TAKEOVER_BOUND + 5, "the third takes over")
            print(f"HA: leader frozen (SIGSTOP) -> the third holds the lease: {time.monotonic() - t1:.2f} s")
        finally:
            second.signal(signal.SIGCONT)
        wait_until(lambda: leaders(rest) == [third], timeout=10, interval=0.1,
                   what="the resumed one knows it lost its term")
        assert (backend(third).get("incident") or {}).get("state") == "warming"

        # PostgreSQL stopped: 503 to webhooks, nobody leads within the lease; started: one leader again
        pg.stop("fast")
        try:
            assert third.deliver({"version": "4", "status": "firing", "alerts": []}) == 503
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
