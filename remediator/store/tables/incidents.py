"""Incidents and what feeds them: `incidents`, `incident_alerts`, `deliveries`, `resolved_alerts`.

One active incident per backend is a database fact (the partial unique index `one_active_incident`).
"""

from __future__ import annotations

import json
from typing import Any

from llm_health.exporter.observation import VerifyOutcome
from llm_health.groups import Labels
from llm_health.remediator.store.rows import CommandChange, Incident, IncidentState
from llm_health.remediator.store.tables.connected import Connected, Row, inserted_id

IS = IncidentState
CLOSED = IS.CLOSED.value


def incident_of(r: Row | None) -> Incident | None:
    if r is None:
        return None
    return Incident(
        id=int(r["id"]), backend=r["backend"], state=IS(r["state"]), opened_at=r["opened_at"],
        updated_at=r["updated_at"], closed_at=r["closed_at"], close_reason=r["close_reason"],
        next_check_at=float(r["next_check_at"]), last_note=r["last_note"], warm_deadline=r["warm_deadline"],
        last_decision=r["last_decision"],
        verified_outcome=VerifyOutcome(r["verified_outcome"]) if r["verified_outcome"] else None,
        verified_at=r["verified_at"], unresponsive_since=r["unresponsive_since"],
        unresponsive_seen_at=r["unresponsive_seen_at"],
        labels=tuple(sorted(json.loads(r["labels"] or "{}").items())),
        workload=r["workload"], members=tuple(json.loads(r["members"] or "[]")), replacement=r["replacement"],
        requested_by=r["requested_by"], requested_force=bool(r["requested_force"]),
        command=command_change_of(r["command"]),
    )


def command_change_of(text: str) -> CommandChange | None:
    if not text:
        return None
    raw = json.loads(text)
    argv = raw.get("argv")
    return CommandChange(tuple(argv) if argv is not None else None, raw.get("rollout_id"))


def encode_command_change(change: CommandChange | None) -> str:
    return "" if change is None else json.dumps(change.as_dict())


class IncidentReads(Connected):
    def active_incident(self, backend: str) -> Incident | None:
        return incident_of(self._db().execute("SELECT * FROM incidents WHERE backend = ? AND state != ?",
                                              (backend, CLOSED)).fetchone())

    def active_incidents(self) -> list[Incident]:
        rows = self._db().execute("SELECT * FROM incidents WHERE state != ? ORDER BY id", (CLOSED,)).fetchall()
        return [i for i in map(incident_of, rows) if i is not None]

    def incident(self, incident_id: int) -> Incident | None:
        return incident_of(self._db().execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone())

    def incident_in(self, incident_id: int, state: IncidentState) -> Incident | None:
        inc = self.incident(incident_id)
        return inc if inc is not None and inc.state == state else None

    def backends_in(self, state: IncidentState) -> set[str]:
        return {r[0] for r in self._db().execute("SELECT backend FROM incidents WHERE state = ?",
                                                 (state.value,)).fetchall()}

    def firing_alerts(self, incident_id: int) -> int:
        return int(self._db().execute("SELECT count(*) FROM incident_alerts WHERE incident_id = ? AND "
                                      "status = 'firing'", (incident_id,)).fetchone()[0])

    def alert_known(self, incident_id: int, fingerprint: str, starts_at: str) -> bool:
        return self._db().execute("SELECT 1 FROM incident_alerts WHERE incident_id = ? AND fingerprint = ? AND "
                                  "starts_at = ?", (incident_id, fingerprint, starts_at)).fetchone() is not None

    def delivery_seen_at(self, key: str) -> float | None:
        r = self._db().execute("SELECT first_seen FROM deliveries WHERE key = ?", (key,)).fetchone()
        return None if r is None else float(r[0])

    def alert_resolved_at(self, fingerprint: str, starts_at: str) -> float | None:
        r = self._db().execute("SELECT resolved_at FROM resolved_alerts WHERE fingerprint = ? AND starts_at = ?",
                               (fingerprint, starts_at)).fetchone()
        return None if r is None else float(r[0])

    def restarts_in_progress(self, except_incident: int | None = None, warming_until: float = float("inf")) -> int:
        return int(self._db().execute(
            "SELECT count(*) FROM incidents WHERE id != ? AND ("
            " state = ? OR (state = ? AND verified_outcome != ?)"
            " OR (state = ? AND verified_outcome != ? AND coalesce(warm_deadline, 0) > ?))",
            (-1 if except_incident is None else except_incident, IS.DRAINING.value, IS.RESTARTING.value,
             VerifyOutcome.DOWN.value, IS.WARMING.value, VerifyOutcome.DOWN.value, warming_until),
        ).fetchone()[0])


