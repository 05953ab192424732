"""Alertmanager silences around restarts: `silences` (their ids, so they are expired when the restart ends)."""

from __future__ import annotations

from llm_health.remediator.store.rows import Silence
from llm_health.remediator.store.tables.connected import Connected, Row


def silence_of(r: Row) -> Silence:
    return Silence(id=r["id"], backend=r["backend"], incident_id=r["incident_id"], created_at=r["created_at"],
                   ends_at=float(r["ends_at"]), expired_at=r["expired_at"], result=r["result"])


class SilenceReads(Connected):
    def active_silences(self, backend: str) -> list[Silence]:
        return [silence_of(r) for r in self._db().execute(
            "SELECT * FROM silences WHERE backend = ? AND expired_at IS NULL", (backend,)).fetchall()]


class SilenceWrites(Connected):
    def add_silence(self, silence: Silence) -> None:
        self._db().execute("INSERT INTO silences (id, backend, incident_id, created_at, ends_at) VALUES (?,?,?,?,?) "
                           "ON CONFLICT(id) DO UPDATE SET backend = excluded.backend, incident_id = excluded.incident_id, "
                           "created_at = excluded.created_at, ends_at = excluded.ends_at, expired_at = NULL, "
                           "result = 'active'", (silence.id, silence.backend, silence.incident_id,
                                                  silence.created_at, silence.ends_at))

    def end_silence(self, silence_id: str, at: float, result: str) -> None:
        self._db().execute("UPDATE silences SET expired_at = ?, result = ? WHERE id = ?", (at, result, silence_id))
