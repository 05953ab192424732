"""remediator/store/postgresql/conn.py's BatchedDb against a real server: a write transaction's blind writes
wait in the client and travel with the next statement that must be answered, so a transaction costs one
round trip per read plus BEGIN and COMMIT, whatever it writes; the answers are the same as one statement at
a time (row counts, types, what a read sees, an error rolling everything back). That a writer frozen with
writes held still loses its lock is tests/unit/remediator/test_store_postgresql.py's frozen writer."""

from __future__ import annotations

import decimal
import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from llm_health.remediator.store import Heard, StateError
from llm_health.remediator.store.postgresql import PostgresStore
from llm_health.remediator.store.postgresql.conn import (
    PooledReads,
    blind_write,
    column_index,
    literal_safe,
    pg_row,
)
from llm_health.remediator.store.postgresql.store import WRITE_LOCK


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url)
    s.init()
    yield s
    s.close()


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every message sent to the server through psycopg.Connection.execute (one round trip each)."""
    sent: list[str] = []
    original = psycopg.Connection.execute

    def counting(self: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(query.decode() if isinstance(query, bytes) else str(query))
        return original(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counting)
    return sent


def test_writes_without_reads_are_one_round_trip(store: PostgresStore, trips: list[str]) -> None:
    with store.tx() as tx:
        tx.heard(Heard.WEBHOOK, 10.0)
        for status in ("firing", "resolved", "firing"):
            tx.bump("alerts_received", status)
        tx.remember_delivery("k1", 10.0, forget_before=0.0)
    assert len(trips) == 1, trips                         # BEGIN, lock, state id, the five writes, COMMIT
    assert trips[0].startswith("BEGIN; SELECT pg_advisory_xact_lock(") and trips[0].endswith("COMMIT")
    assert store.last_heard().webhook_at == 10.0
    with store.reader() as r:
        assert r.delivery_seen_at("k1") == 10.0


def test_a_read_sees_the_writes_before_it_and_carries_them(store: PostgresStore, trips: list[str]) -> None:
    with store.tx() as tx:
        tx.remember_delivery("k2", 20.5, forget_before=0.0)
        seen = tx.delivery_seen_at("k2")                  # text parameter: rides with the held writes
        assert seen == 20.5 and isinstance(seen, float)
        tx.heard(Heard.WATCHDOG, 21.0)
    assert len(trips) == 2, trips                         # opening, write and read; write and COMMIT


def test_a_read_with_float_parameters_rides_with_the_held_writes_and_keeps_its_types(
        store: PostgresStore, trips: list[str]) -> None:
    """Floats are bound as float8 literals (conn.py Float8Literal): a read that selects one hands back the very
    float (not a numeric's Decimal), and such a read rides with the writes before it, one round trip less."""
    given = [1.5, 0.1 + 0.2, 1777777777.1234567, float("inf"), -0.0, 5e-324, float("nan")]
    with store.tx() as tx:
        tx.remember_delivery("k3", 30.25, forget_before=0.0)
        row = tx._db().execute("SELECT first_seen, ? AS a, ? AS b, ? AS c, ? AS d, ? AS e, ? AS f, ? AS g "
                               "FROM deliveries WHERE first_seen > ?", (*given, 30.0)).fetchone()
    assert len(trips) == 2, trips                         # opening, the write and the read; COMMIT
    assert row is not None and row["first_seen"] == 30.25
    back = [row[k] for k in "abcdefg"]
    assert all(type(v) is float and not isinstance(v, decimal.Decimal) for v in back), back
    assert back[:6] == given[:6] and math.copysign(1.0, back[4]) == -1.0 and math.isnan(back[6]), back


def test_a_float_subclass_is_no_literal() -> None:
    """A float subclass may print itself otherwise (an enum, numpy's float64 with its own dumper): it is
    bound by the server, as before."""
    class Seconds(float):
        def __repr__(self) -> str:
            return "Seconds!"

    assert literal_safe((1.5,)) and not literal_safe((Seconds(1.5),))


def test_the_lock_is_taken_by_the_first_round_trip_not_before(store: PostgresStore, pg_url: str) -> None:
    with store.tx() as tx, psycopg.connect(pg_url, autocommit=True) as other:
        tx.heard(Heard.WEBHOOK, 25.0)                     # held: nothing sent, no lock yet
        assert other.execute("SELECT pg_try_advisory_xact_lock(%s)", (WRITE_LOCK,)).fetchone()[0]
        assert tx.delivery_seen_at("nothing") is None     # the first round trip: now it is ours
        assert not other.execute("SELECT pg_try_advisory_xact_lock(%s)", (WRITE_LOCK,)).fetchone()[0]


def test_another_state_id_found_by_the_first_round_trip_writes_nothing(store: PostgresStore, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("UPDATE schema_version SET state_id = 'someone-else'")
    with pytest.raises(StateError, match="not the one this remediator opened"), store.tx() as tx:
        tx.heard(Heard.WEBHOOK, 70.0)                     # sent with the opening, before the id is seen
        tx.delivery_seen_at("k")
    with psycopg.connect(pg_url, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM heard").fetchone()[0] == 0


def test_a_held_write_has_its_row_count(store: PostgresStore) -> None:
    with store.tx() as tx:
        db = tx._db()
        db.execute("INSERT INTO deliveries (key, first_seen) VALUES (?, ?)", ("a", 1.0))
        db.execute("INSERT INTO deliveries (key, first_seen) VALUES (?, ?)", ("b", 2.0))
        none = db.execute("UPDATE deliveries SET first_seen = 9 WHERE key = ?", ("zz",))
        both = db.execute("DELETE FROM deliveries WHERE first_seen < ?", (5.0,))
        assert both.rowcount == 2 and none.rowcount == 0


def test_an_error_in_a_held_write_rolls_the_transaction_back(store: PostgresStore) -> None:
    with pytest.raises(psycopg.errors.NotNullViolation), store.tx() as tx:
        tx.heard(Heard.WEBHOOK, 40.0)
        tx._db().execute("INSERT INTO deliveries (key, first_seen) VALUES (?, ?)", ("bad", None))
        tx.remember_delivery("after", 41.0, forget_before=0.0)
    assert store.last_heard().webhook_at is None
    with store.reader() as r:
        assert r.delivery_seen_at("after") is None
    with store.tx() as tx:                                # the pooled connection is usable again
        tx.heard(Heard.WEBHOOK, 42.0)
    assert store.last_heard().webhook_at == 42.0


def test_text_with_quotes_percent_and_bytes_is_written_as_given(store: PostgresStore) -> None:
    key = "it's 50% done; DROP TABLE deliveries; --?"
    with store.tx() as tx:
        tx.remember_delivery(key, 50.0, forget_before=0.0)
        tx._db().execute("INSERT INTO heartbeat (worker, at, pad) VALUES (?, ?, ?)", ("w'1", 1.0, b"\x00'\\x01"))
    with store.reader() as r:
        assert r.delivery_seen_at(key) == 50.0
        row = r._db().execute("SELECT pad FROM heartbeat WHERE worker = ?", ("w'1",)).fetchone()
    assert bytes(row["pad"]) == b"\x00'\\x01"


def test_a_commit_that_cannot_reach_the_server_is_a_state_error(pg_url: str, store: PostgresStore) -> None:
    with pytest.raises(StateError, match="not reachable"), store.tx() as tx:
        tx.heard(Heard.WEBHOOK, 60.0)
        pid = tx._db().execute("SELECT pg_backend_pid()").fetchone()[0]
        with psycopg.connect(pg_url, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        tx.heard(Heard.WATCHDOG, 61.0)                     # held: the COMMIT finds the session gone
    assert store.last_heard().webhook_at is None


@pytest.mark.parametrize(("sql", "blind"), [
    ("INSERT INTO t (a) VALUES (?)", True),
    ("  update t SET a = 1", True),
    ("DELETE FROM t WHERE a < ?", True),
    ("INSERT INTO t (a) VALUES (?) RETURNING id", False),
    ("SELECT a FROM t", False),
    ("WITH x AS (SELECT 1) DELETE FROM t", False),   # not recognised: sent at once, always safe
])
def test_only_writes_answered_by_a_row_count_wait(sql: str, blind: bool) -> None:
    assert blind_write(sql) is blind


def test_only_text_numbers_and_null_ride_as_literals() -> None:
    assert literal_safe(("a", 1, None, 1.5))
    assert not literal_safe((True,))
    assert not literal_safe((b"x",))


def test_rows_are_read_by_column_name_and_position_without_building_psycopg_columns(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """pg_row reads the column names from the result itself: `cursor.description` built a Column object per
    column for every statement (a third of the client's CPU per read). A write has no rows; `SELECT ;` has
    rows of no column, as psycopg says."""
    def no_description(self: Any) -> Any:
        raise AssertionError("cursor.description was built")

    monkeypatch.setattr(psycopg.Cursor, "description", property(no_description))
    with psycopg.connect(pg_url, autocommit=True, row_factory=pg_row) as c:
        c.execute("CREATE TABLE t (id int, name text)")
        assert column_index(c.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")) is None
        rows = c.execute("SELECT name, id FROM t ORDER BY id").fetchall()
        assert [(r["id"], r["name"], r[0], r[1]) for r in rows] == [(1, "a", "a", 1), (2, "b", "b", 2)]
        assert rows[0].keys() == ["name", "id"]
        assert column_index(c.execute("SELECT ;")) == {}
        assert column_index(c.execute("SELECT 1 AS \"Ünïcode\"")) == {"Ünïcode": 0}


def test_a_pooled_read_of_a_write_returns_no_rows(store: PostgresStore) -> None:
    with store.tx() as tx:
        tx.heard(Heard.WEBHOOK, 5.0)
    assert store.last_heard().webhook_at == 5.0
    assert PooledReads(store._pool(), "here").execute("DELETE FROM heard WHERE at < 0").fetchall() == []
