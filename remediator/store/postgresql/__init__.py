"""The store on PostgreSQL (remediator.state: postgresql://...): store.py holds the pool and its
transactions, schema.py the schema; the SQL is the tables' (remediator/store/tables/), spoken through
conn.py. psycopg 3 and psycopg-pool come with the `postgresql` extra."""

from llm_health.remediator.store.postgresql.store import PgReads, PgTx, PostgresStore

__all__ = ["PgReads", "PgTx", "PostgresStore"]
