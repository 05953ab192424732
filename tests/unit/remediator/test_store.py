"""The store owns every SQL statement, records its schema version, and keeps what it is given whole; an
older state file gets the new columns, a damaged one is refused at start-up, a deleted or replaced one
stops the store (never a second one)."""

from __future__ import annotations

import dataclasses
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.exporter.reading import EngineReading, Reading, Sleep
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.store import IncidentState, SqliteStore, StateError
from llm_health.remediator.store.sqlite.schema import SCHEMA_VERSION, _baseline
from tests.support.alerts import alert, payload
from tests.support.remediator import World, four_backends

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("llm_health", "exporter", "remediator", "simulator")      # what the wheel ships
STORE = ROOT / "remediator" / "store"
#: SQL statements as this code base writes them (upper case), and the calls that run them
SQL = re.compile(r"\b(?:SELECT\s+(?:\*|[\w(])|INSERT\s+(?:OR\s+\w+\s+)?INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s"
                 r"|CREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX)\s|ALTER\s+TABLE\s|PRAGMA\s+\w)")
DRIVER = re.compile(r"\.execute(?:many|script)?\(|^\s*(?:import|from)\s+(?:sqlite3|psycopg)\b", re.MULTILINE)


def sql_in(text: str) -> list[str]:
    return [m.group(0) for m in SQL.finditer(text)] + [m.group(0).strip() for m in DRIVER.finditer(text)]


def test_the_scan_finds_sql_and_driver_calls() -> None:
    """The boundary test below can fail: these lines are what it looks for."""
    assert sql_in('c.execute("UPDATE incidents SET state = ?", (s,))') == ["UPDATE incidents SET ", ".execute("]
    assert sql_in("q = 'SELECT * FROM events'\n") == ["SELECT *"]
    assert sql_in("import sqlite3\n") == ["import sqlite3"]
    assert sql_in('fetch("DELETE", url)  # an HTTP method, not SQL\nMAX_SELECTOR_LENGTH = 2') == []


def test_no_sql_outside_the_store() -> None:
    found = {}
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if STORE in path.parents:
                continue
            hits = sql_in(path.read_text())
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}, f"SQL or a database driver outside remediator/store/: {found}"


# -- the schema version -------------------------------------------------------------------------------
def version(path: Path) -> int:
    with sqlite3.connect(path) as c:
        return int(c.execute("PRAGMA user_version").fetchone()[0])


