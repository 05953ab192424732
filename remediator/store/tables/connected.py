"""The one thing every table module needs: the connection its verbs run on, in the SQL both stores speak.

The table modules are written once for both stores (SQLite, PostgreSQL): `?` placeholders, `ON CONFLICT`
upserts, `RETURNING id`, quoted `"by"`, no scalar max()/zeroblob/PRAGMA. A store hands them a `Db`:
SQLite's own connection, or remediator/store/postgresql/conn.py's adapter (which turns `?` into `%s`).
Rows are read by column name (`r["state"]`) or position (`r[0]`), and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Row(Protocol):
    def __getitem__(self, key: int | str, /) -> Any: ...


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> Sequence[Any]: ...


class Db(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any: ...


class Connected:
    def _db(self) -> Db:
        raise NotImplementedError


def inserted_id(db: Db, sql: str, parameters: Sequence[Any]) -> int:
    """Run one INSERT and return the id of its row (`RETURNING id`: SQLite 3.35+ and PostgreSQL)."""
    r = db.execute(sql + " RETURNING id", parameters).fetchone()
    return int(r[0])
