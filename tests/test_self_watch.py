"""Issue 12 (watch the watcher), in-process: each test names the finding it proves.

Real store, webhook, API and authority (Flask test client, injected clock, recorded runner).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from llm_health.remediator import retention
from llm_health.remediator.app import create_app
from llm_health.remediator.marker import file_markers
from llm_health.remediator.store import IncidentState, SqliteStore

from llm_health.config import ConfigError, parse_config
from tests.support.alerts import alert, payload
from tests.support.fakes import has_sample
from tests.support.remediator import AUTH, World, four_backends


@pytest.fixture
def w(tmp_path: Path) -> World:
    world = four_backends(tmp_path)
    yield world
    world.store.close()


def test_f1_metrics_come_from_prometheus_client_with_needs_ack_and_process_series(w: World) -> None:
    text = w.client.get("/metrics").get_data(as_text=True)
    assert "process_cpu_seconds_total" in text and "python_info" in text        # the standard series
    assert has_sample(text, 'llm_health_remediator_needs_ack{backend="gpu-a"} 0')
    assert has_sample(text, "llm_health_remediator_healthy 1")
    with w.store.tx() as tx:
        tx.move_incident(tx.open_incident("gpu-a", 1), 1, IncidentState.NEEDS_ACK)
    text = w.client.get("/metrics").get_data(as_text=True)
    assert has_sample(text, 'llm_health_remediator_needs_ack{backend="gpu-a"} 1')


# -- finding 2: /healthz tells the truth -----------------------------------------------------------
def test_f2_healthz_fails_when_the_store_cannot_be_written(w: World) -> None:
    assert w.client.get("/healthz").status_code == 200
    w.store.conn().execute("PRAGMA query_only = ON")              # this worker's connection refuses writes
    r = w.client.get("/healthz")
    assert r.status_code == 503 and "not writable" in " ".join(r.get_json()["problems"])


def test_f2_healthz_fails_on_a_corrupted_page(w: World) -> None:
    with w.store.tx() as tx:
        for i in range(300):
            tx.event(float(i), "received", reason="x" * 500)
    w.store.conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(w.store.path, "r+b") as f:                          # scribble over the middle of the file
        f.seek(4096 * 6)
        f.write(os.urandom(4096 * 4))
    w.client.application.extensions["remediator"].health._integrity = None
    r = w.client.get("/healthz")
    assert r.status_code == 503, r.get_json()


def test_f2_startup_refuses_a_damaged_state(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    store.init()
    with store.tx() as tx:
        for i in range(300):
            tx.event(float(i), "received", reason="x" * 500)
    store.conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    with open(path, "r+b") as f:
        f.seek(4096 * 6)
        f.write(os.urandom(4096 * 4))
    with pytest.raises(Exception, match="integrity|malformed|not a database"):
        SqliteStore(path).init()


def test_f2_healthz_fails_when_the_authority_loop_stops(w: World) -> None:
    health = w.client.application.extensions["remediator"].health
    health.authority = w.authority
    assert w.client.get("/healthz").status_code == 200
    w.authority.last_pass -= 10_000                               # the loop has not come round for hours
    r = w.client.get("/healthz")
    assert r.status_code == 503 and "authority loop" in " ".join(r.get_json()["problems"])


# -- finding 3: a deleted or replaced state file stops the store, never a second one ----------------
@pytest.mark.parametrize("how", ["delete", "replace"])
def test_f3_state_file_deleted_or_replaced_stops_acting(w: World, how: str) -> None:
    path = Path(w.store.path)
    if how == "delete":
        path.unlink()
    else:
        other = path.with_name("other.db")
        sqlite3.connect(other).close()
        os.replace(other, path)
    r = w.client.get("/healthz")
    assert r.status_code == 503 and how[:6] in " ".join(r.get_json()["problems"])
    assert w.post(payload(alert())).status_code == 503                # says why instead of acting
    with pytest.raises(Exception, match="deleted|replaced"):
        w.authority.lease.renew()
    if how == "delete":
        assert not path.exists()                                      # no new database behind our back


# -- finding 4: safe by default ------------------------------------------------------------------
def test_f4_no_token_refused_unless_insecure_and_loopback(tmp_path: Path) -> None:
    base = {"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:1"}]}

    def cfg(**r: object) -> object:
        return parse_config({**base, "remediator": {"state": "s.db", **r}}, source=str(tmp_path / "c.yml"))

    with pytest.raises(ConfigError, match="token"):
        create_app(cfg(), with_authority=False)
    with pytest.raises(ConfigError, match="loopback"):
        create_app(cfg(insecure_no_auth=True, listen="0.0.0.0:9411"), with_authority=False)
    app = create_app(cfg(insecure_no_auth=True, listen="127.0.0.1:9411"), with_authority=False)
    client = app.test_client()
    assert client.post("/api/busy", json={"backend": "gpu-a", "owner": "me"}).status_code == 201
    # a cross-site page: text/plain body, or a foreign Origin, or a rebound Host name
    plain = client.post("/api/busy", data=json.dumps({"backend": "gpu-a", "owner": "evil", "ttl_seconds": 600000}),
                        content_type="text/plain")
    assert plain.status_code == 415
    assert client.post("/api/breaker/reset", headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.post("/api/backends/gpu-a/ack", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert client.post("/api/breaker/reset", headers={"Host": "evil.example:9411"}).status_code == 403
    assert client.post("/api/breaker/reset", data="", content_type="text/plain").status_code == 415
    assert client.post("/api/breaker/reset").status_code == 200       # curl-like, no body: fine


def test_f4_origin_checked_with_a_token_too(w: World) -> None:
    r = w.client.post("/api/breaker/reset", headers={**AUTH, "Origin": "http://evil.example"})
    assert r.status_code == 403
    r = w.client.post("/webhook", data=json.dumps(payload(alert())), content_type="text/plain", headers=AUTH)
    assert r.status_code == 415


def test_f10_unauthenticated_gets_redact_credentials_and_hide_output(tmp_path: Path) -> None:
    w = four_backends(tmp_path)
    try:
        secret_url = "http://admin:hunter2@10.0.0.5:8000"
        with w.store.tx() as tx:
            tx.event(1.0, "failed", "gpu-a", reason=f"could not reach {secret_url}",
                     output="restart failed: password=hunter2", url=secret_url)
        for path in ("/api/events", "/", "/api/backends"):
            body = w.client.get(path).get_data(as_text=True)
            assert "hunter2" not in body, path
        authed = w.client.get("/api/events", headers=AUTH).get_json()["events"][0]
        assert "password=hunter2" in authed["detail"]["output"]      # the operator with the token sees it
    finally:
        w.store.close()


def test_f10_world_readable_token_file_is_reported(tmp_path: Path) -> None:
    from llm_health.remediator.web.tokens import token_file_warning

    (tmp_path / "token").write_text("t\n")
    cfg = parse_config({"remediator": {"token_file": "token"}}, source=str(tmp_path / "c.yml"))
    os.chmod(tmp_path / "token", 0o644)
    assert "chmod 600" in token_file_warning(cfg)
    os.chmod(tmp_path / "token", 0o600)
    assert token_file_warning(cfg) == ""


# -- findings 6 and 10: every stored event renders; bad input is a 400 ------------------------------
def test_f6_f10_fuzzed_webhook_never_breaks_a_view(w: World) -> None:
    cyrillic = "Ж" * 200
    long_labels = {f"label{i}": cyrillic for i in range(7)}
    bodies: list[tuple[object, int]] = [
        (payload(alert(**long_labels)), 202),                                        # finding 6
        (payload(alert(backend="нет", **long_labels)), 202),
        (payload(alert(alertname="x" * 1024, **{f"k{i}": "ü" * 1024 for i in range(20)})), 202),
        (payload(alert(summary="emoji 🔥 " * 100)), 202),
    ]
    for body, code in bodies:
        assert w.post(body).status_code == code
    raw_cases = [
        "[" * 100_000 + "]" * 100_000,                                                 # deeply nested
        json.dumps({"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
        '{"version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {"backend": "\\ud800"}}]}',
        '{"version": "4", "alerts": [{"status": "firing", "labels": {"\\udfff": "x"}}]}',
        "\xff\xfe not utf-8",
        "null", "[]", '"string"', "1e999999", '{"alerts": {}}', '{"version": 4}',
    ]
    for raw in raw_cases:
        r = w.client.post("/webhook", data=raw.encode("utf-8", "surrogateescape"), headers=AUTH,
                          content_type="application/json")
        assert r.status_code == 400, (raw[:60], r.status_code, r.get_data(as_text=True)[:200])
    w.run(3)
    for path in ("/", "/api/events?limit=500", "/api/backends", "/metrics"):
        r = w.client.get(path)
        assert r.status_code == 200, path
    for e in w.client.get("/api/events?limit=500").get_json()["events"]:
        assert isinstance(e["detail"], dict)


def test_f6_an_event_cut_by_an_older_version_still_renders(w: World) -> None:
    w.store.conn().execute("INSERT INTO events (at, kind, reason, detail) VALUES (1, 'ignored', 'old', ?)",
                           ('{"labels": {"a": "\\u04',))
    assert w.client.get("/").status_code == 200
    assert w.client.get("/api/events").status_code == 200


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


# -- finding 7: markers without holes ---------------------------------------------------------------
def test_f7_marker_names_match_exactly(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "gpu.a").write_text("")
    (busy / ".gpu").write_text("")
    assert file_markers(busy, "gpu", 100, now=time.time()) == ()     # gpu.a is backend gpu.a's, .gpu is hidden
    assert [m.id for m in file_markers(busy, "gpu.a", 100, now=time.time())] == ["file:gpu.a"]
    with pytest.raises(ConfigError, match="name"):
        parse_config({"backends": [{"name": ".gpu", "url": "http://127.0.0.1:1"}]})


def test_f7_every_marker_has_a_ttl_cap(w: World, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir(exist_ok=True)
    (busy / "gpu-a").write_text("ttl=99999999999\n")
    (m,) = file_markers(busy, "gpu-a", 3600, 86400, now=time.time())
    assert m.expires_at <= os.stat(busy / "gpu-a").st_mtime + 86400
    r = w.client.post("/api/busy", json={"backend": "gpu-a", "owner": "me", "ttl_seconds": 7 * 86400}, headers=AUTH)
    assert r.status_code == 400 and "marker_max_ttl" in r.get_json()["error"]
    with pytest.raises(ConfigError, match="busy_file_ttl"):
        parse_config({"remediator": {"busy_file_ttl": 100000, "marker_max_ttl": 3600}})


# -- finding 9: retention and pagination ------------------------------------------------------------
def test_f9_events_and_actions_are_pruned_and_events_paginated(tmp_path: Path) -> None:
    w = four_backends(tmp_path, retention={"max_events": 50, "max_actions": 5, "page_size": 20, "max_age": 86400})
    try:
        now = w.clock()
        with w.store.tx() as tx:
            for i in range(200):
                tx.event(now - 10 * 86400 + i, "received", reason=f"old {i}")
            for i in range(120):
                tx.event(now - 100 + i * 0.1, "received", reason=f"new {i}")
            for i in range(12):
                at = now - 30 * 86400 + i
                tx.finish_action(tx.add_action(0, "gpu-b", "[]", "h", at, at, ""), at, "ok")
        before = w.client.get("/metrics").get_data(as_text=True)
        assert has_sample(before, 'llm_health_remediator_restarts_total{backend="gpu-b",result="ok"} 12')
        retention.prune(w.store, w.authority.ctx.config, now)
        n_events = w.store.conn().execute("SELECT count(*) FROM events").fetchone()[0]
        n_actions = w.store.conn().execute("SELECT count(*) FROM actions").fetchone()[0]
        assert n_events == 50 and n_actions == 0
        after = w.client.get("/metrics").get_data(as_text=True)    # a counter never goes down
        assert has_sample(after, 'llm_health_remediator_restarts_total{backend="gpu-b",result="ok"} 12')
        seen: list[int] = []
        page = w.client.get("/api/events?limit=10000").get_json()
        assert len(page["events"]) == 20
        while True:
            seen += [e["id"] for e in page["events"]]
            if page["next_before"] is None:
                break
            page = w.client.get(f"/api/events?limit=20&before={page['next_before']}").get_json()
        assert len(seen) == len(set(seen)) == 50 and seen == sorted(seen, reverse=True)
    finally:
        w.store.close()


def test_f9_restart_history_inside_the_policy_windows_is_kept(tmp_path: Path) -> None:
    w = four_backends(tmp_path, retention={"max_actions": 1, "max_age": 3600})
    try:
        now = w.clock()
        with w.store.tx() as tx:
            for i in range(3):
                tx.finish_action(tx.add_action(0, "gpu-a", "[]", "h", now - 7000 + i, now - 7000 + i, ""),
                                 now - 6999 + i, "ok")
        retention.prune(w.store, w.authority.ctx.config, now)
        assert len(w.store.restart_times("gpu-a", since=now - 10000)) == 3
    finally:
        w.store.close()
