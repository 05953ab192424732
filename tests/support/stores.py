"""Which store a test runs on (the `store_kind` fixture of tests/conftest.py): the SQLite file by default,
or a fresh PostgreSQL database while `using_postgres(url)` is in effect."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llm_health.remediator.store import SqliteStore, StateStore

_url: list[str] = []


@contextmanager
def using_postgres(url: str) -> Iterator[None]:
    _url.append(url)
    try:
        yield
    finally:
        _url.remove(url)


def postgres_url() -> str | None:
    """The database the running test's state goes to (None: a SQLite file)."""
    return _url[-1] if _url else None


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
