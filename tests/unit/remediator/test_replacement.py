"""A Deployment's pod comes back under a new name (remediator/restart/replacement.py): the incident
follows the workload slot to the new pod, which passes the warm-up gate and closes it.

In-process: the real app, store and authority (driven through `Authority.work`), a fleet that a test
changes as Kubernetes and discovery would (the deleted pod leaves, a new pod of the same ReplicaSet
appears), a recording restart runner and fake checks."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest
from llm_health.exporter.observation import Verification
from llm_health.exporter.reading import EngineReading, Reading
from llm_health.remediator import action
from llm_health.remediator.app import create_app
from llm_health.remediator.authority import Authority
from llm_health.remediator.inflight import InFlight
from llm_health.remediator.restart.replacement import candidates
from llm_health.remediator.store import Incident, IncidentState, SqliteStore

from llm_health.config import Backend, parse_config
from tests.support.alerts import alert, one_pass, payload
from tests.support.fakes import FakeClock

TOKEN = "replacement-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RS = "ReplicaSet/llm/vllm-7d9f"
OLD, OTHER, NEW = "vllm-7d9f-aaaaa", "vllm-7d9f-bbbbb", "vllm-7d9f-ccccc"


def pod(name: str, port: int, workload: str = RS) -> Backend:
    return Backend(name=name, url=f"http://127.0.0.1:{port}", host=f"node-{port}",
                   restart=("kubectl", "delete", "pod", "-n", "llm", name), workload=workload)


class Rig:
    def __init__(self, tmp_path: Path, warmup_timeout: float = 100) -> None:
        (tmp_path / "token").write_text(TOKEN)
        config = parse_config({"remediator": {
            "state": "state.db", "token_file": "token", "verify_interval": 0.2, "poll_interval": 0.1,
            "warmup_timeout": warmup_timeout, "warmup_poll": 5, "drain_timeout": 60,
            "backoff": {"initial": 10, "factor": 2, "cap": 100, "stable_after": 5000}}},
            source=str(tmp_path / "llm-health.yml"))
        self.fleet: list[Backend] = [pod(OLD, 18101), pod(OTHER, 18102)]
        self.config = dataclasses.replace(config, backends=self.fleet)    # a live list, as discovery's
        self.clock = FakeClock()
        app = create_app(self.config, clock=self.clock, with_authority=False)
        self.client = app.test_client()
        self.store: SqliteStore = app.extensions["remediator"].store
        self.ready: dict[str, bool] = defaultdict(lambda: True)
        self.calls: list[str] = []
        self.authority = Authority(
            self.store, self.config, clock=self.clock, runner=self.runner, holder="test",
            verifier=lambda b: Verification("no_progress" if b.name == OLD else "healthy", "fake verifier"),
            warmup_check=lambda b: (self.ready[b.name], f"fake warm-up of {b.name}"),
            answer_check=lambda b: (self.ready[b.name], "fake answers"),
            in_flight=lambda b: InFlight(0.0, None, Reading("v1", {"0": EngineReading(running=0.0)},
                                                            process_start=1.0)),
        )
        self.run()

    def runner(self, argv: object, timeout: float, env: dict[str, str]) -> action.ActionResult:
        self.calls.append(env["LLM_HEALTH_BACKEND"])
        return action.ActionResult(action.OK, 0, "pod deleted")

    def run(self, ticks: int = 3) -> None:
        for _ in range(ticks):
            assert self.authority.lease.renew()
            one_pass(self.authority)

    def restart_old(self) -> Incident:
        assert self.client.post("/webhook", json=payload(alert(OLD)), headers=AUTH).status_code == 202
        for _ in range(20):
            self.run(1)
            self.clock.advance(1)
            if self.calls:
                break
        assert self.calls == [OLD]
        (inc,) = self.store.active_incidents()
        assert inc.state == IncidentState.WARMING and inc.workload == RS, inc
        assert set(inc.members) == {OLD, OTHER}
        return inc

    def kubernetes_replaces_the_pod(self) -> None:
        self.fleet.remove(self.fleet[0])
        self.fleet.append(pod(NEW, 18103))


def test_the_incident_follows_the_new_pod_through_the_warm_up_gate(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    inc = rig.restart_old()
    rig.ready[NEW] = False                        # the new pod loads its model
    rig.kubernetes_replaces_the_pod()
    rig.clock.advance(5)
    rig.run()
    (following,) = rig.store.active_incidents()
    assert following.id == inc.id and following.replacement == NEW and following.state == IncidentState.WARMING
    assert [e.detail["replacement"] for e in rig.store.events(kind="replacement")] == [NEW]
    rig.ready[NEW] = True
    rig.clock.advance(5)
    rig.run()
    assert rig.store.active_incidents() == []
    closed = rig.store.incident(inc.id)
    assert closed is not None and closed.close_reason == "recovered"
    assert rig.store.lifecycle_state(NEW).value == "ready"
    old = rig.store.lifecycle(OLD)
    assert old is not None and old.incident_id is None           # no incident holds the deleted pod
    assert rig.calls == [OLD]                                     # one restart, nothing else run
    recovered = rig.store.events(kind="recovered")[0]
    assert f"{NEW} (replaces {OLD})" in recovered.reason


def test_no_new_pod_by_the_warm_up_timeout_needs_a_person(tmp_path: Path) -> None:
    rig = Rig(tmp_path, warmup_timeout=30)
    inc = rig.restart_old()
    # deleted, and the ReplicaSet made no new pod (the old one is still listed: discovery's grace)
    rig.ready[OLD] = False
    for _ in range(8):
        rig.clock.advance(5)
        rig.run(1)
    after = rig.store.incident(inc.id)
    assert after is not None and after.state == IncidentState.NEEDS_ACK, after
    timeout = rig.store.events(kind="warmup_timeout")[0]
    assert f"no new pod of {RS} passed the warm-up gate" in timeout.reason
    assert rig.store.events(kind="escalated") and rig.calls == [OLD]


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
