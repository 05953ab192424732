"""Alerts -> incidents: dedupe deliveries and keep one active incident per backend.

Everything happens in one BEGIN IMMEDIATE transaction per notification, so concurrent HA copies
arriving at different gunicorn workers are serialised: the first is processed, the rest are
recorded as `deduplicated`.

With service discovery on, each gunicorn worker refreshes its own backend list, so the worker that
receives a restart alert may not know a backend discovered moments ago. Such an alert (a valid
backend name, not a proxy) still opens its incident; the authority looks the name up after its next
discovery refresh and closes the incident as "backend no longer configured" if it is really unknown
(remediator/procedure.py). The webhook itself never queries Prometheus: it answers at once.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from llm_health.remediator.alert import Alert, Notification
from llm_health.remediator.store import CLOSED, NEEDS_ACK, OBSERVED, OPEN, Store

from llm_health.config import NAME_RE, Backend, Config


def route(alert: Alert, config: Config) -> Backend | None:
    """The backend an alert is about: its `backend` label, else its `instance` label matched to URLs."""
    name = alert.labels.get("backend")
    if name:
        return config.backend(name)
    instance = alert.labels.get("instance")
    if instance:
        return config.backend_for_instance(instance)
    return None


def _brief(alert: Alert) -> dict[str, Any]:
    return {"alertname": alert.name[:200], "status": alert.status, "fingerprint": alert.fingerprint,
            "startsAt": alert.starts_at}


def ingest(store: Store, config: Config, n: Notification, now: float, dedup_window: float) -> dict[str, Any]:
    """Record one notification; returns a summary for the HTTP answer."""
    with store.tx() as c:
        for a in n.alerts:
            Store.bump(c, "alerts_received", a.status)
        key = n.dedup_key()
        seen = c.execute("SELECT first_seen FROM deliveries WHERE key = ?", (key,)).fetchone()
        if seen is not None and now - float(seen[0]) < dedup_window:
            Store.event(c, now, "deduplicated", reason="same notification seen "
                        f"{now - float(seen[0]):.1f}s ago (HA copy or resend)", group_key=n.group_key[:200],
                        sender=n.sender)
            return {"deduplicated": True, "alerts": len(n.alerts)}
        c.execute("INSERT INTO deliveries (key, first_seen) VALUES (?, ?) "
                  "ON CONFLICT(key) DO UPDATE SET first_seen = excluded.first_seen", (key, now))
        c.execute("DELETE FROM deliveries WHERE first_seen < ?", (now - max(dedup_window, 3600.0) * 2,))
        Store.event(c, now, "received", reason=f"{n.status} notification with {len(n.alerts)} alert(s)",
                    group_key=n.group_key[:200], receiver=n.receiver, sender=n.sender)
        outcomes = [_apply(c, config, a, now) for a in n.alerts]
    return {"deduplicated": False, "alerts": len(n.alerts), "outcomes": outcomes}


def maybe_discovered(alert: Alert, config: Config) -> str | None:
    """The backend name of a restart alert that no backend of this worker matches but that service
    discovery may know (discovery on, a valid backend name that is no proxy's), else None."""
    name = alert.labels.get("backend", "")
    if config.live_discovery() is None or not alert.wants_restart or not NAME_RE.fullmatch(name):
        return None
    return None if any(p.name == name for p in config.proxies) else name


def _apply(c: sqlite3.Connection, config: Config, alert: Alert, now: float) -> str:
    backend = route(alert, config)
    name = backend.name if backend is not None else maybe_discovered(alert, config)
    if name is None:
        Store.event(c, now, "ignored", reason="no configured backend matches this alert "
                    "(backend / instance label)", **_brief(alert),
                    labels={k[:100]: v[:200] for k, v in list(alert.labels.items())[:30]})
        return "ignored"
    active = Store.active_incident(c, name)
    if not alert.wants_restart:
        Store.event(c, now, "signal", name, active["id"] if active else None,
                    reason=f"{alert.name or 'alert'} {alert.status}: recorded as a signal "
                    "(no remediation=\"restart\" label)", **_brief(alert))
        return "signal"
    if alert.status == "firing":
        if _already_resolved(c, alert):
            Store.event(c, now, "stale_firing", name, active["id"] if active else None,
                        reason=f"{alert.name or 'alert'} firing, but this very alert (fingerprint and startsAt) was "
                        "already resolved: a late resend, ignored (a new firing has a new startsAt)", **_brief(alert))
            return "stale_firing"
        return _firing(c, name, active, alert, now, unseen=backend is None)
    if alert.starts_at:
        c.execute("INSERT OR IGNORE INTO resolved_alerts (fingerprint, starts_at, resolved_at) VALUES (?,?,?)",
                  (alert.fingerprint, alert.starts_at, now))
    return _resolved(c, name, active, alert, now)


def _already_resolved(c: sqlite3.Connection, alert: Alert) -> bool:
    """Alertmanager identifies one firing of an alert by (fingerprint, startsAt): Prometheus keeps
    startsAt while the alert stays active and gives a new one when it fires again after resolving.
    A firing copy of an alert whose resolution we already have is a late resend (HA peer, retry)."""
    if not alert.starts_at:
        return False
    return c.execute("SELECT 1 FROM resolved_alerts WHERE fingerprint = ? AND starts_at = ?",
                     (alert.fingerprint, alert.starts_at)).fetchone() is not None


def _firing(c: sqlite3.Connection, backend: str, active: sqlite3.Row | None, alert: Alert, now: float,
            unseen: bool = False) -> str:
    if active is None:
        cur = c.execute("INSERT INTO incidents (backend, state, opened_at, updated_at) VALUES (?,?,?,?)",
                        (backend, OPEN, now, now))
        incident_id = int(cur.lastrowid or 0)
        note = (" (a backend this worker's service discovery has not seen yet: looked up after its next refresh)"
                if unseen else "")
        Store.event(c, now, "incident_opened", backend, incident_id,
                    reason=f"{alert.name or 'alert'} firing{note}", **_brief(alert))
        result = "incident_opened"
    else:
        incident_id = int(active["id"])
        known = c.execute("SELECT 1 FROM incident_alerts WHERE incident_id=? AND fingerprint=? AND starts_at=?",
                          (incident_id, alert.fingerprint, alert.starts_at)).fetchone()
        Store.event(c, now, "absorbed", backend, incident_id,
                    reason=f"{alert.name or 'alert'} firing {'(repeat)' if known else '(new alert)'} "
                    f"absorbed into incident {incident_id} ({active['state']})", **_brief(alert))
        result = "absorbed"
    c.execute(
        "INSERT INTO incident_alerts (incident_id, fingerprint, starts_at, alertname, status) VALUES (?,?,?,?,?) "
        "ON CONFLICT(incident_id, fingerprint, starts_at) DO UPDATE SET status = 'firing'",
        (incident_id, alert.fingerprint, alert.starts_at, alert.name[:200], "firing"),
    )
    return result


def _resolved(c: sqlite3.Connection, backend: str, active: sqlite3.Row | None, alert: Alert, now: float) -> str:
    if active is None:
        Store.event(c, now, "signal", backend, None,
                    reason=f"{alert.name or 'alert'} resolved; no active incident", **_brief(alert))
        return "signal"
    incident_id = int(active["id"])
    c.execute("UPDATE incident_alerts SET status = 'resolved' WHERE incident_id=? AND fingerprint=? "
              "AND (starts_at=? OR ?='')", (incident_id, alert.fingerprint, alert.starts_at, alert.starts_at))
    firing = c.execute("SELECT count(*) FROM incident_alerts WHERE incident_id=? AND status='firing'",
                       (incident_id,)).fetchone()[0]
    if firing:
        Store.event(c, now, "signal", backend, incident_id,
                    reason=f"{alert.name or 'alert'} resolved; {firing} alert(s) of the incident still firing",
                    **_brief(alert))
        return "signal"
    if active["state"] in (OPEN, OBSERVED, NEEDS_ACK):
        Store.set_state(c, incident_id, now, CLOSED, close_reason="resolved")
        Store.event(c, now, "resolved", backend, incident_id,
                    reason=f"all alerts of incident {incident_id} resolved; closed", **_brief(alert))
        return "resolved"
    Store.event(c, now, "signal", backend, incident_id,
                reason=f"alerts resolved while {active['state']}; the incident closes after warm-up",
                **_brief(alert))
    return "signal"
