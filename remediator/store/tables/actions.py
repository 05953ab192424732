"""Restart actions: `actions` (the intent first, the result later; budget, backoff and breaker count them)."""

from __future__ import annotations

from typing import Any

from llm_health.remediator.store.rows import Action, ActionResultKind
from llm_health.remediator.store.shared import placed
from llm_health.remediator.store.tables.connected import Connected, Row, inserted_id

DRY_RUN = ActionResultKind.DRY_RUN.value
RUNNING = ActionResultKind.RUNNING.value


def action_of(r: Row | None) -> Action | None:
    if r is None:
        return None
    return Action(id=int(r["id"]), incident_id=int(r["incident_id"]), backend=r["backend"], argv=r["argv"],
                  holder=r["holder"], started_at=float(r["started_at"]), finished_at=r["finished_at"],
                  result=r["result"], exit_code=r["exit_code"], output=r["output"], status_path=r["status_path"],
                  started_mono=r["started_mono"], boot=r["boot"])


class ActionReads(Connected):
    def restart_times(self, backend: str | None, since: float = 0.0, include_dry_run: bool = False, *,
                      now: float | None = None, mono: float | None = None, boot: str = "",
                      after_action: int | None = None, planned: bool = True) -> tuple[float, ...]:
        sql = "SELECT started_at, started_mono, boot FROM actions WHERE "
        if after_action is not None:
            sql += "id > ?"
            args: list[Any] = [after_action]
        else:
            sql += "started_at >= ?"
            args = [since]
        if backend is not None:
            sql += " AND backend = ?"
            args.append(backend)
        if not include_dry_run:
            sql += " AND (result IS NULL OR result != ?)"
            args.append(DRY_RUN)
        if not planned:
            sql += " AND incident_id NOT IN (SELECT id FROM incidents WHERE command != '')"
        return tuple(placed(float(r["started_at"]), r["started_mono"], r["boot"], now=now, mono=mono, this_boot=boot)
                     for r in self._db().execute(sql, args).fetchall())

    def restart_counts(self, backend: str | None = None) -> dict[tuple[str, str], int]:
        sql = ("SELECT backend, coalesce(result, ?) AS result, count(*) AS n FROM actions "
               "WHERE coalesce(result, '') != ?")
        args: list[Any] = [RUNNING, DRY_RUN]
        if backend is not None:
            sql += " AND backend = ?"
            args.append(backend)
        rows = self._db().execute(sql + " GROUP BY 1, 2", args).fetchall()
        return {(r["backend"], r["result"]): int(r["n"]) for r in rows}

    def action(self, action_id: int) -> Action | None:
        return action_of(self._db().execute("SELECT * FROM actions WHERE id = ?", (action_id,)).fetchone())

    def unfinished_actions(self) -> list[Action]:
        rows = self._db().execute("SELECT * FROM actions WHERE result IS NULL").fetchall()
        return [a for a in map(action_of, rows) if a is not None]

    def unfinished_action(self, incident_id: int) -> Action | None:
        return action_of(self._db().execute("SELECT * FROM actions WHERE incident_id = ? AND result IS NULL "
                                            "ORDER BY id DESC LIMIT 1", (incident_id,)).fetchone())

    def latest_action(self, incident_id: int) -> Action | None:
        return action_of(self._db().execute("SELECT * FROM actions WHERE incident_id = ? ORDER BY id DESC LIMIT 1",
                                            (incident_id,)).fetchone())

    def latest_unfinished_start(self, holder: str) -> float | None:
        at = self._db().execute("SELECT max(started_at) FROM actions WHERE holder = ? AND result IS NULL",
                                (holder,)).fetchone()[0]
        return None if at is None else float(at)


class ActionWrites(Connected):
    def add_action(self, incident_id: int, backend: str, argv: str, holder: str, at: float, mono: float,
                   boot: str) -> int:
        return inserted_id(self._db(),
                           "INSERT INTO actions (incident_id, backend, argv, holder, started_at, started_mono, boot) "
                           "VALUES (?,?,?,?,?,?,?)", (incident_id, backend, argv, holder, at, mono, boot))

    def add_dry_run(self, incident_id: int, backend: str, holder: str, at: float, mono: float, boot: str) -> None:
        self._db().execute(
            "INSERT INTO actions (incident_id, backend, argv, holder, started_at, finished_at, result, started_mono, "
            "boot) VALUES (?,?,?,?,?,?,?,?,?)", (incident_id, backend, "", holder, at, at, DRY_RUN, mono, boot))

    def set_status_path(self, action_id: int, path: str) -> None:
        self._db().execute("UPDATE actions SET status_path = ? WHERE id = ?", (path, action_id))

    def finish_action(self, action_id: int, at: float, result: str, exit_code: int | None = None,
                      output: str = "") -> bool:
        return bool(self._db().execute(
            "UPDATE actions SET result = ?, exit_code = ?, output = ?, finished_at = ? WHERE id = ? AND result IS NULL",
            (str(result), exit_code, output, at, action_id)).rowcount)
