"""The PostgreSQL store (remediator/store/postgresql/) against a real server (tests/support/postgres.py):
the same schema as SQLite, its version recorded and a newer one refused, one migration when several
remediators start at once, writers serialised across connections, a database swapped behind our back
refused, no password in a URL, and an unreachable server a StateError within its deadline."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from pathlib import Path

import psycopg
import pytest

from llm_health.config import ConfigError, parse_config
from llm_health.drill.postgres import PostgresServer
from llm_health.remediator.store import Lease, SqliteStore, StateError, store_for
from llm_health.remediator.store.postgresql import PostgresStore
from llm_health.remediator.store.postgresql.conn import translate
from llm_health.remediator.store.sqlite.schema import SCHEMA_VERSION


def columns_sqlite(path: Path) -> dict[str, set[tuple[str, bool]]]:
    with sqlite3.connect(path) as c:
        tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                                          "'sqlite_%'")]
        return {t: {(r[1], bool(r[3]) or bool(r[5])) for r in c.execute(f"PRAGMA table_info({t})")} for t in tables}


def columns_pg(url: str) -> dict[str, set[tuple[str, bool]]]:
    with psycopg.connect(url) as c:
        rows = c.execute("SELECT table_name, column_name, is_nullable = 'NO' FROM information_schema.columns "
                         "WHERE table_schema = 'public'").fetchall()
    out: dict[str, set[tuple[str, bool]]] = {}
    for table, column, not_null in rows:
        out.setdefault(table, set()).add((column, bool(not_null)))
    return out


def indexes_sqlite(path: Path) -> set[str]:
    with sqlite3.connect(path) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE "
                                        "'sqlite_%'")}


def indexes_pg(url: str) -> set[str]:
    """The named indexes (not those of primary keys and unique constraints, which SQLite names itself)."""
    with psycopg.connect(url) as c:
        rows = c.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public' AND indexname NOT IN "
                         "(SELECT conname FROM pg_constraint)").fetchall()
    return {r[0] for r in rows}


def test_the_schema_is_the_sqlite_schema_at_the_same_version(tmp_path: Path, pg_url: str) -> None:
    SqliteStore(tmp_path / "s.db").init()
    store = PostgresStore(pg_url)
    store.init()
    store.close()
    pg = columns_pg(pg_url)
    assert pg.pop("schema_version") >= {("version", True), ("state_id", True)}
    assert pg == columns_sqlite(tmp_path / "s.db")
    assert indexes_pg(pg_url) == indexes_sqlite(tmp_path / "s.db")
    assert "deliveries_first_seen" in indexes_pg(pg_url)
    with psycopg.connect(pg_url) as c:
        assert c.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION


def test_a_newer_schema_is_refused(pg_url: str) -> None:
    PostgresStore(pg_url).init()
    with psycopg.connect(pg_url) as c:
        c.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StateError, match="newer than this remediator knows"):
        PostgresStore(pg_url).init()


def test_remediators_starting_at_once_migrate_once_and_share_one_state(pg_url: str) -> None:
    stores = [PostgresStore(pg_url) for _ in range(4)]
    errors: list[BaseException] = []

    def start(s: PostgresStore) -> None:
        try:
            s.init()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len({s.state_id for s in stores}) == 1 and stores[0].state_id
    for s in stores:
        s.close()


def test_the_urls_search_path_puts_the_state_in_its_own_schema(pg_url: str) -> None:
    """`?options=-csearch_path%3D...` (the state in a schema of its own on a shared database): the store's own
    session options (statement and lock timeouts) used to replace the URL's, so the state went to `public`."""
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("CREATE SCHEMA llmh_a")
        c.execute("CREATE SCHEMA llmh_b")
    stores = [PostgresStore(f"{pg_url}?options=-csearch_path%3D{name}") for name in ("llmh_a", "llmh_b")]
    for store in stores:
        store.init()
    with stores[0].tx() as tx:
        tx.event(1.0, "lease_acquired", reason="in a")
    with psycopg.connect(pg_url) as c:
        tables = c.execute("SELECT table_schema, count(*) FROM information_schema.tables WHERE table_name = 'events' "
                           "GROUP BY 1 ORDER BY 1").fetchall()
        in_a = c.execute("SELECT count(*) FROM llmh_a.events WHERE kind = 'lease_acquired'").fetchone()[0]
        in_b = c.execute("SELECT count(*) FROM llmh_b.events WHERE kind = 'lease_acquired'").fetchone()[0]
    assert tables == [("llmh_a", 1), ("llmh_b", 1)] and (in_a, in_b) == (1, 0)
    # and the store's own session settings still hold beside the URL's
    assert stores[0]._db().execute("SHOW statement_timeout").fetchone()[0] == "10s"
    for store in stores:
        store.close()


