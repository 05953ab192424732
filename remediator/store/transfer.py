"""Copy a SQLite state file into a PostgreSQL database (`llm-health remediator migrate`, remediator/migrate.py).

The source is opened read-only (`mode=ro`) and read in one read transaction (one consistent snapshot); it
must be at SCHEMA_VERSION, pass `PRAGMA integrity_check`, and not be in use (a lease of this boot still in
its term: a remediator runs on it). An older file is refused rather than migrated
here: starting the current remediator on it once migrates it in place, with the checks and the backup
advice of a normal upgrade, and this command never writes the operator's only copy.

The copy is ONE transaction of the target store (`tx()`, under its write lock), after `init()` created the
schema: the target must hold no llm-health rows, every table of the source must exist in the target with
the same columns and the other way round (a table or column one side forgot fails the copy, nothing is
written), ids are kept and the identity sequences are moved past them. The lease is copied expired
(expires_at 0, same holder, boot and epoch): its expiry is on the SQLite host's monotonic clock, which
means nothing on the database's clock, and the first remediator on PostgreSQL takes a new term with a
larger epoch. An event `state_migrated` records the copy in the same transaction.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from llm_health.remediator.clock import boot_id
from llm_health.remediator.store.base import StateError
from llm_health.remediator.store.postgresql import PostgresStore
from llm_health.remediator.store.sqlite.schema import SCHEMA_VERSION
from llm_health.remediator.store.tables.connected import Db

#: tables never copied: the write probe's scratch rows (both), the version record (PostgreSQL's own)
SKIPPED = frozenset({"heartbeat", "schema_version"})
#: the one table the target's schema fills on creation (its default row), replaced by the source's
PREFILLED = frozenset({"breaker"})
#: rows per INSERT statement (well under PostgreSQL's 65535 parameters at our widest table)
BATCH = 500


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- the source ---------------------------------------------------------------------------------------------
def open_source(path: str | Path) -> sqlite3.Connection:
    """The SQLite file, read-only, checked: at SCHEMA_VERSION and intact."""
    where = os.path.abspath(path)
    if not os.path.isfile(where):
        raise StateError(f"source {where}: no such file")
    try:
        c = sqlite3.connect(f"file:{where}?mode=ro", uri=True, isolation_level=None, timeout=30.0)
        _check_source(c, where)
    except sqlite3.Error as exc:
        raise StateError(f"source {where} is not a usable SQLite state: {exc}") from exc
    return c


def _check_source(c: sqlite3.Connection, where: str) -> None:
    found = int(c.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise StateError(f"source {where} has schema {found}, newer than this llm-health knows ({SCHEMA_VERSION}): "
                         "migrate it with the llm-health that wrote it")
    if found < SCHEMA_VERSION:
        raise StateError(f"source {where} has schema {found}, older than {SCHEMA_VERSION}: start the current "
                         "remediator on it once (after a backup; it migrates the file in place), stop it, "
                         "then migrate again")
    report = [str(r[0]) for r in c.execute("PRAGMA integrity_check(5)").fetchall()]
    if report != ["ok"]:
        raise StateError(f"source {where} fails its integrity check: {'; '.join(report)[:300]}")


def read_source(c: sqlite3.Connection) -> dict[str, Table]:
    """Every table of the source (but SKIPPED), from one read snapshot, rows in rowid order."""
    c.execute("BEGIN")
    try:
        names = [str(r[0]) for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                              "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()]
        return {n: _read_table(c, n) for n in names if n not in SKIPPED}
    finally:
        c.execute("ROLLBACK")


def _read_table(c: sqlite3.Connection, name: str) -> Table:
    columns = tuple(str(r[1]) for r in c.execute(f"PRAGMA table_info({quoted(name)})").fetchall())
    rows = c.execute(f"SELECT {', '.join(map(quoted, columns))} FROM {quoted(name)} ORDER BY rowid").fetchall()
    return Table(name, columns, [tuple(r) for r in rows])


# -- the target ---------------------------------------------------------------------------------------------
def target_columns(db: Db) -> dict[str, set[str]]:
    """{table: its columns} of the target's schema (but SKIPPED)."""
    rows = db.execute("SELECT table_name, column_name FROM information_schema.columns "
                      "WHERE table_schema = current_schema()").fetchall()
    found: dict[str, set[str]] = {}
    for r in rows:
        if str(r[0]) not in SKIPPED:
            found.setdefault(str(r[0]), set()).add(str(r[1]))
    return found


