"""The remediator's dead man's switch in-process (Flask test client, the real store): when Alertmanager was
last heard from, stamped in the state file, exported on /metrics, never moved back, and Watchdogs alone
open nothing and add no audit event."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from flask.testing import FlaskClient

from llm_health.config import parse_config
from llm_health.remediator.app import create_app
from llm_health.remediator.store import Heard, LastHeard, SqliteStore
from llm_health.remediator.store.sqlite.schema import SCHEMA_VERSION
from tests.support.alerts import alert, payload
from tests.support.fakes import FakeClock, has_sample

TOKEN = "hb-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WEBHOOK = "llm_health_remediator_last_webhook_timestamp_seconds"
WATCHDOG = "llm_health_remediator_last_watchdog_timestamp_seconds"


def build(tmp_path: Path) -> tuple[FlaskClient, SqliteStore, FakeClock]:
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = parse_config({"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18001", "restart": ["true"]}],
                           "remediator": {"state": "state.db", "token_file": "token"}},
                          source=str(tmp_path / "llm-health.yml"))
    clock = FakeClock()
    app = create_app(config, clock=clock, with_authority=False)
    return app.test_client(), app.extensions["remediator"].store, clock


def watchdog(name: str = "Watchdog", status: str = "firing") -> dict[str, Any]:
    return alert(backend=None, alertname=name, status=status, restart=False, severity="none")


def metrics(client: FlaskClient) -> str:
    return client.get("/metrics").get_data(as_text=True)


def test_nothing_heard_yet_is_zero(tmp_path: Path) -> None:
    client, store, _ = build(tmp_path)
    assert store.last_heard() == LastHeard()
    text = metrics(client)
    assert has_sample(text, f"{WEBHOOK} 0") and has_sample(text, f"{WATCHDOG} 0")


def test_a_watchdog_is_stamped_counted_and_nothing_else(tmp_path: Path) -> None:
    client, store, clock = build(tmp_path)
    for name in ("Watchdog", "LLMHealthWatchdog"):
        clock.advance(60)
        r = client.post("/webhook", json=payload(watchdog(name)), headers=AUTH)
        assert r.status_code == 202 and r.get_json()["watchdog"] is True
        assert store.last_heard() == LastHeard(webhook_at=clock.t, watchdog_at=clock.t)
    assert store.events(limit=100) == [] and store.active_incidents() == []     # no audit noise, no incident
    text = metrics(client)
    assert has_sample(text, f"{WEBHOOK} {clock.t}") and has_sample(text, f"{WATCHDOG} {clock.t}")
    assert has_sample(text, 'llm_health_remediator_alerts_received_total{status="firing"} 2')


def test_other_notifications_stamp_the_webhook_only(tmp_path: Path) -> None:
    client, store, clock = build(tmp_path)
    assert client.post("/webhook", json=payload(watchdog()), headers=AUTH).status_code == 202
    dog = clock.t
    clock.advance(30)
    signal = alert(alertname="LLMBackendRestartLoop", restart=False)
    assert client.post("/webhook", json=payload(signal), headers=AUTH).status_code == 202
    assert store.last_heard() == LastHeard(webhook_at=clock.t, watchdog_at=dog)
    assert "received" in [e.kind for e in store.events(limit=10)]           # went through record as before
    clock.advance(30)
    assert client.post("/webhook", json=payload(watchdog(status="resolved")), headers=AUTH).status_code == 202
    assert store.last_heard() == LastHeard(webhook_at=clock.t, watchdog_at=dog)   # a resolved Watchdog: no
    clock.advance(30)
    mixed = payload(watchdog(), alert(alertname="LLMBackendRestartLoop", restart=False, starts_at="x"))
    assert client.post("/webhook", json=mixed, headers=AUTH).status_code == 202
    assert store.last_heard() == LastHeard(webhook_at=clock.t, watchdog_at=clock.t)


def test_refused_requests_are_not_heard(tmp_path: Path) -> None:
    client, store, _ = build(tmp_path)
    assert client.post("/webhook", json=payload(watchdog())).status_code == 401
    assert client.post("/webhook", json={"alerts": "no"}, headers=AUTH).status_code == 400
    assert store.last_heard() == LastHeard()


def test_the_stamp_never_moves_back_and_survives_a_new_store(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    with store.tx() as tx:
        tx.heard(Heard.WATCHDOG, 200.0)
        tx.heard(Heard.WATCHDOG, 100.0)          # a late worker with an older time
    store.close()
    again = SqliteStore(tmp_path / "state.db")
    again.open()
    assert again.last_heard() == LastHeard(webhook_at=None, watchdog_at=200.0)


def test_a_version_1_state_file_gets_the_table(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    store.init()
    store.close()
    with sqlite3.connect(path) as c:                     # as a remediator of schema 1 left it
        c.execute("DROP TABLE heard")
        c.execute("PRAGMA user_version = 1")
    store = SqliteStore(path)
    store.init()
    with store.tx() as tx:
        tx.heard(Heard.WEBHOOK, 5.0)
    assert store.last_heard() == LastHeard(webhook_at=5.0)
    store.close()
    with sqlite3.connect(path) as c:
        assert int(c.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION


def test_a_notification_is_recorded_and_stamped_in_one_write_transaction(tmp_path: Path, monkeypatch: Any) -> None:
    """Two write transactions per notification (the record, then the stamp) doubled the writers queueing
    for the state's write lock in an alert storm: one now, with both in it."""
    client, store, clock = build(tmp_path)
    opened: list[int] = []
    real_tx = store.tx

    def counted() -> Any:
        opened.append(1)
        return real_tx()

    monkeypatch.setattr(store, "tx", counted)
    clock.advance(10)
    assert client.post("/webhook", json=payload(alert()), headers=AUTH).status_code == 202
    assert len(opened) == 1
    assert store.last_heard().webhook_at == clock.t and "received" in [e.kind for e in store.events(limit=10)]
    clock.advance(10)                                   # the HA copy: deduplicated, stamped all the same
    assert client.post("/webhook", json=payload(alert()), headers=AUTH).get_json()["deduplicated"] is True
    assert len(opened) == 2 and store.last_heard().webhook_at == clock.t
