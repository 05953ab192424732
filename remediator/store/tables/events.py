"""The audit log and the counters: `events`, `counters` (what /metrics counts survives retention)."""

from __future__ import annotations

from typing import Any

from llm_health.remediator.store.details import decode_detail
from llm_health.remediator.store.rows import Event
from llm_health.remediator.store.tables.connected import Connected, Row


def event_of(r: Row) -> Event:
    return Event(id=int(r["id"]), at=float(r["at"]), kind=r["kind"], backend=r["backend"],
                 incident_id=r["incident_id"], reason=r["reason"], detail=decode_detail(r["detail"]))


class EventReads(Connected):
    def events(self, backend: str = "", limit: int = 100, kind: str = "", before: int | None = None) -> list[Event]:
        sql = "SELECT * FROM events WHERE 1=1"
        args: list[Any] = []
        if before is not None:
            sql += " AND id < ?"
            args.append(before)
        if backend:
            sql += " AND backend = ?"
            args.append(backend)
        if kind:
            sql += " AND kind = ?"
            args.append(kind)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        return [event_of(r) for r in self._db().execute(sql, args).fetchall()]

    def last_event(self, backend: str, skip_kinds: tuple[str, ...] = ()) -> Event | None:
        skip = ", ".join("?" for _ in skip_kinds)
        sql = "SELECT * FROM events WHERE backend = ?" + (f" AND kind NOT IN ({skip})" if skip_kinds else "")
        r = self._db().execute(sql + " ORDER BY id DESC LIMIT 1", (backend, *skip_kinds)).fetchone()
        return None if r is None else event_of(r)

    def counters(self, metric: str) -> dict[str, int]:
        rows = self._db().execute("SELECT label, value FROM counters WHERE metric = ?", (metric,)).fetchall()
        return {r["label"]: int(r["value"]) for r in rows}


class EventWrites(Connected):
    def _insert_event(self, at: float, kind: str, backend: str, incident_id: int | None, reason: str,
                      detail: str) -> None:
        self._db().execute("INSERT INTO events (at, kind, backend, incident_id, reason, detail) VALUES (?,?,?,?,?,?)",
                           (at, kind, backend, incident_id, reason, detail))

    def _recent_event(self, kind: str, backend: str, reason: str, since: float) -> bool:
        return self._db().execute("SELECT 1 FROM events WHERE backend = ? AND kind = ? AND reason = ? AND at > ? "
                                  "LIMIT 1", (backend, kind, reason, since)).fetchone() is not None

    def bump(self, metric: str, label: str, by: int = 1) -> None:
        self._db().execute("INSERT INTO counters (metric, label, value) VALUES (?,?,?) "
                           "ON CONFLICT(metric, label) DO UPDATE SET value = counters.value + excluded.value",
                           (metric, label, by))
