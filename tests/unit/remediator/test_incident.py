"""Alerts -> incidents (remediator/incident.py): deduplication, late resends, alerts that resolve one by one;
through the webhook and the authority: a storm of copies is one restart, an alert routed by its instance
label, signal-only alerts, unknown backends and labels full of shell metacharacters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_health.config import Config, parse_config
from llm_health.remediator.alert import parse_notification
from llm_health.remediator.incident import record
from llm_health.remediator.store import IncidentState, SqliteStore
from llm_health.remediator.store.group import GroupCommit
from llm_health.render.rules import REMEDIATION_ALERTS
from tests.support.alerts import alert, payload
from tests.support.promtool import alert_rule_list
from tests.support.remediator import AUTH, World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

WINDOW = 60.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "state.db")
    s.init()
    yield s
    s.close()


@pytest.fixture
def config() -> Config:
    return parse_config({"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18001", "restart": ["r"]}]})


def post(store: SqliteStore, config: Config, body: dict[str, Any], now: float = 1000.0) -> dict[str, Any]:
    n = parse_notification(body)
    return GroupCommit(store).run(lambda tx: record(tx, config, n, now, WINDOW))   # the webhook's way


def kinds(store: SqliteStore) -> list[str]:
    return [e.kind for e in reversed(store.events(limit=100))]


def test_the_same_notification_twice_is_one_delivery(store: SqliteStore, config: Config) -> None:
    body = payload(alert())
    assert post(store, config, body)["deduplicated"] is False
    assert post(store, config, body, now=1030.0) == {"deduplicated": True, "alerts": 1}    # an HA copy
    assert len(store.active_incidents()) == 1
    assert post(store, config, body, now=1000.0 + WINDOW + 1)["outcomes"] == ["absorbed"]  # a resend later
    assert kinds(store).count("deduplicated") == 1 and kinds(store).count("incident_opened") == 1
    assert store.counters("alerts_received") == {"firing": 3}     # every copy counted as received


def test_a_firing_resent_after_its_resolve_opens_nothing(store: SqliteStore, config: Config) -> None:
    first = alert(starts_at="2026-11-30T00:00:00Z")
    post(store, config, payload(first))
    post(store, config, payload({**first, "status": "resolved"}), now=1010.0)
    assert store.active_incidents() == []
    late = payload(first, external="http://am-1:9093")            # an HA peer's delayed copy of the firing
    late["groupKey"] += "-late"                                    # not a byte-identical duplicate
    assert post(store, config, late, now=1020.0)["outcomes"] == ["stale_firing"]
    assert store.active_incidents() == []
    again = alert(starts_at="2026-11-30T01:00:00Z")               # a new firing has a new startsAt
    assert post(store, config, payload(again), now=1030.0)["outcomes"] == ["incident_opened"]


def test_the_same_firing_after_the_resend_window_is_the_alert_still_active(store: SqliteStore, config: Config) -> None:
    """Prometheus restarted (a long WAL replay) or was cut off from Alertmanager for longer than its
    resolve_timeout: Alertmanager resolved the alert, and when Prometheus sends it again it keeps its
    startsAt (the alert never stopped). That firing, minutes after the resolution, is a failure going on,
    not a late resend: it was ignored as stale for as long as the resolution was kept (an hour and more)."""
    first = alert(starts_at="2026-11-30T00:00:00Z")
    post(store, config, payload(first))
    post(store, config, payload({**first, "status": "resolved"}), now=1010.0)
    again = payload(first)
    again["groupKey"] += "-again"
    assert post(store, config, again, now=1010.0 + WINDOW + 1)["outcomes"] == ["incident_opened"]
    # resolved once more: a late copy of that firing, within the window of the NEW resolution, is stale
    post(store, config, payload({**first, "status": "resolved"}, external="http://am-2:9093"), now=2000.0)
    assert store.active_incidents() == []
    late = payload(first, external="http://am-1:9093")
    late["groupKey"] += "-late"
    assert post(store, config, late, now=2000.0 + WINDOW / 2)["outcomes"] == ["stale_firing"]


def test_an_incident_closes_only_when_all_its_alerts_resolved(store: SqliteStore, config: Config) -> None:
    stalled, down = alert(), alert(alertname="LLMBackendDown")
    assert post(store, config, payload(stalled, down))["outcomes"] == ["incident_opened", "absorbed"]
    (inc,) = store.active_incidents()
    assert store.firing_alerts(inc.id) == 2
    assert post(store, config, payload({**stalled, "status": "resolved"}), now=1010.0)["outcomes"] == ["signal"]
    assert store.active_incident("gpu-a") is not None
    assert "1 alert(s) of the incident still firing" in store.events(kind="signal")[0].reason
    assert post(store, config, payload({**down, "status": "resolved"}), now=1020.0)["outcomes"] == ["resolved"]
    assert store.active_incident("gpu-a") is None
    closed = store.incident(inc.id)
    assert closed is not None and closed.state == IncidentState.CLOSED and closed.close_reason == "resolved"


def test_a_resolve_during_a_restart_leaves_the_incident_to_the_restart(store: SqliteStore, config: Config) -> None:
    post(store, config, payload(alert()))
    (inc,) = store.active_incidents()
    with store.tx() as tx:
        tx.move_incident(inc.id, 1001.0, IncidentState.DRAINING)
    assert post(store, config, payload(alert(status="resolved")), now=1010.0)["outcomes"] == ["signal"]
    still = store.active_incident("gpu-a")
    assert still is not None and still.state == IncidentState.DRAINING
    assert store.firing_alerts(inc.id) == 0                       # the drain's end re-verifies (draining.py)


def test_alerts_without_a_backend_or_a_restart_label_open_nothing(store: SqliteStore, config: Config) -> None:
    outcomes = post(store, config, payload(alert(backend="nope"), alert(restart=False, alertname="LLMHighErrorRate"),
                                           alert(backend=None, instance="10.9.9.9:8000")))["outcomes"]
    assert outcomes == ["ignored", "signal", "ignored"]
    assert store.active_incidents() == []


# -- through the webhook and the authority (tests.support.remediator) ------------------------------
@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_duplicate_storm_gives_one_incident_and_one_restart(w: World) -> None:
    first = payload(alert())
    assert w.post(first).status_code == 202
    assert w.post(first).status_code == 202                                     # resend
    assert w.post(payload(alert(), external="http://am-1:9093")).status_code == 202  # HA replica
    assert w.post(payload(alert(alertname="LLMBackendDown"))).status_code == 202    # another alert name
    both = payload(alert(), alert(alertname="LLMBackendDown"), alert(alertname="LLMHighErrorRate", restart=False))
    assert w.post(both).status_code == 202
    w.run(5)
    w.post(first)
    w.post(payload(alert(alertname="LLMBackendDown", starts_at="2026-11-30T00:03:00Z")))
    w.run(5)
    assert w.calls == [("restart-a", "--now")]
    kinds = w.kinds("gpu-a")
    assert kinds.count("incident_opened") == 1
    assert kinds.count("restarting") == 1 and kinds.count("restarted") == 1
    assert "absorbed" in kinds and "signal" in kinds
    assert len(w.store.events(kind="deduplicated")) == 3
    assert w.envs[0]["LLM_HEALTH_BACKEND"] == "gpu-a"


def test_instance_label_routes_to_backend(w: World) -> None:
    w.post(payload(alert(backend=None, instance="127.0.0.1:18002")))
    w.run()
    assert w.calls == [("restart-b",)]


def test_signal_only_alert_never_restarts(w: World) -> None:
    w.post(payload(alert(alertname="LLMHighErrorRate", restart=False)))
    w.run()
    assert w.calls == [] and w.incident() is None
    assert w.kinds("gpu-a") == ["signal"]


def test_every_rendered_signal_alert_is_recorded_and_never_restarts(w: World) -> None:
    """The alerts as the rules render them (every level of the two-level ones), posted to the webhook as a
    catch-all route would: all but the two restart alerts are signals; no incident, no restart argv run."""
    rules = [r for r in alert_rule_list() if r["alert"] not in REMEDIATION_ALERTS]
    names = {r["alert"] for r in rules}
    assert {"LLMQueueDepthHigh", "LLMQueueTimeHigh", "LLMTimeToFirstTokenHigh", "LLMTimeToFirstTokenSLOBreach",
            "LLMBackendAdmissionStalled", "LLMBackendDegraded", "LLMKVCachePressure"} <= names
    sent = [alert(alertname=r["alert"], restart=False, **r["labels"]) for r in rules]
    assert any(a["labels"]["severity"] == "critical" for a in sent)     # severity never decides a restart
    w.post(payload(*sent))
    w.run()
    assert w.calls == [] and w.incident() is None
    assert w.kinds("gpu-a") == ["signal"] * len(sent)


def test_unknown_backend_and_shell_metacharacters_change_nothing(w: World) -> None:
    evil = "gpu-a; rm -rf / #$(touch /tmp/pwned)`id`"
    w.post(payload(alert(backend=evil)))
    w.post(payload(alert(backend=None, instance="10.9.9.9:8000")))
    w.post(payload(alert(backend=None)))
    w.run()
    assert w.calls == []
    assert w.store.active_incidents() == []
    assert len(w.store.events(kind="ignored")) == 3
    # labels full of metacharacters on a known backend: the argv is still exactly the configured one
    w.post(payload(alert(job="$(reboot)", note="; shutdown -h now | `id` && echo")))
    w.run()
    assert w.calls == [("restart-a", "--now")]


def test_resolved_closes_an_open_incident(w: World) -> None:
    w.client.post("/api/busy", json={"backend": "gpu-a", "owner": "x", "ttl_seconds": 600}, headers=AUTH)
    w.post(payload(alert(), alert(alertname="LLMBackendDown")))
    w.run()
    w.post(payload(alert(status="resolved")))
    assert w.incident() is not None          # the other alert still fires
    w.post(payload(alert(alertname="LLMBackendDown", status="resolved")))
    assert w.incident() is None and "resolved" in w.kinds("gpu-a")


def test_f10_late_firing_after_resolved_does_not_reopen(w: World) -> None:
    first = alert(starts_at="2026-11-30T00:00:00Z")
    assert w.post(payload(first)).status_code == 202
    resolved = {**first, "status": "resolved", "endsAt": "2026-11-30T00:05:00Z"}
    assert w.post(payload(resolved)).status_code == 202
    assert w.incident() is None
    late = payload(first, external="http://am-1:9093")               # HA peer's delayed copy of the firing
    late["groupKey"] += "-late"                                      # not a byte-identical duplicate
    assert w.post(late).status_code == 202
    assert w.incident() is None
    assert "stale_firing" in w.kinds("gpu-a")
    again = alert(starts_at="2026-11-30T01:00:00Z")                  # a genuinely new firing
    assert w.post(payload(again)).status_code == 202
    assert w.incident() is not None


# -- group labels: the same backend name in another cluster or namespace is another backend ---------------
def scoped(**remediator: object) -> Config:
    return parse_config({"backends": [{"name": "vllm-0", "url": "http://127.0.0.1:18001", "restart": ["r"],
                                       "labels": {"namespace": "llm"}}],
                         "remediator": {"group_labels": {"cluster": "eu-1"}, **remediator}})


def test_another_clusters_alert_is_recorded_and_ignored(store: SqliteStore) -> None:
    config = scoped()
    body = payload(alert("vllm-0", cluster="us-2", namespace="llm"))
    assert post(store, config, body)["outcomes"] == ["ignored"]
    assert store.active_incidents() == []
    (ignored,) = [e for e in store.events(limit=10) if e.kind == "ignored"]
    assert "cluster='us-2': another group's alert (this remediator is cluster='eu-1')" in ignored.reason
    assert ignored.backend == "vllm-0"


def test_an_alert_without_the_group_label_is_not_taken_for_ours(store: SqliteStore) -> None:
    assert post(store, scoped(), payload(alert("vllm-0", namespace="llm")))["outcomes"] == ["ignored"]
    assert post(store, scoped(), payload(alert("vllm-0", cluster="eu-1")), now=1001.0)["outcomes"] == ["ignored"]
    assert store.active_incidents() == []


def test_an_incident_records_the_group_of_the_alert_that_opened_it(store: SqliteStore) -> None:
    body = payload(alert("vllm-0", cluster="eu-1", namespace="llm", pod="vllm-0-abc"))
    assert post(store, scoped(), body)["outcomes"] == ["incident_opened"]
    (inc,) = store.active_incidents()
    assert inc.labels == (("cluster", "eu-1"), ("namespace", "llm"))
    assert inc.as_dict()["labels"] == {"cluster": "eu-1", "namespace": "llm"}
    opened = next(e for e in store.events(limit=10) if e.kind == "incident_opened")
    assert opened.detail["group"] == {"cluster": "eu-1", "namespace": "llm"}


def test_two_clusters_alerts_in_one_notification_open_only_this_clusters_incident(store: SqliteStore) -> None:
    """A shared Alertmanager grouping by backend only puts both clusters' vllm-0 in one notification."""
    body = payload(alert("vllm-0", cluster="us-2", namespace="llm"), alert("vllm-0", cluster="eu-1", namespace="llm"))
    assert post(store, scoped(), body)["outcomes"] == ["ignored", "incident_opened"]
    (inc,) = store.active_incidents()
    assert dict(inc.labels)["cluster"] == "eu-1"


def test_signals_are_recorded_whatever_their_group(store: SqliteStore) -> None:
    body = payload(alert("vllm-0", restart=False, cluster="us-2", namespace="llm"))
    assert post(store, scoped(), body)["outcomes"] == ["signal"]


def test_without_group_settings_alerts_with_group_labels_still_open_incidents(store: SqliteStore,
                                                                              config: Config) -> None:
    assert post(store, config, payload(alert(cluster="eu-1", namespace="llm")))["outcomes"] == ["incident_opened"]
    (inc,) = store.active_incidents()
    assert inc.labels == (("cluster", "eu-1"), ("namespace", "llm"))
