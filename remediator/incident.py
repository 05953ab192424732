"""Alerts -> incidents: dedupe deliveries and keep one active incident per backend.

A restart alert about another group (cluster, namespace: llm_health/groups.py) than this remediator's or
its backend's is recorded and ignored; an incident records the group labels of the alert that opened it.

Everything happens in one write transaction per notification (the webhook's may share it with the
worker's other notifications of the moment, each in arrival order: store/group.py), so concurrent HA
copies arriving at different gunicorn workers are serialised: the first is processed, the rest are
recorded as `deduplicated`.

With service discovery on, each gunicorn worker refreshes its own backend list, so the worker that
receives a restart alert may not know a backend discovered moments ago. Such an alert (a valid
backend name, not a proxy) still opens its incident; the authority looks the name up after its next
discovery refresh and closes the incident as "backend no longer configured" if it is really unknown
(remediator/restart/reconcile.py). The webhook itself never queries Prometheus: it answers at once.
"""

from __future__ import annotations

from typing import Any

from llm_health import groups
from llm_health.config import NAME_RE, Backend, Config
from llm_health.remediator import heartbeat
from llm_health.remediator.alert import Alert, Notification
from llm_health.remediator.store import NO_RESTART_UNDER_WAY, Incident, IncidentState, Transaction


def route(alert: Alert, config: Config) -> Backend | None:
    """The backend an alert is about: its `backend` label, else its `instance` label matched to URLs."""
    name = alert.labels.get("backend")
    if name:
        return config.backend(name)
    instance = alert.labels.get("instance")
    if instance:
        return config.backend_for_instance(instance)
    return None


def not_ours(alert: Alert, config: Config, backend: Backend | None) -> str | None:
    """Why a restart alert is about another group than this remediator's or its backend's, else None
    (llm_health/groups.py: the same name in another cluster or namespace is another backend)."""
    why = groups.mismatch(alert.labels, config.remediator.group_labels, "this remediator")
    if why is None and backend is not None:
        why = groups.mismatch(alert.labels, backend.labels, f"backend {backend.name}")
    return why


def _brief(alert: Alert) -> dict[str, Any]:
    out: dict[str, Any] = {"alertname": alert.name[:200], "status": alert.status,
                           "fingerprint": alert.fingerprint, "startsAt": alert.starts_at}
    group = groups.group_of(alert.labels)
    if group:
        out["group"] = dict(group)
    return out


def record(tx: Transaction, config: Config, n: Notification, now: float, dedup_window: float) -> dict[str, Any]:
    """Record one notification, and when it arrived (heartbeat.stamp), in the one write transaction `tx` (a
    second one per notification doubled the writers queueing for the state's write lock in a storm); returns
    a summary for the HTTP answer."""
    heartbeat.stamp(tx, n, now)
    for a in n.alerts:
        tx.bump("alerts_received", a.status)
    key = n.dedup_key()
    seen = tx.delivery_seen_at(key)
    if seen is not None and now - seen < dedup_window:
        tx.event(now, "deduplicated", reason="same notification seen "
                 f"{now - seen:.1f}s ago (HA copy or resend)", group_key=n.group_key[:200], sender=n.sender)
        return {"deduplicated": True, "alerts": len(n.alerts)}
    tx.remember_delivery(key, now, forget_before=now - max(dedup_window, 3600.0) * 2)
    tx.event(now, "received", reason=f"{n.status} notification with {len(n.alerts)} alert(s)",
             group_key=n.group_key[:200], receiver=n.receiver, sender=n.sender)
    outcomes = [_apply(tx, config, a, now, dedup_window) for a in n.alerts]
    return {"deduplicated": False, "alerts": len(n.alerts), "outcomes": outcomes}


def maybe_discovered(alert: Alert, config: Config) -> str | None:
    """The backend name of a restart alert that no backend of this worker matches but that service
    discovery may know (discovery on, a valid backend name that is no proxy's), else None."""
    name = alert.labels.get("backend", "")
    if config.live_discovery() is None or not alert.wants_restart or not NAME_RE.fullmatch(name):
        return None
    return None if any(p.name == name for p in config.proxies) else name


