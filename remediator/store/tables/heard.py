"""When Alertmanager was last heard from: `heard` (one row per kind, remediator/store/rows.py Heard)."""

from __future__ import annotations

from llm_health.remediator.store.rows import Heard, LastHeard
from llm_health.remediator.store.tables.connected import Connected


class HeardReads(Connected):
    def last_heard(self) -> LastHeard:
        at = {r["what"]: float(r["at"]) for r in self._db().execute("SELECT what, at FROM heard").fetchall()}
        return LastHeard(webhook_at=at.get(Heard.WEBHOOK.value), watchdog_at=at.get(Heard.WATCHDOG.value))


class HeardWrites(Connected):
    def heard(self, what: Heard, at: float) -> None:
        self._db().execute("INSERT INTO heard (what, at) VALUES (?, ?) ON CONFLICT(what) DO UPDATE SET "
                           "at = CASE WHEN excluded.at > heard.at THEN excluded.at ELSE heard.at END", (what.value, at))