def check_same_schema(source: dict[str, Table], target: dict[str, set[str]]) -> None:
    """Every table and column on both sides, else refuse naming the difference (nothing is guessed)."""
    problems = []
    if only := sorted(set(source) - set(target)):
        problems.append(f"tables only in the source: {', '.join(only)}")
    if only := sorted(set(target) - set(source)):
        problems.append(f"tables only in the target: {', '.join(only)}")
    for name in sorted(set(source) & set(target)):
        have, want = set(source[name].columns), target[name]
        if have != want:
            problems.append(f"{name}: columns only in the source {sorted(have - want)}, "
                            f"only in the target {sorted(want - have)}")
    if problems:
        raise StateError("source and target schemas differ (refused, nothing copied; the target must be a "
                         "database of its own): " + "; ".join(problems))


def refuse_non_empty(db: Db, tables: Sequence[str]) -> None:
    full = [t for t in tables if t not in PREFILLED
            and db.execute(f"SELECT 1 FROM {quoted(t)} LIMIT 1").fetchone() is not None]
    if full:
        raise StateError(f"the target already holds llm-health state (rows in {', '.join(full)}): refused, "
                         "nothing copied; migrate into an empty database")


def insert_rows(db: Db, table: Table) -> None:
    if table.name in PREFILLED:
        db.execute(f"DELETE FROM {quoted(table.name)}")
    cols = ", ".join(map(quoted, table.columns))
    one = "(" + ", ".join("?" * len(table.columns)) + ")"
    for start in range(0, len(table.rows), BATCH):
        batch = table.rows[start:start + BATCH]
        db.execute(f"INSERT INTO {quoted(table.name)} ({cols}) VALUES {', '.join([one] * len(batch))}",
                   [v for row in batch for v in row])


def refuse_held_lease(table: Table, where: str) -> None:
    """A lease of this boot still in its term: a remediator is (or was a moment ago) running on the file."""
    at, boot = table.columns.index("expires_at"), table.columns.index("boot")
    left = max((row[at] - time.monotonic() for row in table.rows if row[boot] and row[boot] == boot_id()),
               default=0.0)
    if left > 0:
        raise StateError(f"source {where} is in use: its lease is held for {left:.0f}s more by a remediator on this "
                         "host; stop the remediator, then migrate")


def expired_lease(table: Table) -> Table:
    """The lease rows with expires_at 0: the same holder, boot and epoch, held by nobody."""
    at = table.columns.index("expires_at")
    return Table(table.name, table.columns, [row[:at] + (0.0,) + row[at + 1:] for row in table.rows])


def reset_identities(db: Db) -> list[str]:
    """Every identity sequence past the largest id copied (the next row gets max + 1); the tables touched."""
    rows = db.execute("SELECT table_name, column_name FROM information_schema.columns "
                      "WHERE table_schema = current_schema() AND is_identity = 'YES'").fetchall()
    for r in rows:
        table, column = quoted(str(r[0])), quoted(str(r[1]))
        db.execute(f"SELECT setval(pg_get_serial_sequence(?, ?), coalesce(max({column}), 0) + 1, false) "
                   f"FROM {table}", (str(r[0]), str(r[1])))
    return sorted(str(r[0]) for r in rows)


# -- the copy -----------------------------------------------------------------------------------------------
def copy_state(source: str | Path, target: PostgresStore, *, now: float | None = None) -> dict[str, int]:
    """Copy the SQLite state `source` into `target` (created if needed, must be empty) in one transaction;
    returns the rows copied per table. Raises StateError (nothing written) on any refusal or failure."""
    c = open_source(source)
    try:
        tables = read_source(c)
    except sqlite3.Error as exc:
        raise StateError(f"source {os.path.abspath(source)}: cannot read it: {exc}") from exc
    finally:
        c.close()
    if "lease" in tables:
        refuse_held_lease(tables["lease"], os.path.abspath(source))
        tables["lease"] = expired_lease(tables["lease"])
    target.init()
    try:
        return _copy(tables, target, os.path.abspath(source), time.time() if now is None else now)
    except psycopg.Error as exc:
        raise StateError(f"copy into {target.where} failed, nothing copied: {str(exc).strip()}") from exc


def _copy(tables: dict[str, Table], target: PostgresStore, where: str, now: float) -> dict[str, int]:
    with target.tx() as tx:
        db = tx._db()
        check_same_schema(tables, target_columns(db))
        refuse_non_empty(db, sorted(tables))
        for table in tables.values():
            insert_rows(db, table)
        reset_identities(db)
        counts = {name: len(t.rows) for name, t in sorted(tables.items())}
        total = sum(counts.values())
        tx.event(now, "state_migrated", reason=f"copied {total} rows from SQLite state {where}", source=where,
                 rows=counts)
    return counts
