"""`llm-health remediator migrate`: a SQLite state copied into PostgreSQL (remediator/migrate.py,
remediator/store/transfer.py), on a real SQLite file and a real PostgreSQL database."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_health.cli import main
from llm_health.drill.procs import llm_health
from llm_health.remediator.clock import Clocks, boot_id
from llm_health.remediator.lease import NAME, AuthorityLease
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.policy import Marker
from llm_health.remediator.store import (
    AdminState,
    CaptureResult,
    Heard,
    IncidentState,
    Lease,
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
    Silence,
    SqliteStore,
    StateError,
)
from llm_health.remediator.store.postgresql import PostgresStore
from llm_health.remediator.store.sqlite.schema import SCHEMA_VERSION
from llm_health.remediator.store.transfer import copy_state

T = 1_700_000_000.0


def build_sqlite(path: Path) -> SqliteStore:
    """A SQLite state with a row in every table, written through the store's verbs."""
    store = SqliteStore(path)
    store.init()
    with store.tx() as tx:
        inc = tx.open_incident("gpu-a", T, labels=(("cluster", "east"),))
        tx.alert_firing(inc, "fp1", "2026-01-01T00:00:00Z", "VLLMStalled")
        tx.alert_firing(inc, "fp2", "2026-01-01T00:00:01Z", "VLLMDown")
        tx.move_incident(inc, T + 1, IncidentState.RESTARTING, last_note="restart asked", warm_deadline=500.0)
        act = tx.add_action(inc, "gpu-a", '["systemctl", "restart", "vllm"]', "host-1:1", T + 2, 50.0, "boot-1")
        tx.finish_action(act, T + 9, "ok", 0, "restarted")
        tx.add_capture(inc, "gpu-a", T + 1.5, '["py-spy"]', CaptureResult.OK, 0, 0.5, "stacks", False)
        tx.event(T + 1, "restart", "gpu-a", inc, "stalled for 60s", threshold=60)
        tx.event(T + 3, "note", "gpu-b", None, "second event")
        tx.move_lifecycle("gpu-a", LifecycleState.READY, T + 10, "verified", inc)
        tx.add_marker(Marker("m-1", "gpu-b", "batch", T + 3600), T + 4)
        tx.add_silence(Silence("s-1", "gpu-a", inc, T + 5, T + 600))
        tx.set_admin("gpu-c", AdminState.DRAINED, T + 6, "alice", "disk swap")
        rid = tx.add_rollout(Rollout(0, RolloutState.RUNNING, ("vllm", "--v2"), 1, 1, 300.0, {"max_errors": 0.01},
                                     "bob", "upgrade", T + 7, T + 7),
                             [RolloutMember(0, "gpu-a", "host-1", 0, True, MemberStep.PENDING, ("vllm", "--v2"),
                                            None),
                              RolloutMember(0, "gpu-b", "host-2", 1, False, MemberStep.PENDING, ("vllm", "--v2"),
                                            ("vllm",))])
        tx.update_member(rid, "gpu-a", step=MemberStep.SOAKING.value, soak_started_at=T + 8)
        tx.set_command("gpu-a", ("vllm", "--v2"), T + 8, rid)
        tx.bump("restarts", "gpu-a", 2)
        tx.open_breaker(T + 11, "too many restarts")
        tx.heard(Heard.WEBHOOK, T + 12)
        tx.remember_delivery("d-1", T + 12, 0.0)
        tx.remember_resolved("fp0", "2025-12-31T00:00:00Z", T + 12)
        tx.put_lease(Lease(NAME, "host-1:1", 1234.5, "boot-1", 3))
    return store


def snapshot(store: Any) -> dict[str, Any]:
    """Everything the typed read verbs show of the state (the migration event left out)."""
    incidents = [store.incident(i) for i in (1, 2, 3)]
    return {
        "incidents": incidents,
        "active": store.active_incidents(),
        "firing": store.firing_alerts(1),
        "actions": [store.action(i) for i in (1, 2)],
        "restart_counts": store.restart_counts(),
        "captures": store.captures(1),
        "events": [e for e in store.events(limit=1000) if e.kind != "state_migrated"],
        "lifecycles": store.lifecycles(),
        "markers": store.markers("gpu-b"),
        "silences": store.active_silences("gpu-a"),
        "admins": store.admins(),
        "rollouts": store.rollouts(),
        "members": store.rollout_members(1),
        "commands": store.commands(),
        "counters": (store.counters("restarts"), store.counters("decisions")),
        "breaker": store.breaker(),
        "heard": store.last_heard(),
        "delivery": store.delivery_seen_at("d-1"),
        "resolved": store.alert_resolved_at("fp0", "2025-12-31T00:00:00Z"),
    }


