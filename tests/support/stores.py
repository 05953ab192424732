"""Which store a test runs on (the `store_kind` fixture of tests/conftest.py): the SQLite file by default,
or a fresh PostgreSQL state while `using_postgres(new_state)` is in effect (a schema of its own: `Schemas`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from llm_health.remediator.store import SqliteStore, StateStore

_databases: list[Callable[[], str]] = []


@contextmanager
def using_postgres(new_database: Callable[[], str]) -> Iterator[None]:
    """While in effect, every new state is a fresh database from `new_database` (as each SQLite state is a
    new file in its own folder)."""
    _databases.append(new_database)
    try:
        yield
    finally:
        _databases.remove(new_database)


class Schemas:
    """Fresh, empty PostgreSQL states, each a schema of its own in one shared database of a test server, the
    URL selecting it (`options=-csearch_path=...`), as each SQLite state is a new file in its own folder.

    A database per state cost about 110 ms of the server's CPU each (CREATE DATABASE copies template0): a
    third of all the CPU `tests/unit` spent, with 168 tests on PostgreSQL. A schema costs about 1 ms. The
    store names nothing outside its search path (its tables, `current_schema()`); the one thing a schema does
    not separate is the store's write lock, a transaction-level advisory lock of the database: the tests of a
    worker run one after another, and each takes it only for a transaction."""

    def __init__(self, server: Any) -> None:
        self._server = server
        self._database = ""
        self._conn: Any = None
        self._made = 0

    def new(self) -> str:
        import psycopg

        if self._conn is None:
            self._database = server_url = self._server.new_database()
            self._conn = psycopg.connect(server_url, autocommit=True)
        self._made += 1
        name = f"state_{self._made}"
        self._conn.execute(f"CREATE SCHEMA {name}")
        return f"{self._database}?options={quote(f'-csearch_path={name}')}"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def postgres_url() -> str | None:
    """A new database for the next state of the running test (None: a SQLite file)."""
    return _databases[-1]() if _databases else None


def reopen(store: Any) -> StateStore:
    """Another store object on the same state (another process' view of it), initialised."""
    from llm_health.remediator.store.postgresql import PostgresStore

    other: StateStore
    if isinstance(store, PostgresStore):
        other = PostgresStore(store.url, timeout=store.timeout)
        other.init()
    else:
        other = SqliteStore(store.path)
    return other


def state_setting(default: str) -> str:
    """remediator.state for a test's config: the PostgreSQL URL in effect, else `default` (a file)."""
    return postgres_url() or default


def new_store(tmp_path: Path, name: str = "state.db", **kw: Any) -> StateStore:
    """A new store, not initialised: a SQLite file in tmp_path, or the PostgreSQL database in effect."""
    url = postgres_url()
    if url is not None:
        from llm_health.remediator.store.postgresql import PostgresStore

        return PostgresStore(url, timeout=kw.get("timeout", 10.0))
    return SqliteStore(tmp_path / name)


def sql(store: Any) -> Any:
    """Raw SQL on either store, in the tables' dialect (`?` placeholders, autocommit), for tests that look
    at or set up rows no verb exposes; rows are read by column name or position."""
    return store._db()


def sqlite_only(why: str) -> None:
    """Inside a test on both stores: skip its PostgreSQL run, saying why (a SQLite file's own failure mode)."""
    if _databases:
        import pytest

        pytest.skip(f"SQLite only: {why}")
