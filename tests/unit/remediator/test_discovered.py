"""Discovered backends in the remediator (remediator/discovered.py), discovery as a trust boundary,
in-process: the real Flask app, store, authority and discovery refresher (its thread runs), a Prometheus
stand-in on loopback that serves /api/v1/targets (and counts, and can hang), a recording restart runner
and a fake verifier (tests.support.remediator.discovered).

The abuses the old code allowed:
* a rogue target labelled pod=vllm-0 got `delete pod vllm-0` run (placeholders came from target labels);
* a rogue target copying a real backend's name took it over (first scrape URL won);
* a forged node label put a rogue on the real backend's host: its restart held that host's mutex;
* every webhook naming an undiscovered backend ran a targets query inside the request.

And a discovered backend in the middle of a restart survives a remediator start while Prometheus is down.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_health.drill.procs import WaitTimeout, wait_until
from tests.support.alerts import alert, one_pass, payload
from tests.support.discovery import pod, rogue
from tests.support.remediator import World, discovered, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = discovered(tmp_path)
    yield world
    world.close()


def test_a_rogue_target_labelled_pod_vllm_0_never_gets_vllm_0_deleted(w: World) -> None:
    """The attack from the issue, end to end in-process: rogue `vllm-evil` (its monitor relabels
    pod=vllm-0, namespace=llm), its /metrics failing; an alert about it; the remediator verifies the
    rogue URL, finds it down and restarts. The old code ran `restart-pod llm vllm-0`."""
    w.publish(pod("vllm-0", "10.0.0.5:8000", node="n1"), rogue("vllm-evil", "vllm-0"))
    assert w.post(payload(alert("vllm-evil"))).status_code == 202
    w.run_until(lambda: w.calls, "the rogue's restart ran")
    assert w.calls == [("restart-pod", "evil", "vllm-evil")]         # its own pod, never vllm-0
    assert all("vllm-0" not in argv for argv in w.calls)


def test_a_hijacked_name_means_no_restart_for_either_an_audit_event_and_the_metric(w: World) -> None:
    w.publish(pod("vllm-0", "10.0.0.5:8000"))
    w.publish(pod("vllm-0", "10.0.0.5:8000"), rogue("vllm-0", "vllm-0", "10.0.0.1:8000"))
    # the audit is written by the refresh's listener, just after the refresh counts as answered
    (dup,) = wait_until(lambda: w.events("vllm-0", "discovery_duplicate"), timeout=10, what="the audit event")
    assert "claimed by 2" in dup.reason and "needs a person" in dup.reason
    assert sorted(dup.detail["targets"]) == ["http://10.0.0.1:8000/metrics", "http://10.0.0.5:8000/metrics"]
    metrics = w.client.get("/metrics").get_data(as_text=True)
    assert "llm_health_discovery_duplicate_names 1.0" in metrics
    assert w.post(payload(alert("vllm-0"))).status_code == 202
    w.run_until(lambda: "not_configured" in w.kinds("vllm-0"), "incident ends without a restart")
    assert w.calls == []
    backend = w.app.extensions["remediator"].config.backend("vllm-0")
    assert backend.url == "http://10.0.0.5:8000" and backend.restart == ()     # still watched where it was


def test_a_forged_node_label_cannot_hold_another_hosts_restart_mutex(w: World) -> None:
    """The rogue's restart is in progress (warming, never ready here); the real vllm-0 on host n1 stalls.
    With host read from the forged `node` label the rogue held n1's mutex: vllm-0 deferred_host."""
    w.publish(pod("vllm-0", "10.0.0.5:8000", node="n1"), rogue("vllm-evil", "x", node="n1"))
    w.post(payload(alert("vllm-evil")))
    w.run_until(lambda: w.calls, "the rogue restarted (and now warms up forever)")
    w.post(payload(alert("vllm-0", starts_at="2026-11-30T00:01:00Z")))
    w.run_until(lambda: len(w.calls) == 2, "vllm-0 restarted while the rogue warms up")
    assert w.calls[1] == ("restart-pod", "llm", "vllm-0")
    assert "deferred_host" not in w.kinds("vllm-0")


def test_a_webhook_storm_about_unknown_backends_answers_at_once_and_costs_few_queries(w: World) -> None:
    """41 webhooks, each naming a backend this worker has not discovered. The old code ran a targets
    query inside every request (41 webhooks -> 45 queries; one took 8.3 s). Here Prometheus hangs during
    the whole storm: every webhook must still answer, and the storm costs at most one extra query per
    extra_refresh_every."""
    w.publish(pod("vllm-0"))
    before = w.prometheus.queries
    w.prometheus.open.clear()                                  # from now on Prometheus hangs
    answers: list[int] = []

    def storm() -> None:
        for i in range(41):
            answers.append(w.post(payload(alert(f"new-{i}"))).status_code)
            one_pass(w.authority)                                 # the authority asks for refreshes meanwhile

    t = threading.Thread(target=storm, daemon=True)
    t.start()
    t.join(20)
    hung = w.prometheus.queries - before
    w.prometheus.open.set()
    assert not t.is_alive(), f"the webhooks waited for Prometheus ({len(answers)} of 41 answered)"
    assert answers == [202] * 41
    assert hung <= 1, f"{hung} queries while Prometheus hung"   # the one refresh asked for, hanging
    # each unknown name: looked up after a refresh that started after it was missed, then closed
    try:
        w.run_until(lambda: not w.store.active_incidents(), "the 41 incidents closed as unknown")
    except WaitTimeout:
        pytest.fail(f"open: {[i['backend'] for i in w.store.active_incidents()][:5]}...")
    queries = w.prometheus.queries - before
    assert queries <= 4, f"41 webhooks about unknown backends cost {queries} targets queries"
    assert w.calls == []
    closed = w.store.events(kind="closed", limit=100)
    assert len(closed) == 41 and all("no longer configured" in e.reason for e in closed)