def write_config(tmp_path: Path, state: str, **remediator: Any) -> Path:
    cfg = {"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:9", "restart": ["true"]}],
           "remediator": {"state": state, **remediator}}
    path = tmp_path / "llm-health.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def migrate(tmp_path: Path, source: Path, state: str, **remediator: Any) -> int:
    return main(["remediator", "migrate", "--from", str(source), "--config", str(write_config(tmp_path, state, **remediator))])


def pg_rows(url: str) -> dict[str, int]:
    target = PostgresStore(url, timeout=5.0)
    try:
        with target.reader() as r:
            db = r._db()
            return {t: int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
                    for t in ("incidents", "actions", "events", "lease", "rollouts", "counters")}
    finally:
        target.close()


def pg_has_incidents_table(url: str) -> bool:
    target = PostgresStore(url, timeout=5.0)
    try:
        with target.reader() as r:
            return r._db().execute("SELECT to_regclass('incidents') IS NOT NULL").fetchone()[0] is True
    finally:
        target.close()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    store = build_sqlite(tmp_path / "state.db")
    store.close()
    return tmp_path / "state.db"


def test_every_row_reads_back_the_same_and_the_next_ids_are_larger(tmp_path: Path, source: Path, pg_url: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    before = source.read_bytes()
    expected = snapshot(SqliteStore(source))
    assert expected["incidents"][0] is not None and expected["actions"][0] is not None and expected["members"]
    assert expected["admins"] and expected["lifecycles"] and expected["silences"] and expected["breaker"].open

    assert migrate(tmp_path, source, pg_url) == 0
    out = capsys.readouterr().out
    assert "incidents" in out and "rollout_members" in out and "heartbeat" not in out

    target = PostgresStore(pg_url, timeout=5.0)
    target.init()
    try:
        assert snapshot(target) == expected
        lease = target.lease(NAME)
        assert lease == Lease(NAME, "host-1:1", 0.0, "boot-1", 3)      # copied expired, same term
        migrated = target.events(kind="state_migrated")
        assert len(migrated) == 1 and str(source) in migrated[0].reason
        assert migrated[0].detail["rows"]["incidents"] == 1 and migrated[0].detail["rows"]["events"] == len(expected["events"])
        with target.tx() as tx:
            new_incident = tx.open_incident("gpu-b", T + 20)
            new_rollout = tx.add_rollout(Rollout(0, RolloutState.SUCCEEDED, ("x",), 0, 1, 0.0, {}, "", "", T, T), [])
        assert new_incident == 2 and new_rollout == 2
        assert target.events(limit=1)[0].id > max(e.id for e in expected["events"])
    finally:
        target.close()
    assert source.read_bytes() == before                                # the source was only read


def test_the_first_lease_on_postgresql_takes_a_new_term(tmp_path: Path, source: Path, pg_url: str) -> None:
    assert migrate(tmp_path, source, pg_url) == 0
    store = PostgresStore(pg_url, timeout=5.0)
    store.init()
    try:
        lease = AuthorityLease(store, Clocks(wall=time.time, mono=lambda: 100.0, boot="boot-2"), "host-9:1",
                               ttl=5.0, warmup_timeout=60.0)
        assert lease.renew()
        assert lease.epoch == 4 and store.lease(NAME).epoch == 4     # type: ignore[union-attr]
    finally:
        store.close()


def test_a_second_migration_into_the_filled_target_is_refused(tmp_path: Path, source: Path, pg_url: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert migrate(tmp_path, source, pg_url) == 0
    rows = pg_rows(pg_url)
    capsys.readouterr()
    assert migrate(tmp_path, source, pg_url) == 2
    err = capsys.readouterr().err
    assert "already holds llm-health state" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert pg_rows(pg_url) == rows


def test_a_table_the_target_does_not_have_refuses_the_copy(tmp_path: Path, source: Path, pg_url: str) -> None:
    with sqlite3.connect(source) as c:
        c.execute("CREATE TABLE forgotten (id INTEGER PRIMARY KEY, what TEXT)")
        c.execute("INSERT INTO forgotten (what) VALUES ('x')")
    target = PostgresStore(pg_url, timeout=5.0)
    try:
        with pytest.raises(StateError, match="tables only in the source: forgotten"):
            copy_state(source, target)
        assert pg_rows(pg_url)["incidents"] == 0 and pg_rows(pg_url)["events"] == 0
    finally:
        target.close()


def test_a_column_the_target_does_not_have_refuses_the_copy(tmp_path: Path, source: Path, pg_url: str) -> None:
    with sqlite3.connect(source) as c:
        c.execute("ALTER TABLE incidents ADD COLUMN extra TEXT")
    target = PostgresStore(pg_url, timeout=5.0)
    try:
        with pytest.raises(StateError, match=r"incidents: columns only in the source \['extra'\]"):
            copy_state(source, target)
    finally:
        target.close()


def test_an_older_source_is_refused_and_left_as_it_was(tmp_path: Path, source: Path, pg_url: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with sqlite3.connect(source) as c:
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    before = source.read_bytes()
    assert migrate(tmp_path, source, pg_url) == 2
    assert f"older than {SCHEMA_VERSION}: start the current remediator on it once" in capsys.readouterr().err
    assert source.read_bytes() == before


def test_a_newer_source_is_refused(tmp_path: Path, source: Path, pg_url: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with sqlite3.connect(source) as c:
        c.execute("PRAGMA user_version = 99")
    assert migrate(tmp_path, source, pg_url) == 2
    assert "newer than this llm-health knows" in capsys.readouterr().err


def test_a_source_in_use_by_a_running_remediator_is_refused(tmp_path: Path, source: Path, pg_url: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    store = SqliteStore(source)
    with store.tx() as tx:
        tx.put_lease(Lease(NAME, "host-1:1", time.monotonic() + 60, boot_id(), 3))
    store.close()
    assert migrate(tmp_path, source, pg_url) == 2
    assert "is in use: its lease is held" in capsys.readouterr().err
    assert not pg_has_incidents_table(pg_url)                           # refused before the target was touched


def test_a_missing_source_is_refused(tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert migrate(tmp_path, tmp_path / "nope.db", pg_url) == 2
    err = capsys.readouterr().err
    assert "nope.db: no such file" in err and "Traceback" not in err


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path, pg_url: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "junk.db").write_bytes(b"not sqlite at all" * 100)
    assert migrate(tmp_path, tmp_path / "junk.db", pg_url) == 2
    assert "is not a usable SQLite state" in capsys.readouterr().err


def test_a_file_target_is_refused(tmp_path: Path, source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert migrate(tmp_path, source, "other.db") == 2
    assert "not a postgresql:// URL" in capsys.readouterr().err


def test_a_password_in_the_url_is_refused_and_never_printed(tmp_path: Path, source: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert migrate(tmp_path, source, "postgresql://llmh:s3cret-pw@127.0.0.1:5432/llmh") == 2
    captured = capsys.readouterr()
    assert "carries a password" in captured.err
    assert "s3cret-pw" not in captured.err + captured.out


def test_the_command_says_an_unreachable_target_in_one_line(tmp_path: Path, source: Path) -> None:
    """As an operator's terminal shows it: a process of its own, so no test's logging handler hides the pool's
    retry warnings (before the fix, one 'error connecting' pair of lines per attempt came first)."""
    config = write_config(tmp_path, "postgresql://llmh@127.0.0.1:1/llmh", state_timeout=1.0)
    done = subprocess.run(llm_health("remediator", "migrate", "--from", source, "--config", config),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "not reachable" in done.stderr, done.stderr


def test_an_unreachable_target_is_refused_within_its_timeout(tmp_path: Path, source: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    assert migrate(tmp_path, source, "postgresql://llmh@127.0.0.1:1/llmh", state_timeout=1.0) == 2
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err
    assert "not reachable" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_server_still_wants_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["remediator"]) == 2
    assert "--config: required" in capsys.readouterr().err