def _apply(tx: Transaction, config: Config, alert: Alert, now: float, dedup_window: float) -> str:
    backend = route(alert, config)
    name = backend.name if backend is not None else maybe_discovered(alert, config)
    if name is None:
        tx.event(now, "ignored", reason="no configured backend matches this alert (backend / instance label)",
                 **_brief(alert), labels={k[:100]: v[:200] for k, v in list(alert.labels.items())[:30]})
        return "ignored"
    if alert.wants_restart:
        why = not_ours(alert, config, backend)
        if why is not None:
            tx.event(now, "ignored", name, None, reason=f"{alert.name or 'alert'} {alert.status} about {name}: {why}",
                     **_brief(alert))
            return "ignored"
    active = tx.active_incident(name)
    active_id = active.id if active is not None else None
    if not alert.wants_restart:
        tx.event(now, "signal", name, active_id, reason=f"{alert.name or 'alert'} {alert.status}: recorded as a signal "
                 "(no remediation=\"restart\" label)", **_brief(alert))
        return "signal"
    if alert.status == "firing":
        if _late_resend(tx, alert, now, dedup_window):
            tx.event(now, "stale_firing", name, active_id,
                     reason=f"{alert.name or 'alert'} firing, but this very alert (fingerprint and startsAt) was "
                     f"resolved less than {dedup_window:g}s ago: a late resend, ignored (a new firing has a new "
                     "startsAt)", **_brief(alert))
            return "stale_firing"
        # the group labels to keep with the incident: the backend's, or, for a backend this worker has not
        # discovered yet, every label discovery may give it (compared when it is found: restart/reconcile.py)
        theirs = [n for n, _ in backend.labels] if backend is not None else list(config.discovery.group_labels)
        scope = [n for n, _ in config.remediator.group_labels] + theirs
        return _firing(tx, name, active, alert, now, groups.group_of(alert.labels, scope), unseen=backend is None)
    if alert.starts_at:
        tx.remember_resolved(alert.fingerprint, alert.starts_at, now)
    return _resolved(tx, name, active, alert, now)


def _late_resend(tx: Transaction, alert: Alert, now: float, window: float) -> bool:
    """Alertmanager identifies one firing of an alert by (fingerprint, startsAt): Prometheus keeps
    startsAt while the alert stays active and gives a new one when it fires again after resolving.
    A firing copy of an alert whose resolution came less than `window` (remediator.dedup_window) ago is a
    late resend (an HA peer's copy, a retry). Later, the same firing is the alert still active after
    Alertmanager resolved it by its resolve_timeout (Prometheus restarting or cut off from it for minutes):
    a real failure going on, not a resend, so it opens an incident again."""
    if not alert.starts_at:
        return False
    resolved_at = tx.alert_resolved_at(alert.fingerprint, alert.starts_at)
    return resolved_at is not None and now - resolved_at < window


def _firing(tx: Transaction, backend: str, active: Incident | None, alert: Alert, now: float,
            group: groups.Labels, unseen: bool = False) -> str:
    if active is None:
        incident_id = tx.open_incident(backend, now, group)
        note = (" (a backend this worker's service discovery has not seen yet: looked up after its next refresh)"
                if unseen else "")
        tx.event(now, "incident_opened", backend, incident_id, reason=f"{alert.name or 'alert'} firing{note}",
                 **_brief(alert))
        result = "incident_opened"
    else:
        incident_id = active.id
        known = tx.alert_known(incident_id, alert.fingerprint, alert.starts_at)
        tx.event(now, "absorbed", backend, incident_id,
                 reason=f"{alert.name or 'alert'} firing {'(repeat)' if known else '(new alert)'} "
                 f"absorbed into incident {incident_id} ({active.state})", **_brief(alert))
        result = "absorbed"
    tx.alert_firing(incident_id, alert.fingerprint, alert.starts_at, alert.name[:200])
    return result


def _resolved(tx: Transaction, backend: str, active: Incident | None, alert: Alert, now: float) -> str:
    if active is None:
        tx.event(now, "signal", backend, None, reason=f"{alert.name or 'alert'} resolved; no active incident",
                 **_brief(alert))
        return "signal"
    incident_id = active.id
    tx.alert_resolves(incident_id, alert.fingerprint, alert.starts_at)
    firing = tx.firing_alerts(incident_id)
    if firing:
        tx.event(now, "signal", backend, incident_id,
                 reason=f"{alert.name or 'alert'} resolved; {firing} alert(s) of the incident still firing",
                 **_brief(alert))
        return "signal"
    if active.requested_by and active.state == IncidentState.OPEN:
        tx.event(now, "signal", backend, incident_id, reason=f"{alert.name or 'alert'} resolved; the restart "
                 f"{active.requested_by} asked for stays", **_brief(alert))
        return "signal"
    if active.state in NO_RESTART_UNDER_WAY:
        tx.move_incident(incident_id, now, IncidentState.CLOSED, close_reason="resolved")
        tx.event(now, "resolved", backend, incident_id, reason=f"all alerts of incident {incident_id} resolved; closed",
                 **_brief(alert))
        return "resolved"
    tx.event(now, "signal", backend, incident_id,
             reason=f"alerts resolved while {active.state}; the incident closes after warm-up", **_brief(alert))
    return "signal"
