"""A Deployment's pod comes back under a new name (remediator/restart/replacement.py): the incident
follows the workload slot to the new pod, which passes the warm-up gate and closes it.

In-process on the shared harness: the real app, store, authority (driven through `Authority.work`) and
discovery, reading pod targets from a Prometheus stand-in that the test changes as Kubernetes would
(the deleted pod's target goes, a new pod of the same ReplicaSet comes), a recording runner, fake checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_health.config import Backend
from llm_health.remediator.restart.replacement import candidates
from llm_health.remediator.store import Incident, IncidentState, SqliteStore
from tests.support.alerts import alert, payload
from tests.support.discovery import pod as pod_target
from tests.support.remediator import World, discovered

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

RS = "ReplicaSet/llm/vllm-7d9f"
OLD, OTHER, NEW = "vllm-7d9f-aaaaa", "vllm-7d9f-bbbbb", "vllm-7d9f-ccccc"


def pod(name: str, port: int, workload: str = RS) -> Backend:
    return Backend(name=name, url=f"http://127.0.0.1:{port}", host=f"node-{port}",
                   restart=("kubectl", "delete", "pod", "-n", "llm", name), workload=workload)


def replica(name: str, port: int, replica_set: str = "vllm-7d9f") -> dict[str, Any]:
    """A pod target of a Deployment's ReplicaSet as Prometheus lists it (its controller in discovered labels)."""
    t = pod_target(name, f"127.0.0.1:{port}", node=f"node-{port}")
    t["discoveredLabels"].update({"__meta_kubernetes_pod_controller_kind": "ReplicaSet",
                                  "__meta_kubernetes_pod_controller_name": replica_set})
    return t


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    """Discovery over a FakePrometheus listing two pods of one ReplicaSet; OLD verifies stalled."""
    world = discovered(tmp_path)
    world.publish(replica(OLD, 18101), replica(OTHER, 18102))
    world.outcomes.update({OLD: "no_progress", OTHER: "healthy"})
    world.ready.update({OLD: True, OTHER: True})
    yield world
    world.close()


def restart_old(w: World) -> Incident:
    w.deliver(payload(alert(OLD)))
    w.run_until(lambda: w.restarted, what="the restart of the stalled pod")
    assert w.restarted == [OLD] and w.calls == [("restart-pod", "llm", OLD)]
    inc = w.incident(OLD)
    assert inc is not None and inc.state == IncidentState.WARMING and inc.workload == RS, inc
    assert set(inc.members) == {OLD, OTHER}
    w.ready[OLD] = False                          # deleted: that pod never answers again
    return inc


def test_the_incident_follows_the_new_pod_through_the_warm_up_gate(w: World) -> None:
    inc = restart_old(w)
    w.ready[NEW] = False                          # the new pod loads its model
    w.publish(replica(NEW, 18103), replica(OTHER, 18102))      # the ReplicaSet made a new pod
    w.run_until(lambda: w.store.events(kind="replacement"), what="the new pod taken as the replacement")
    following = w.store.incident(inc.id)
    assert following is not None and following.replacement == NEW and following.state == IncidentState.WARMING
    w.ready[NEW] = True
    w.run_until(lambda: w.incident(OLD) is None, what="the incident closed on the new pod")
    closed = w.store.incident(inc.id)
    assert closed is not None and closed.close_reason == "recovered"
    assert w.state(NEW) == "ready"
    old = w.store.lifecycle(OLD)
    assert old is not None and old.incident_id is None           # no incident holds the deleted pod
    assert w.restarted == [OLD]                                   # one restart, nothing else run
    (recovered,) = w.events(NEW, "recovered")
    assert f"{NEW} (replaces {OLD})" in recovered.reason
    assert "replaced" in w.kinds(OLD)


def test_no_new_pod_by_the_warm_up_timeout_needs_a_person(w: World) -> None:
    inc = restart_old(w)          # and the ReplicaSet makes no new pod (the old one still listed: grace)
    w.run_until(lambda: w.store.events(kind="warmup_timeout"), what="the warm-up timeout", timeout=60)
    after = w.store.incident(inc.id)
    assert after is not None and after.state == IncidentState.NEEDS_ACK, after
    (timeout,) = w.store.events(kind="warmup_timeout")
    assert f"no new pod of {RS} passed the warm-up gate" in timeout.reason
    assert w.store.events(kind="escalated") and w.restarted == [OLD]


def test_the_replacement_is_never_an_old_member_or_another_workload() -> None:
    inc = Incident(id=1, backend=OLD, state=IncidentState.WARMING, opened_at=0, updated_at=0, workload=RS,
                   members=(OLD, OTHER))
    fleet = [pod(OTHER, 1), pod("vllm-9x-zzzzz", 2, "ReplicaSet/llm/vllm-9x"), pod(NEW, 3), pod("vllm-7d9f-bbbbc", 4)]
    assert [b.name for b in candidates(inc, fleet)] == ["vllm-7d9f-bbbbc", NEW]
    assert candidates(inc, [pod(OTHER, 1)]) == []


@pytest.mark.parametrize("first", [True, False])
def test_two_incidents_never_follow_the_same_new_pod(tmp_path: Path, first: bool) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    with store.tx() as tx:
        a, b = tx.open_incident(OLD, 1.0), tx.open_incident(OTHER, 1.0)
        assert tx.take_replacement(a if first else b, NEW)
        assert not tx.take_replacement(b if first else a, NEW)
        assert tx.take_replacement(a if first else b, NEW)          # its own again: fine
    store.close()
