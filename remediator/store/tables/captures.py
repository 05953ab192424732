"""Diagnostics captured right before a restart: `captures` (remediator/diagnostics.py)."""

from __future__ import annotations

from llm_health.remediator.store.rows import CaptureResult, CaptureRow
from llm_health.remediator.store.tables.connected import Connected, Row, inserted_id


def capture_of(r: Row) -> CaptureRow:
    return CaptureRow(id=int(r["id"]), incident_id=int(r["incident_id"]), backend=r["backend"], at=float(r["at"]),
                      argv=r["argv"], result=CaptureResult(r["result"]), exit_code=r["exit_code"],
                      seconds=float(r["seconds"]), output=r["output"], truncated=bool(r["truncated"]))


class CaptureReads(Connected):
    def captures(self, incident_id: int) -> list[CaptureRow]:
        return [capture_of(r) for r in self._db().execute(
            "SELECT * FROM captures WHERE incident_id = ? ORDER BY id", (incident_id,)).fetchall()]

    def latest_capture(self, backend: str) -> CaptureRow | None:
        r = self._db().execute("SELECT * FROM captures WHERE backend = ? ORDER BY id DESC LIMIT 1", (backend,)).fetchone()
        return None if r is None else capture_of(r)


class CaptureWrites(Connected):
    def add_capture(self, incident_id: int, backend: str, at: float, argv: str, result: CaptureResult,
                    exit_code: int | None, seconds: float, output: str, truncated: bool) -> int:
        return inserted_id(
            self._db(), "INSERT INTO captures (incident_id, backend, at, argv, result, exit_code, seconds, output, truncated) "
            "VALUES (?,?,?,?,?,?,?,?,?)",
            (incident_id, backend, at, argv, result.value, exit_code, seconds, output, int(truncated)))
