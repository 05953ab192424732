"""psycopg, spoken in the tables' dialect (remediator/store/tables/connected.py).

`PgDb` wraps one psycopg connection: `?` placeholders become `%s` (a literal `%` becomes `%%`), and rows
come back as `PgRow`, read by column name or position like sqlite3.Row. `PooledReads` runs each read on
its own pooled connection (autocommit), as the SQLite store's reads run on their own. Every failure to
reach the database is a StateError (answered 503 by the web side; the lease lapses; nothing is lost).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from llm_health.remediator.store.base import StateError


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """The tables' `?` placeholders as psycopg's `%s` (none of our SQL has a `?` or `%` in a literal)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgRow:
    """One result row: `r["column"]` or `r[0]`."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: int | str) -> Any:
        return self._values[key if isinstance(key, int) else self._index[key]]

    def keys(self) -> list[str]:
        return list(self._index)

    def __repr__(self) -> str:
        return f"PgRow({dict(zip(self._index, self._values, strict=True))!r})"


def pg_row(cursor: Any) -> Any:
    """psycopg row factory for PgRow."""
    if cursor.description is None:
        return tuple
    index = {col.name: i for i, col in enumerate(cursor.description)}
    return lambda values: PgRow(values, index)


class Result:
    """A finished statement's rows and row count (the connection went back to the pool already)."""

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Any]:
        return self._rows


#: what a statement or COMMIT raises when the database cannot be used now: unreachable, timed out, or the
#: server ended the session (IdleInTransactionSessionTimeout is an InternalError: our process was stopped
#: inside a transaction for longer than the server allows, and its transaction is gone)
DATABASE_GONE = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)


def unreachable(exc: BaseException, where: str) -> StateError:
    return StateError(f"state database {where} is not reachable: {str(exc).strip() or type(exc).__name__}")


class PgDb:
    """One psycopg connection (inside the caller's transaction) in the tables' dialect."""

    def __init__(self, conn: psycopg.Connection[Any], where: str) -> None:
        self._c = conn
        self._where = where

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        try:
            return self._c.execute(translate(sql), tuple(parameters))
        except DATABASE_GONE as exc:
            raise unreachable(exc, self._where) from exc


class PooledReads:
    """Each statement on its own pooled connection, in autocommit (the store's own read verbs)."""

    def __init__(self, pool: psycopg_pool.ConnectionPool[Any], where: str) -> None:
        self._pool = pool
        self._where = where

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Result:
        with connection(self._pool, self._where) as c:
            cur = PgDb(c, self._where).execute(sql, parameters)
            rows = cur.fetchall() if cur.description is not None else []
            return Result(rows, cur.rowcount)


@contextmanager
def connection(pool: psycopg_pool.ConnectionPool[Any], where: str) -> Iterator[psycopg.Connection[Any]]:
    """A pooled connection; a pool that cannot hand one out in its timeout is an unreachable database."""
    try:
        with pool.connection() as c:
            yield c
    except (psycopg_pool.PoolTimeout, *DATABASE_GONE) as exc:
        raise unreachable(exc, where) from exc