def test_an_alert_about_a_backend_discovered_after_the_webhook_is_not_lost(w: World) -> None:
    """The race the synchronous refresh used to cover: the alert arrives before this worker's discovery
    has seen the backend. The incident waits for a refresh, then finds it and restarts it."""
    w.publish()
    w.prometheus.targets = [pod("vllm-7", "10.0.0.7:8000")]     # Prometheus knows it; this worker not yet
    assert w.app.extensions["remediator"].config.backend("vllm-7") is None
    assert w.post(payload(alert("vllm-7"))).status_code == 202
    w.run_until(lambda: w.calls, "vllm-7 found and restarted")
    assert w.calls == [("restart-pod", "llm", "vllm-7")]
    assert "waiting_for_discovery" in w.kinds("vllm-7")


@pytest.mark.parametrize("group", [{"namespace": "staging"}, {"team": "b"}], ids=["namespace", "custom"])
def test_another_groups_alert_about_a_backend_discovered_after_the_webhook_restarts_nothing(
        tmp_path: Path, group: dict[str, str]) -> None:
    """The same race with group labels: the backend is found only after the webhook recorded the alert
    (the refresh between two looks, the usual case), and the alert is another group's (another namespace,
    another team): its labels were compared only when the refresh came within the look that waited for
    it, so the next look restarted the backend of the other group."""
    name = next(iter(group))
    w = discovered(tmp_path, group_labels=[name])
    try:
        w.publish()
        w.prometheus.targets = [pod("vllm-7", "10.0.0.7:8000", team="a")]   # namespace llm, team a
        assert w.app.extensions["remediator"].config.backend("vllm-7") is None
        assert w.post(payload(alert("vllm-7", **group))).status_code == 202
        w.run_until(lambda: w.store.active_incident("vllm-7") is None or w.calls, "vllm-7 decided")
        assert w.calls == []
        closed = [e.reason for e in w.store.events(backend="vllm-7", kind="closed")]
        assert closed and "not this backend's alert" in closed[0], w.kinds("vllm-7")
    finally:
        w.close()


def test_its_own_groups_alert_about_a_backend_discovered_after_the_webhook_restarts_it(tmp_path: Path) -> None:
    w = discovered(tmp_path, group_labels=["namespace", "team"])
    try:
        w.publish()
        w.prometheus.targets = [pod("vllm-7", "10.0.0.7:8000", team="a")]
        assert w.post(payload(alert("vllm-7", namespace="llm", team="a"))).status_code == 202
        w.run_until(lambda: w.calls, "vllm-7 found and restarted")
        assert w.calls == [("restart-pod", "llm", "vllm-7")]
    finally:
        w.close()


def test_an_alert_for_a_proxy_or_an_invalid_name_is_still_ignored(w: World) -> None:
    w.publish(pod("vllm-0"))
    w.post(payload(alert("a b"), alert(None, instance="10.9.9.9:1")))
    assert len(w.store.events(kind="ignored")) == 2 and not w.store.active_incidents()


def test_a_discovered_backend_mid_restart_survives_a_remediator_start_while_prometheus_is_down(tmp_path: Path) -> None:
    """The remediator (re)starts while Prometheus is down (a host reboot): its discovery has no answer, so
    a discovered backend in the middle of a restart is unknown. Its incident must not be closed as 'no
    longer configured' (that left the lifecycle owned by a closed incident: host mutex held, every later
    restart of the backend deferred forever). Once discovery answers without it, the incident closes
    and the lifecycle is released."""
    w = four_backends(tmp_path)
    import dataclasses

    from llm_health.config import DiscoverySettings
    from llm_health.discovery import Discovery, LiveBackends

    w.post(payload(alert()))
    w.run(3)
    assert w.incident().state == "warming"                    # restarted, not warm yet (ready False)
    config = w.authority.ctx.config
    gpu_a = config.backend("gpu-a")
    answer: dict[str, Any] = {"targets": None}

    def fetch() -> list[Any]:
        if answer["targets"] is None:
            raise OSError("connection refused")                  # Prometheus down
        return answer["targets"]

    d = Discovery(DiscoverySettings(prometheus_url="http://127.0.0.1:9", selector='job="vllm"'),
                  static=(), fetch=fetch)
    static = tuple(b for b in config.backends if b.name != "gpu-a")
    live = dataclasses.replace(config, backends=LiveBackends(static, d))
    w.authority.ctx.config = live
    d.refresh()
    w.clock.advance(10)
    w.run(3)
    inc = w.incident()
    assert inc is not None and inc.state == "warming"
    assert "waiting_for_discovery" in w.kinds("gpu-a")
    answer["targets"] = []                                       # answers, gpu-a really gone
    w.clock.advance(10)
    w.run(3)
    assert w.incident() is not None                              # no good answer yet: kept
    d.refresh()                                                  # the refresher thread's job (not started here)
    w.clock.advance(10)
    w.run(3)
    assert w.incident() is None
    with w.store.reader() as rd:
        r = rd.lifecycle("gpu-a")
        assert r.state == "error" and r.incident_id is None
    assert gpu_a is not None
