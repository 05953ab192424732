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


#: a Commuting transaction leaves a stamp this close to its own time as it is
HEARD_SLACK = 1.0


class HeardLazily(Connected):
    def heard(self, what: Heard, at: float) -> None:
        """The stamp moved forward unless it is already within HEARD_SLACK of `at` (store/base.py Commuting):
        a plain UPDATE whose condition is false on the row it sees takes no row lock, so in a storm (the stamp
        always fresh) it never waits for a writer holding the row. A row never stamped stays unstamped: the
        original of a copy stamped it."""
        self._db().execute("UPDATE heard SET at = ? WHERE what = ? AND at < ?", (at, what.value, at - HEARD_SLACK))