def test_writers_are_serialised_across_connections(pg_url: str) -> None:
    """Read-then-write in one transaction from 4 threads on 2 stores (2 processes' pools): no lost update,
    as with SQLite's BEGIN IMMEDIATE."""
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    a.init()
    b.init()

    def work(store: PostgresStore) -> None:
        for _ in range(25):
            with store.tx() as tx:
                row = tx.lease("n") or Lease("n", "h", 0.0, "", 0)
                time.sleep(0.002)      # widen the window a lost update would need
                tx.put_lease(dataclasses.replace(row, epoch=row.epoch + 1))

    threads = [threading.Thread(target=work, args=(s,)) for s in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    row = a.lease("n")
    assert row is not None and row.epoch == 100
    a.close()
    b.close()


def test_a_writer_frozen_inside_its_transaction_holds_the_others_for_seconds_not_a_minute(pg_url: str) -> None:
    """A leader stopped (SIGSTOP, a paused VM) inside a write transaction keeps WRITE_LOCK: the other
    remediator's takeover and webhooks waited for it until PostgreSQL ended the idle transaction, after 60 s
    (each waiter failing at lock_timeout, 10 s, meanwhile). Now it is ended while the lease still runs,
    the other's write goes through inside its lock_timeout, and the frozen one's commit fails."""
    frozen, other = PostgresStore(pg_url), PostgresStore(pg_url)
    frozen.init()
    other.init()
    holding, resumed, outcome = threading.Event(), threading.Event(), []

    def freeze() -> None:
        try:
            with frozen.tx() as tx:
                tx.put_lease(Lease("n", "frozen", 0.0, "", 1))
                tx.lease("n")                   # a read: the first round trip, the lock is held from here
                holding.set()
                resumed.wait(15)                # stopped between two statements, the lock held
        except StateError as exc:
            outcome.append(str(exc))

    t = threading.Thread(target=freeze, daemon=True)
    t.start()
    assert holding.wait(30)
    with other.tx() as tx:                      # waits for the lock: at most lock_timeout (10 s), then StateError
        tx.put_lease(Lease("n", "other", 0.0, "", 2))
    lease = other.lease("n")
    assert lease is not None and lease.holder == "other"
    resumed.set()                               # SIGCONT: its transaction is gone
    t.join(30)
    assert outcome and "not reachable" in outcome[0], outcome   # the frozen one's transaction was ended
    frozen.close()
    other.close()


def test_an_error_inside_a_transaction_writes_nothing(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.init()
    with pytest.raises(RuntimeError), store.tx() as tx:
        tx.open_incident("gpu-a", 1.0)
        raise RuntimeError("boom")
    assert store.active_incidents() == []
    store.close()


def test_a_database_created_again_behind_our_back_stops_the_store(pg_server: PostgresServer) -> None:
    url = pg_server.new_database()
    store = PostgresStore(url)
    store.init()
    store.close()                                     # its connections go, the object stays
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(pg_server.url(), autocommit=True) as c:
        c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    with pytest.raises(StateError, match="not the one this remediator opened"):
        with store.tx() as tx:
            tx.open_incident("gpu-a", 1.0)
    assert store.check_identity()                     # sticky: health reports it
    with psycopg.connect(url) as c:
        assert c.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'incidents'").fetchone()[0] == 0
    store.close()


def test_a_password_in_the_url_is_refused_and_never_echoed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="carries a password") as info:
        parse_config({"remediator": {"state": "postgresql://u:s3cret@127.0.0.1:5432/db"}})
    assert "s3cret" not in str(info.value)
    with pytest.raises(StateError, match="carries a password") as info2:
        PostgresStore("postgresql://u:s3cret@127.0.0.1:5432/db")
    assert "s3cret" not in str(info2.value)
    with pytest.raises(ConfigError, match="name the database"):
        parse_config({"remediator": {"state": "postgresql://u@127.0.0.1:5432"}})


def test_the_password_comes_from_its_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("hunter2\n")
    config = parse_config({"remediator": {"state": "postgresql://u@127.0.0.1:9/db", "state_password_file": "pw"}},
                          source=str(tmp_path / "c.yml"))
    store = store_for(config)
    assert isinstance(store, PostgresStore) and store._kwargs()["password"] == "hunter2"
    assert "hunter2" not in store.where and "hunter2" not in store.url


def test_an_unreachable_database_is_a_state_error_within_its_deadline() -> None:
    from llm_health.drill.procs import free_port

    store = PostgresStore(f"postgresql://llmhealth@127.0.0.1:{free_port()}/nothing", timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(StateError, match="not reachable"):
        store.init()
    with pytest.raises(StateError, match="not reachable"):
        store.active_incidents()
    assert time.monotonic() - t0 < 15
    store.close()


def test_placeholders_are_translated_and_percent_kept() -> None:
    assert translate("SELECT 1 WHERE a = ? AND b LIKE '5%'") == "SELECT 1 WHERE a = %s AND b LIKE '5%%'"