class IncidentWrites(Connected):
    def remember_delivery(self, key: str, at: float, forget_before: float) -> None:
        c = self._db()
        c.execute("INSERT INTO deliveries (key, first_seen) VALUES (?, ?) "
                  "ON CONFLICT(key) DO UPDATE SET first_seen = excluded.first_seen", (key, at))
        c.execute("DELETE FROM deliveries WHERE first_seen < ?", (forget_before,))

    def remember_resolved(self, fingerprint: str, starts_at: str, at: float) -> None:
        self._db().execute("INSERT INTO resolved_alerts (fingerprint, starts_at, resolved_at) "
                           "VALUES (?,?,?) ON CONFLICT (fingerprint, starts_at) "
                           "DO UPDATE SET resolved_at = excluded.resolved_at", (fingerprint, starts_at, at))

    def open_incident(self, backend: str, at: float, labels: Labels = ()) -> int:
        return inserted_id(self._db(), "INSERT INTO incidents (backend, state, opened_at, updated_at, labels) "
                           "VALUES (?,?,?,?,?)", (backend, IS.OPEN.value, at, at, json.dumps(dict(labels), sort_keys=True)))

    def request_restart(self, backend: str, at: float, by: str, force: bool, command: CommandChange | None = None) -> int:
        """The backend's active incident (opened if there is none) becomes a restart asked for by `by`:
        OPEN, looked at at once; with `command`, the restart changes the backend's command to it. The caller
        checked that no restart is under way."""
        r = self._db().execute("SELECT id FROM incidents WHERE backend = ? AND state != ?", (backend, CLOSED)).fetchone()
        if r is None:
            incident_id = self.open_incident(backend, at)
        else:
            incident_id = int(r[0])
        self._db().execute("UPDATE incidents SET state = ?, updated_at = ?, requested_by = ?, requested_force = ?, "
                           "next_check_at = 0, last_note = '', command = ? WHERE id = ?",
                           (IS.OPEN.value, at, by, int(force), encode_command_change(command), incident_id))
        return incident_id

    def carry_firing_alerts(self, from_incident: int, to_incident: int) -> None:
        self._db().execute("INSERT INTO incident_alerts (incident_id, fingerprint, starts_at, alertname, status) "
                           "SELECT ?, fingerprint, starts_at, alertname, 'firing' FROM incident_alerts "
                           "WHERE incident_id = ? AND status = 'firing'", (to_incident, from_incident))

    def alert_firing(self, incident_id: int, fingerprint: str, starts_at: str, alertname: str) -> None:
        self._db().execute(
            "INSERT INTO incident_alerts (incident_id, fingerprint, starts_at, alertname, status) "
            "VALUES (?,?,?,?, 'firing') ON CONFLICT(incident_id, fingerprint, starts_at) DO UPDATE SET "
            "status = 'firing'", (incident_id, fingerprint, starts_at, alertname))

    def alert_resolves(self, incident_id: int, fingerprint: str, starts_at: str) -> None:
        self._db().execute("UPDATE incident_alerts SET status = 'resolved' WHERE incident_id = ? AND "
                           "fingerprint = ? AND (starts_at = ? OR ? = '')",
                           (incident_id, fingerprint, starts_at, starts_at))

    def move_incident(self, incident_id: int, at: float, state: IncidentState, *, close_reason: str | None = None,
                      last_decision: str | None = None, last_note: str | None = None,
                      next_check_at: float | None = None, warm_deadline: float | None = None) -> None:
        sets = ["state = ?", "updated_at = ?"]
        args: list[Any] = [IncidentState(state).value, at]
        if state == IS.CLOSED:
            sets.append("closed_at = ?")
            args.append(at)
        for column, value in (("close_reason", close_reason), ("last_decision", last_decision),
                              ("last_note", last_note), ("next_check_at", next_check_at),
                              ("warm_deadline", warm_deadline)):
            if value is not None:
                sets.append(f"{column} = ?")
                args.append(value)
        self._db().execute(f"UPDATE incidents SET {', '.join(sets)} WHERE id = ?", (*args, incident_id))

    def note_workload(self, incident_id: int, workload: str, members: tuple[str, ...]) -> None:
        self._db().execute("UPDATE incidents SET workload = ?, members = ? WHERE id = ?",
                           (workload, json.dumps(sorted(members)), incident_id))

    def take_replacement(self, incident_id: int, backend: str) -> bool:
        taken = self._db().execute("SELECT id FROM incidents WHERE replacement = ? AND state != ? AND id != ?",
                                   (backend, CLOSED, incident_id)).fetchone()
        if taken is not None:
            return False
        self._db().execute("UPDATE incidents SET replacement = ? WHERE id = ?", (backend, incident_id))
        return True

    def look_again_at(self, incident_id: int, t: float, note: str | None = None) -> None:
        if note is None:
            self._db().execute("UPDATE incidents SET next_check_at = ? WHERE id = ?", (t, incident_id))
        else:
            self._db().execute("UPDATE incidents SET next_check_at = ?, last_note = ? WHERE id = ?",
                               (t, note, incident_id))

    def note_decision(self, incident_id: int, at: float, note: str, decision: str, next_check_at: float) -> None:
        self._db().execute("UPDATE incidents SET last_note = ?, last_decision = ?, next_check_at = ?, "
                           "updated_at = ? WHERE id = ?", (note, decision, next_check_at, at, incident_id))

    def record_verification(self, incident_id: int, outcome: VerifyOutcome, at: float,
                            unresponsive_since: float | None, unresponsive_seen_at: float | None) -> None:
        self._db().execute("UPDATE incidents SET verified_outcome = ?, verified_at = ?, unresponsive_since = ?, "
                           "unresponsive_seen_at = ? WHERE id = ?",
                           (VerifyOutcome(outcome).value, at, unresponsive_since, unresponsive_seen_at,
                            incident_id))
