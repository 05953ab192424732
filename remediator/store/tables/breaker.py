"""The fleet circuit breaker: `breaker` (one row; its reset point is an action id, never a time)."""

from __future__ import annotations

from llm_health.remediator.store.rows import BreakerState
from llm_health.remediator.store.tables.connected import Connected


class BreakerReads(Connected):
    def breaker(self) -> BreakerState:
        r = self._db().execute("SELECT * FROM breaker WHERE id = 1").fetchone()
        return BreakerState(open=bool(r["open"]), opened_at=r["opened_at"], reason=r["reason"],
                            reset_at=r["reset_at"], reset_after_action=int(r["reset_after_action"]))


class BreakerWrites(Connected):
    def open_breaker(self, at: float, reason: str) -> None:
        self._db().execute("UPDATE breaker SET open = 1, opened_at = ?, reason = ? WHERE id = 1", (at, reason))

    def reset_breaker(self, at: float) -> bool:
        c = self._db()
        was = bool(c.execute("SELECT open FROM breaker WHERE id = 1").fetchone()[0])
        c.execute("UPDATE breaker SET open = 0, reset_at = ?, reason = '', reset_after_action = "
                  "(SELECT coalesce(max(id), 0) FROM actions) WHERE id = 1", (at,))
        return was
