"""The store on SQLite (the only store today): store.py holds the file and its transactions, schema.py the
schema and its migrations, one module per table holds that table's SQL."""

from llm_health.remediator.store.sqlite.store import SqliteReads, SqliteStore, SqliteTx

__all__ = ["SqliteReads", "SqliteStore", "SqliteTx"]
