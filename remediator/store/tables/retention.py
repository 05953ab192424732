"""Forgetting old history (remediator/retention.py decides when and how much)."""

from __future__ import annotations

from llm_health.remediator.store.tables.connected import Connected


class RetentionWrites(Connected):
    """Needs `bump` (EventWrites) in the same transaction class."""

    def prune(self, now: float, *, max_age: float, max_events: int, max_actions: int,
              protect: float) -> dict[str, int]:
        c = self._db()
        out = {}
        out["events"] = c.execute("DELETE FROM events WHERE at < ? OR id <= (SELECT id FROM events ORDER BY id DESC "
                                  "LIMIT 1 OFFSET ?)", (now - max_age, max_events)).rowcount
        doomed = ("FROM actions WHERE finished_at IS NOT NULL AND started_at < ? AND (finished_at < ? OR id <= "
                  "(SELECT id FROM actions WHERE finished_at IS NOT NULL ORDER BY id DESC LIMIT 1 OFFSET ?))")
        args = (now - protect, now - max_age, max_actions)
        for r in c.execute(f"SELECT backend, coalesce(result, 'running') AS result, count(*) AS n {doomed} "
                           "GROUP BY 1, 2", args).fetchall():
            self.bump("restarts_pruned", f"{r['backend']}\t{r['result']}", int(r["n"]))
        out["actions"] = c.execute(f"DELETE {doomed}", args).rowcount
        out["incidents"] = c.execute(
            "DELETE FROM incidents WHERE state = 'closed' AND closed_at < ?", (now - max_age,)).rowcount
        c.execute("DELETE FROM incident_alerts WHERE incident_id NOT IN (SELECT id FROM incidents)")
        out["captures"] = c.execute("DELETE FROM captures WHERE incident_id NOT IN (SELECT id FROM incidents)").rowcount
        c.execute("DELETE FROM resolved_alerts WHERE resolved_at < ?", (now - max_age,))
        out["markers"] = c.execute("DELETE FROM markers WHERE expires_at < ?", (now - 3600,)).rowcount
        c.execute("DELETE FROM silences WHERE result != 'active' AND created_at < ?", (now - max_age,))
        return out
