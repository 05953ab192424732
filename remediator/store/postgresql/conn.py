"""psycopg, spoken in the tables' dialect (remediator/store/tables/connected.py).

`PgDb` wraps one psycopg connection: `?` placeholders become `%s` (a literal `%` becomes `%%`), and rows
come back as `PgRow`, read by column name or position like sqlite3.Row. `PooledReads` runs each read on
its own pooled connection (autocommit), as the SQLite store's reads run on their own. `BatchedDb` is a
write transaction's connection: its blind writes wait in the client and travel with the next statement
that must be answered (a read, or the COMMIT), one round trip for all of them. Every failure to
reach the database is a StateError (answered 503 by the web side; the lease lapses; nothing is lost).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool
from psycopg.types.numeric import FloatDumper

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


#: the results that carry rows (psycopg's own test in `Cursor.description`)
_ROWS = frozenset(getattr(psycopg.pq.ExecStatus, s) for s in ("TUPLES_OK", "SINGLE_TUPLE", "TUPLES_CHUNK")
                  if hasattr(psycopg.pq.ExecStatus, s))


@functools.lru_cache(maxsize=256)
def _index(names: tuple[bytes, ...]) -> dict[str, int]:
    return {name.decode(): i for i, name in enumerate(names)}


def column_index(cursor: Any) -> dict[str, int] | None:
    """The current result's columns by name, or None when it has no rows (a write's result). Read from
    the result itself: `cursor.description` builds a Column object per column at every call, which cost
    a third of the client's CPU per statement (about 40 of 120 us on a 12-column row)."""
    res = cursor.pgresult
    if res is None or not (res.nfields or res.status in _ROWS):
        return None
    return _index(tuple(res.fname(i) or b"" for i in range(res.nfields)))


def pg_row(cursor: Any) -> Any:
    """psycopg row factory for PgRow."""
    index = column_index(cursor)
    if index is None:
        return tuple
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


class Deferred:
    """A blind write held by BatchedDb until the next round trip; its row count is there after it."""

    __slots__ = ("_db", "count")

    def __init__(self, db: BatchedDb) -> None:
        self._db = db
        self.count: int | None = None

    @property
    def rowcount(self) -> int:
        if self.count is None:
            self._db.flush()
        return -1 if self.count is None else self.count

    def fetchone(self) -> Any:
        raise psycopg.ProgrammingError("a write without RETURNING has no rows")

    fetchall = fetchone


def blind_write(sql: str) -> bool:
    """An INSERT, UPDATE or DELETE whose answer is only a row count (no RETURNING): it can wait."""
    head = sql.lstrip()[:6].upper()
    return head in ("INSERT", "UPDATE", "DELETE") and "RETURNING" not in sql.upper()


def literal_safe(parameters: Sequence[Any]) -> bool:
    """Parameters a read may carry as literals with the same result types: text, integers, floats (bound as
    float8: Float8Literal; a float's subclass, such as numpy's, has dumpers of its own), NULL."""
    return all(p is None or isinstance(p, str) or type(p) is float
               or (isinstance(p, int) and not isinstance(p, bool)) for p in parameters)


class Float8Literal(FloatDumper):
    """A float bound client-side as `'<repr>'::float8`, the type it is bound as by the server: a bare literal
    is `numeric`, and a read that selected it would hand back a Decimal. repr() round-trips every double
    (inf and nan as 'inf', 'nan', which float8 reads)."""

    def quote(self, obj: float) -> bytes:
        return b"'" + float.__repr__(obj).encode() + b"'::float8"


class BatchedDb(PgDb):
    """A write transaction's connection, with fewer round trips and the same safety.

    The `opening` (BEGIN, the write lock, the state id) waits too and goes first in the first round trip,
    so a transaction's Python work before its first read is done before it holds the lock. A blind write
    (`blind_write`) is not sent at once: it is bound client-side (psycopg's ClientCursor
    quoting) and held until a statement must be answered; then everything held and that statement go in one
    simple-Query message, answered together. A read whose parameters are `literal_safe` rides in that
    message too; any other statement follows it. `script("COMMIT")` sends what is held with the COMMIT.

    Why not psycopg's pipeline mode: a pipeline sends statements without a Sync, and PostgreSQL arms
    idle_in_transaction_session_timeout only at a Sync, so a client frozen (SIGSTOP) after a pipelined
    write would hold the write lock for as long as it stays frozen (tests/unit/remediator/
    test_store_postgresql.py, the frozen writer). Here the server only ever waits between complete
    messages, idle in transaction, with the timeout armed. An error in a held write surfaces at the next
    round trip, inside the same transaction: it is rolled back all the same.
    """

    def __init__(self, conn: psycopg.Connection[Any], where: str, opening: Sequence[str] = (),
                 opened: Callable[[Any], None] | None = None) -> None:
        super().__init__(conn, where)
        self._opening = tuple(opening)      # literal statements sent first, with the first round trip
        self._opened = opened               # called with the cursor at the last opening statement's result
        self._held: list[tuple[str, Deferred]] = []
        self._binder = psycopg.ClientCursor(conn)
        self._binder.adapters.register_dumper(float, Float8Literal)

    def _literal(self, sql: str, parameters: Sequence[Any]) -> str:
        return self._binder.mogrify(translate(sql), tuple(parameters))

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        if blind_write(sql):
            handle = Deferred(self)
            self._held.append((self._literal(sql, parameters), handle))
            return handle
        if (self._held or self._opening) and literal_safe(parameters):
            return self._send(self._literal(sql, parameters))
        self.flush()
        return super().execute(sql, parameters)

    def flush(self) -> None:
        """Send what is held (one round trip), if anything is."""
        if self._held or self._opening:
            self._send("")

    def script(self, last: str) -> Any:
        """What is held, then `last` (literal statements, no parameters: "BEGIN; ...", "COMMIT"), in one
        round trip; the cursor is left at the last statement's result."""
        return self._send(last)

    def _send(self, last: str) -> Any:
        opening, self._opening = self._opening, ()
        held, self._held = self._held, []
        script = "; ".join([*opening, *(text for text, _ in held), *([last] if last else [])])
        try:
            cur = self._c.execute(script.encode())      # no parameters: the simple query protocol
            if opening:
                for _ in opening[1:]:
                    cur.nextset()
                if self._opened is not None:
                    self._opened(cur)
                cur.nextset()
            for _, handle in held:
                handle.count = cur.rowcount
                cur.nextset()
            while cur.nextset():
                pass
        except DATABASE_GONE as exc:
            raise unreachable(exc, self._where) from exc
        return cur


class PooledReads:
    """Each statement on its own pooled connection, in autocommit (the store's own read verbs)."""

    def __init__(self, pool: psycopg_pool.ConnectionPool[Any], where: str) -> None:
        self._pool = pool
        self._where = where

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Result:
        with connection(self._pool, self._where) as c:
            cur = PgDb(c, self._where).execute(sql, parameters)
            rows = cur.fetchall() if column_index(cur) is not None else []
            return Result(rows, cur.rowcount)


@contextmanager
def connection(pool: psycopg_pool.ConnectionPool[Any], where: str) -> Iterator[psycopg.Connection[Any]]:
    """A pooled connection; a pool that cannot hand one out in its timeout is an unreachable database."""
    try:
        with pool.connection() as c:
            yield c
    except (psycopg_pool.PoolTimeout, *DATABASE_GONE) as exc:
        raise unreachable(exc, where) from exc
