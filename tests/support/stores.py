"""Which store a test runs on (the `store_kind` fixture of tests/conftest.py): the SQLite file by default,
or a fresh PostgreSQL database while `using_postgres(url)` is in effect."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
