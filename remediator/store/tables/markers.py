"""Busy markers set through the API: `markers` (files in busy_dir are read by remediator/marker.py)."""

from __future__ import annotations

from llm_health.remediator.policy import Marker
from llm_health.remediator.store.tables.connected import Connected, Row


def marker_of(r: Row) -> Marker:
    return Marker(id=r["id"], backend=r["backend"], owner=r["owner"], expires_at=r["expires_at"])


class MarkerReads(Connected):
    def markers(self, backend: str) -> tuple[Marker, ...]:
        return tuple(marker_of(r) for r in self._db().execute("SELECT * FROM markers WHERE backend = ?",
                                                               (backend,)).fetchall())

    def marker(self, marker_id: str) -> Marker | None:
        r = self._db().execute("SELECT * FROM markers WHERE id = ?", (marker_id,)).fetchone()
        return None if r is None else marker_of(r)


class MarkerWrites(Connected):
    def add_marker(self, marker: Marker, at: float) -> None:
        self._db().execute("INSERT INTO markers (id, backend, owner, created_at, expires_at) VALUES (?,?,?,?,?)",
                           (marker.id, marker.backend, marker.owner, at, marker.expires_at))

    def refresh_marker(self, marker_id: str, at: float, expires_at: float) -> bool:
        return bool(self._db().execute("UPDATE markers SET expires_at = ? WHERE id = ? AND expires_at > ?",
                                       (expires_at, marker_id, at)).rowcount)

    def remove_marker(self, marker_id: str) -> Marker | None:
        r = self._db().execute("SELECT * FROM markers WHERE id = ?", (marker_id,)).fetchone()
        if r is None:
            return None
        self._db().execute("DELETE FROM markers WHERE id = ?", (marker_id,))
        return marker_of(r)
