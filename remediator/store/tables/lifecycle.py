"""Each backend's lifecycle: `lifecycle` (one row per backend; moves go through SharedVerbs.move_lifecycle).

The drain's starting reading is kept whole (`Reading.to_json`, every field), so progress during the drain
is judged from the same reading the drain began with.
"""

from __future__ import annotations

from llm_health.exporter.reading import Reading
from llm_health.remediator.lifecycle import UNSEEN, LifecycleState
from llm_health.remediator.store.rows import LifecycleRow
from llm_health.remediator.store.tables.connected import Connected, Row


def baseline_of(text: str | None) -> Reading | None:
    """A stored drain baseline; None for none, and for text no version of us could read back."""
    if not text:
        return None
    try:
        return Reading.from_json(text)
    except ValueError:
        return None


def lifecycle_of(r: Row | None) -> LifecycleRow | None:
    if r is None:
        return None
    return LifecycleRow(backend=r["backend"], state=LifecycleState(r["state"]), since=float(r["since"]),
                        reason=r["reason"], incident_id=r["incident_id"], drain_deadline=r["drain_deadline"],
                        drain_baseline=baseline_of(r["drain_baseline"]))


class LifecycleReads(Connected):
    def lifecycle(self, backend: str) -> LifecycleRow | None:
        return lifecycle_of(self._db().execute("SELECT * FROM lifecycle WHERE backend = ?", (backend,)).fetchone())

    def lifecycle_state(self, backend: str) -> LifecycleState:
        r = self.lifecycle(backend)
        return r.state if r is not None else UNSEEN

    def lifecycles(self) -> dict[str, LifecycleRow]:
        rows = [lifecycle_of(r) for r in self._db().execute("SELECT * FROM lifecycle").fetchall()]
        return {r.backend: r for r in rows if r is not None}


class LifecycleWrites(Connected):
    def _insert_lifecycle(self, backend: str, state: LifecycleState, at: float, reason: str) -> None:
        self._db().execute("INSERT INTO lifecycle (backend, state, since, reason) VALUES (?,?,?,?)",
                           (backend, LifecycleState(state).value, at, reason))

    def _put_lifecycle(self, row: LifecycleRow) -> None:
        self._db().execute(
            "UPDATE lifecycle SET state = ?, since = ?, reason = ?, incident_id = ?, drain_deadline = ?, "
            "drain_baseline = ? WHERE backend = ?",
            (row.state.value, row.since, row.reason, row.incident_id, row.drain_deadline,
             row.drain_baseline.to_json() if row.drain_baseline is not None else "", row.backend))

    def set_lifecycle_owner(self, backend: str, incident_id: int | None) -> None:
        self._db().execute("UPDATE lifecycle SET incident_id = ? WHERE backend = ?", (incident_id, backend))
