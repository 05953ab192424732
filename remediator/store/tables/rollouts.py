"""Rolling operations: `rollouts`, `rollout_members`, and each backend's stored command (`commands`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llm_health.remediator.store.rollout_rows import (
    ACTIVE_ROLLOUT_STATES,
    CommandRow,
    MemberStep,
    Rollout,
    RolloutMember,
    RolloutState,
)
from llm_health.remediator.store.tables.connected import Connected, Row, inserted_id

_ACTIVE = tuple(s.value for s in ACTIVE_ROLLOUT_STATES)


def rollout_of(r: Row) -> Rollout:
    return Rollout(id=int(r["id"]), state=RolloutState(r["state"]), argv=tuple(json.loads(r["argv"])),
                   canary=int(r["canary"]), per_host=int(r["per_host"]), soak=float(r["soak"]),
                   gate=dict(json.loads(r["gate"])), by=r["by"], reason=r["reason"], created_at=float(r["created_at"]),
                   updated_at=float(r["updated_at"]), finished_at=r["finished_at"], note=r["note"])


def _argv(text: str) -> tuple[str, ...] | None:
    raw = json.loads(text)
    return None if raw is None else tuple(raw)


def member_of(r: Row) -> RolloutMember:
    return RolloutMember(rollout_id=int(r["rollout_id"]), backend=r["backend"], host=r["host"],
                         position=int(r["position"]), canary=bool(r["canary"]), step=MemberStep(r["step"]),
                         argv=tuple(json.loads(r["argv"])), previous=_argv(r["previous"]),
                         incident_id=r["incident_id"], changed_at=r["changed_at"], soak_started_at=r["soak_started_at"],
                         query_errors=int(r["query_errors"]), inconclusive=int(r["inconclusive"]), note=r["note"])


class RolloutReads(Connected):
    def rollout(self, rollout_id: int) -> Rollout | None:
        r = self._db().execute("SELECT * FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return None if r is None else rollout_of(r)

    def rollouts(self, limit: int = 20) -> list[Rollout]:
        rows = self._db().execute("SELECT * FROM rollouts ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [rollout_of(r) for r in rows]

    def active_rollouts(self) -> list[Rollout]:
        marks = ",".join("?" * len(_ACTIVE))
        rows = self._db().execute(f"SELECT * FROM rollouts WHERE state IN ({marks}) ORDER BY id", _ACTIVE).fetchall()
        return [rollout_of(r) for r in rows]

    def rollout_counts(self) -> dict[RolloutState, int]:
        return {RolloutState(r[0]): int(r[1]) for r in
                self._db().execute("SELECT state, count(*) FROM rollouts GROUP BY state").fetchall()}

    def rollout_members(self, rollout_id: int) -> list[RolloutMember]:
        rows = self._db().execute("SELECT * FROM rollout_members WHERE rollout_id = ? ORDER BY position",
                                  (rollout_id,)).fetchall()
        return [member_of(r) for r in rows]

    def soaking(self, backend: str) -> RolloutMember | None:
        marks = ",".join("?" * len(_ACTIVE))
        r = self._db().execute(
            "SELECT m.* FROM rollout_members m JOIN rollouts r ON r.id = m.rollout_id WHERE m.backend = ? AND "
            f"m.step = ? AND r.state IN ({marks})", (backend, MemberStep.SOAKING.value, *_ACTIVE)).fetchone()
        return None if r is None else member_of(r)

    def command(self, backend: str) -> CommandRow | None:
        r = self._db().execute("SELECT * FROM commands WHERE backend = ?", (backend,)).fetchone()
        return None if r is None else CommandRow(backend=r["backend"], argv=tuple(json.loads(r["argv"])),
                                                 since=float(r["since"]), rollout_id=r["rollout_id"])

    def commands(self) -> dict[str, CommandRow]:
        return {r["backend"]: CommandRow(backend=r["backend"], argv=tuple(json.loads(r["argv"])), since=float(r["since"]),
                                         rollout_id=r["rollout_id"])
                for r in self._db().execute("SELECT * FROM commands").fetchall()}


_MEMBER_FIELDS = frozenset({"step", "incident_id", "changed_at", "soak_started_at", "query_errors", "inconclusive",
                            "note"})


class RolloutWrites(Connected):
    def add_rollout(self, rollout: Rollout, members: Sequence[RolloutMember]) -> int:
        c = self._db()
        rollout_id = inserted_id(
                        c, 'INSERT INTO rollouts (state, argv, canary, per_host, soak, gate, "by", reason, created_at, '
                        "updated_at, note) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (rollout.state.value, json.dumps(list(rollout.argv)), rollout.canary, rollout.per_host,
                         rollout.soak, json.dumps(rollout.gate), rollout.by, rollout.reason, rollout.created_at,
                         rollout.updated_at, rollout.note))
        for m in members:
            c.execute("INSERT INTO rollout_members (rollout_id, backend, host, position, canary, step, argv, previous, "
                      "note) VALUES (?,?,?,?,?,?,?,?,?)",
                      (rollout_id, m.backend, m.host, m.position, int(m.canary), m.step.value, json.dumps(list(m.argv)),
                       json.dumps(list(m.previous) if m.previous is not None else None), m.note))
        return rollout_id

    def move_rollout(self, rollout_id: int, at: float, state: RolloutState, note: str | None = None) -> None:
        finished = None if state in ACTIVE_ROLLOUT_STATES else at
        self._db().execute("UPDATE rollouts SET state = ?, updated_at = ?, finished_at = ?, note = COALESCE(?, note) "
                           "WHERE id = ?", (state.value, at, finished, note, rollout_id))

    def note_rollout(self, rollout_id: int, at: float, note: str) -> None:
        self._db().execute("UPDATE rollouts SET note = ?, updated_at = ? WHERE id = ?", (note, at, rollout_id))

    def update_member(self, rollout_id: int, backend: str, **values: Any) -> None:
        unknown = set(values) - _MEMBER_FIELDS
        if unknown:
            raise ValueError(f"not a member field: {', '.join(sorted(unknown))}")
        if "step" in values:
            values["step"] = MemberStep(values["step"]).value
        sets = ", ".join(f"{k} = ?" for k in values)
        self._db().execute(f"UPDATE rollout_members SET {sets} WHERE rollout_id = ? AND backend = ?",
                           (*values.values(), rollout_id, backend))

    def set_command(self, backend: str, argv: tuple[str, ...] | None, at: float, rollout_id: int | None) -> None:
        if argv is None:
            self._db().execute("DELETE FROM commands WHERE backend = ?", (backend,))
            return
        self._db().execute("INSERT INTO commands (backend, argv, since, rollout_id) VALUES (?,?,?,?) "
                           "ON CONFLICT(backend) DO UPDATE SET argv = excluded.argv, since = excluded.since, "
                           "rollout_id = excluded.rollout_id", (backend, json.dumps(list(argv)), at, rollout_id))
