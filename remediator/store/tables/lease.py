"""The authority's lease: `lease` (monotonic expiry on the clock of the boot it records, and its term: the
epoch, a fencing token every takeover increments)."""

from __future__ import annotations

from llm_health.remediator.store.rows import IncidentState, Lease
from llm_health.remediator.store.tables.connected import Connected


class LeaseReads(Connected):
    def lease(self, name: str) -> Lease | None:
        r = self._db().execute("SELECT name, holder, expires_at, boot, epoch FROM lease WHERE name = ?",
                               (name,)).fetchone()
        return None if r is None else Lease(name=r["name"], holder=r["holder"], expires_at=float(r["expires_at"]),
                                            boot=r["boot"], epoch=int(r["epoch"]))


class LeaseWrites(Connected):
    def put_lease(self, lease: Lease) -> None:
        self._db().execute("INSERT INTO lease (name, holder, expires_at, boot, epoch) VALUES (?,?,?,?,?) "
                           "ON CONFLICT(name) DO UPDATE SET holder = excluded.holder, "
                           "expires_at = excluded.expires_at, boot = excluded.boot, epoch = excluded.epoch",
                           (lease.name, lease.holder, lease.expires_at, lease.boot, lease.epoch))

    def rebase_deadlines(self, t: float, warm_deadline: float) -> None:
        c = self._db()
        c.execute("UPDATE incidents SET next_check_at = 0, unresponsive_since = NULL, unresponsive_seen_at = NULL, "
                  "warm_deadline = CASE WHEN warm_deadline IS NULL THEN NULL ELSE ? END WHERE state != ?",
                  (warm_deadline, IncidentState.CLOSED.value))
        c.execute("UPDATE lifecycle SET drain_deadline = ? WHERE drain_deadline IS NOT NULL", (t,))
