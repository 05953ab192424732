"""Each backend's lifecycle state in SQLite: read it, and change it only through `lifecycle.transition`.

One row per backend in the `lifecycle` table (state, since = time of the last transition, reason, the
incident whose restart owns the state, the drain deadline and the counters read when the drain began).
Every legal transition is an audit event `lifecycle` ("ready -> draining: ..."); an illegal one changes
nothing and is recorded as `lifecycle_refused`. Every gunicorn worker reads the same rows, so the API,
/metrics, the status page and the agent check agree.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from typing import Any

from llm_health.remediator.lifecycle import IllegalTransition, LifecycleState, transition
from llm_health.remediator.store import Store

from llm_health.config import Config

log = logging.getLogger("llm_health.remediator")

S = LifecycleState

#: the state of a backend that has no row yet (the authority has not looked at it)
UNSEEN = S.INITIALIZING


def row(c: sqlite3.Connection, backend: str) -> sqlite3.Row | None:
    return c.execute("SELECT * FROM lifecycle WHERE backend = ?", (backend,)).fetchone()


def state_of(c: sqlite3.Connection, backend: str) -> LifecycleState:
    r = row(c, backend)
    return LifecycleState(r["state"]) if r else UNSEEN


def all_rows(c: sqlite3.Connection) -> dict[str, sqlite3.Row]:
    return {r["backend"]: r for r in c.execute("SELECT * FROM lifecycle").fetchall()}


def owned(r: sqlite3.Row | None) -> bool:
    """The state belongs to a restart of ours (not the start-up wait of a backend never seen READY)."""
    return r is not None and r["incident_id"] is not None


def gate_states(c: sqlite3.Connection, config: Config) -> dict[str, LifecycleState]:
    """States for the start gates (`lifecycle.may_start` / `may_drain`).

    A backend waiting since start-up to answer for the first time is INITIALIZING but is not being
    restarted by us: it must not hold its host's mutex (nor its own restart), so it is left out here.
    It is not READY either, so it never counts toward min_ready.
    """
    rows = all_rows(c)
    out: dict[str, LifecycleState] = {}
    for b in config.backends:
        r = rows.get(b.name)
        st = LifecycleState(r["state"]) if r else UNSEEN
        if st == S.INITIALIZING and not owned(r):
            continue
        out[b.name] = st
    return out


def hosts(config: Config) -> Mapping[str, str]:
    return {b.name: b.host for b in config.backends}


def ensure(c: sqlite3.Connection, backend: str, now: float) -> sqlite3.Row:
    """The backend's row; a backend never seen starts INITIALIZING (not a transition: no event)."""
    r = row(c, backend)
    if r is None:
        c.execute("INSERT INTO lifecycle (backend, state, since, reason) VALUES (?,?,?,?)",
                  (backend, UNSEEN.value, now, "first seen: waiting for /health and /v1/models"))
        r = row(c, backend)
        assert r is not None
    return r


def move(c: sqlite3.Connection, backend: str, target: LifecycleState, now: float, reason: str,
         incident_id: int | None = None, **cols: Any) -> bool:
    """One lifecycle step inside the caller's transaction. False (and a `lifecycle_refused` event) when
    the table does not allow it; nothing is changed then. DRAINING/STOPPED/INITIALIZING reached with an
    incident_id belong to that incident's restart; READY and ERROR belong to nobody."""
    current = ensure(c, backend, now)
    source = LifecycleState(current["state"])
    try:
        t = transition(source, target, now, reason)
    except IllegalTransition as exc:
        log.warning("%s: %s", backend, exc)
        Store.event(c, now, "lifecycle_refused", backend, incident_id, reason=str(exc),
                    source=source.value, target=LifecycleState(target).value)
        return False
    sets: dict[str, Any] = {"state": t.target.value, "since": t.at, "reason": t.reason, **cols}
    if t.target in (S.READY, S.ERROR):
        sets["incident_id"] = None           # no restart owns the state any more
    elif incident_id is not None:
        sets["incident_id"] = incident_id    # the restart of this incident owns the state
    if t.target != S.DRAINING:
        sets.setdefault("drain_deadline", None)
        sets.setdefault("drain_baseline", "")
    assign = ", ".join(f"{k} = ?" for k in sets)
    c.execute(f"UPDATE lifecycle SET {assign} WHERE backend = ?", (*sets.values(), backend))
    Store.event(c, now, "lifecycle", backend, incident_id, reason=f"{t.source.value} -> {t.target.value}: {t.reason}",
                source=t.source.value, target=t.target.value)
    return True


def set_owner(c: sqlite3.Connection, backend: str, incident_id: int | None) -> None:
    c.execute("UPDATE lifecycle SET incident_id = ? WHERE backend = ?", (incident_id, backend))


def view(r: sqlite3.Row | None) -> dict[str, Any]:
    """What the API and the status page show."""
    if r is None:
        return {"state": UNSEEN.value, "since": None, "reason": "not looked at by the remediator yet",
                "incident_id": None, "drain_deadline": None}
    return {"state": r["state"], "since": r["since"], "reason": r["reason"], "incident_id": r["incident_id"],
            "drain_deadline": r["drain_deadline"]}
