"""The one thing every table module of the SQLite store needs: the connection its verbs run on."""

from __future__ import annotations

import sqlite3


class Connected:
    def _db(self) -> sqlite3.Connection:
        raise NotImplementedError