def test_a_new_state_records_its_schema_version(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    store.close()
    assert version(tmp_path / "state.db") == SCHEMA_VERSION


def test_a_state_from_before_the_version_is_migrated_forward(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as c:        # an incidents table of the first release, no version recorded
        c.execute("CREATE TABLE incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, backend TEXT NOT NULL, "
                  "state TEXT NOT NULL, opened_at REAL NOT NULL, updated_at REAL NOT NULL, closed_at REAL, "
                  "close_reason TEXT NOT NULL DEFAULT '', next_check_at REAL NOT NULL DEFAULT 0, "
                  "last_note TEXT NOT NULL DEFAULT '', warm_deadline REAL, last_decision TEXT NOT NULL DEFAULT '')")
        c.execute("INSERT INTO incidents (backend, state, opened_at, updated_at) VALUES ('gpu-a', 'open', 1, 1)")
    store = SqliteStore(path)
    store.init()
    (inc,) = store.active_incidents()
    assert inc.state == IncidentState.OPEN and inc.verified_outcome is None and inc.unresponsive_seen_at is None
    store.close()
    assert version(path) == SCHEMA_VERSION


def test_a_state_of_a_newer_remediator_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    store.init()
    store.close()
    with sqlite3.connect(path) as c:
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    message = f"state schema {SCHEMA_VERSION + 1} is newer than this remediator knows ({SCHEMA_VERSION})"
    with pytest.raises(StateError, match=re.escape(message)):
        SqliteStore(path).init()                                    # the server's master, before forking
    with pytest.raises(StateError, match=re.escape(message)):
        SqliteStore(path).open()                                    # a worker
    assert version(path) == SCHEMA_VERSION + 1                      # and nothing was changed


# -- what the store keeps -------------------------------------------------------------------------------
def every_field_set() -> Reading:
    """A reading whose every field differs from its default (a field added later must be added here)."""
    engines = {"0": EngineReading(running=2, waiting=1, kv_usage=0.4, counters={"generation_tokens": 12.0},
                                  shared=True)}
    reading = Reading(flavour="llamacpp", engines=engines, process_start=1.7e9, created={"a": 1.0}, start_header=2.0,
                      server={"generation_tokens": 3.0}, sleep=Sleep.AWAKE, step_seconds=4.5,
                      prompt_seconds_per_token=0.01, prompt_timing=True, tokens_max=300.0, context_tokens=4096.0,
                      step_buckets=((10.0, 20.0, 3.0), (20.0, 40.0, 1.0)))
    defaults = Reading(flavour="", engines={})
    unset = [f.name for f in dataclasses.fields(Reading)
             if f.name not in ("flavour", "engines") and getattr(reading, f.name) == getattr(defaults, f.name)]
    assert unset == [], f"set these fields in every_field_set(): {unset}"
    return reading


def test_the_drain_baseline_keeps_every_field_of_the_reading(tmp_path: Path) -> None:
    """The old dump()/load() kept flavour, engines, process_start and created only."""
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    reading = every_field_set()
    with store.tx() as tx:
        assert tx.move_lifecycle("gpu-a", LifecycleState.READY, 1.0, "first seen: answers")
        assert tx.move_lifecycle("gpu-a", LifecycleState.DRAINING, 2.0, "restart decided", 7,
                                 drain_deadline=30.0, drain_baseline=reading)
    row = store.lifecycle("gpu-a")
    assert row is not None and row.drain_baseline == reading
    assert (row.state, row.incident_id, row.drain_deadline) == (LifecycleState.DRAINING, 7, 30.0)
    with store.tx() as tx:                                          # any other move forgets it
        assert tx.move_lifecycle("gpu-a", LifecycleState.STOPPED, 3.0, "drained", 7)
    row = store.lifecycle("gpu-a")
    assert row is not None and row.drain_baseline is None and row.drain_deadline is None
    store.close()


def test_a_baseline_no_version_can_read_is_none(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    with store.tx() as tx:
        tx.ensure_lifecycle("gpu-a", 1.0)
    store.conn().execute("UPDATE lifecycle SET drain_baseline = '{not json' WHERE backend = 'gpu-a'")
    row = store.lifecycle("gpu-a")
    assert row is not None and row.drain_baseline is None
    store.close()


# -- a damaged, deleted or replaced state file -----------------------------------------------------
@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


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


def test_older_state_file_gets_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, backend TEXT NOT NULL, "
                  "state TEXT NOT NULL, opened_at REAL NOT NULL, updated_at REAL NOT NULL, closed_at REAL, "
                  "close_reason TEXT NOT NULL DEFAULT '', next_check_at REAL NOT NULL DEFAULT 0, "
                  "last_note TEXT NOT NULL DEFAULT '', warm_deadline REAL, last_decision TEXT NOT NULL DEFAULT '')")
    store = SqliteStore(path)
    store.init()
    cols = {r[1] for r in store.conn().execute("PRAGMA table_info(incidents)").fetchall()}
    assert {"verified_outcome", "verified_at", "unresponsive_since"} <= cols
    store.close()


def test_a_version_1_state_gets_the_incidents_group_labels(tmp_path: Path) -> None:
    """Schema 2 adds incidents.labels; an open incident of a version-1 file has none and keeps its state."""
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as c:
        c.row_factory = sqlite3.Row
        _baseline(c)
        c.execute("INSERT INTO incidents (backend, state, opened_at, updated_at) VALUES ('gpu-a', 'open', 1, 1)")
        c.execute("PRAGMA user_version = 1")
    store = SqliteStore(path)
    store.init()
    (inc,) = store.active_incidents()
    assert inc.backend == "gpu-a" and inc.labels == ()
    with store.tx() as tx:
        new = tx.open_incident("gpu-b", 2.0, (("cluster", "eu-1"),))
    reread = store.incident(new)
    assert reread is not None and reread.labels == (("cluster", "eu-1"),)
    store.close()
    assert version(path) == SCHEMA_VERSION


def test_forgetting_old_deliveries_reads_only_the_old_ones(tmp_path: Path) -> None:
    """Every notification deletes the deliveries older than twice the dedup window, inside its write
    transaction: by the index on their age (schema 7), never a scan of the whole table, which grew with a
    storm and made each notification slower than the one before."""
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    plan = " ".join(str(r[3]) for r in store.conn().execute(
        "EXPLAIN QUERY PLAN DELETE FROM deliveries WHERE first_seen < ?", (1.0,)).fetchall())
    store.close()
    assert "deliveries_first_seen" in plan and "SCAN" not in plan


def test_a_version_6_state_gets_the_index_of_deliveries_by_age(tmp_path: Path) -> None:
    path = tmp_path / "v6.db"
    store = SqliteStore(path)
    store.init()
    with store.tx() as tx:
        tx.remember_delivery("k", 5.0, forget_before=0.0)
    store.close()
    with sqlite3.connect(path) as c:
        c.execute("DROP INDEX deliveries_first_seen")
        c.execute("PRAGMA user_version = 6")
    store = SqliteStore(path)
    store.init()
    names = {r[0] for r in store.conn().execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    with store.reader() as r:
        assert r.delivery_seen_at("k") == 5.0
    store.close()
    assert "deliveries_first_seen" in names and version(path) == SCHEMA_VERSION
