"""Operators' holds on backends: `admin` (one row per held backend; no row = in service)."""

from __future__ import annotations

from llm_health.remediator.store.rows import AdminRow, AdminState
from llm_health.remediator.store.tables.connected import Connected, Row


def admin_of(r: Row) -> AdminRow:
    return AdminRow(backend=r["backend"], state=AdminState(r["state"]), since=float(r["since"]), by=r["by"],
                    reason=r["reason"])


class AdminReads(Connected):
    def admin(self, backend: str) -> AdminRow | None:
        r = self._db().execute("SELECT * FROM admin WHERE backend = ?", (backend,)).fetchone()
        return None if r is None else admin_of(r)

    def admins(self) -> dict[str, AdminRow]:
        return {r["backend"]: admin_of(r) for r in self._db().execute("SELECT * FROM admin").fetchall()}


class AdminWrites(Connected):
    def set_admin(self, backend: str, state: AdminState, at: float, by: str, reason: str) -> None:
        if state == AdminState.IN_SERVICE:
            self._db().execute("DELETE FROM admin WHERE backend = ?", (backend,))
            return
        self._db().execute('INSERT INTO admin (backend, state, since, "by", reason) VALUES (?,?,?,?,?) '
                           "ON CONFLICT(backend) DO UPDATE SET state = excluded.state, since = excluded.since, "
                           '"by" = excluded."by", reason = excluded.reason', (backend, state.value, at, by, reason))
