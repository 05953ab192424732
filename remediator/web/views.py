"""What the API and the status page show: read models built from store verbs (every worker agrees)."""

from __future__ import annotations

from typing import Any

from llm_health.redact import redact
from llm_health.remediator import policy
from llm_health.remediator.agent_check import AgentStatus, takes_traffic
from llm_health.remediator.clock import Clocks, injected
from llm_health.remediator.lifecycle import UNSEEN
from llm_health.remediator.marker import file_markers
from llm_health.remediator.sequence import has_restart
from llm_health.remediator.store import AdminRow, AdminState, Event, LifecycleRow
from llm_health.remediator.web.context import WebContext

HIDDEN_OUTPUT = "[hidden: send the bearer token to see action output]"
# Incident and lifecycle columns that hold monotonic deadlines (remediator/clock.py): shown as wall time.
MONOTONIC_INCIDENT_FIELDS = ("next_check_at", "warm_deadline", "unresponsive_since")


def shown(clocks: Clocks, row: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """A row for people: its monotonic instants converted to wall time (None stays None)."""
    return {k: (clocks.wall_of(float(v)) if k in fields and v is not None else v) for k, v in row.items()}


def public_event(event: Event, authenticated: bool) -> dict[str, Any]:
    """An audit event as shown: URLs redacted; restart output only to requests with the token."""
    out = redact(event.as_dict())
    detail = out.get("detail")
    if not authenticated and isinstance(detail, dict) and "output" in detail:
        out["detail"] = {**detail, "output": HIDDEN_OUTPUT}
    return out


def lifecycle_view(r: LifecycleRow | None) -> dict[str, Any]:
    """A backend's lifecycle as the API and the status page show it."""
    if r is None:
        return {"state": UNSEEN.value, "since": None, "reason": "not looked at by the remediator yet",
                "incident_id": None, "drain_deadline": None}
    return {"state": r.state.value, "since": r.since, "reason": r.reason, "incident_id": r.incident_id,
            "drain_deadline": r.drain_deadline}


def admin_view(a: AdminRow | None) -> dict[str, Any]:
    """An operator's hold as shown (in service: no hold)."""
    if a is None:
        return {"state": AdminState.IN_SERVICE.value, "since": None, "by": "", "reason": ""}
    return a.as_dict()


def readiness_view(name: str, status: AgentStatus) -> dict[str, Any]:
    """Whether a backend takes traffic, for Kubernetes (`llm-health readiness`): the agent's rule
    (agent_check.takes_traffic), with the true lifecycle and operator states and why."""
    ready = takes_traffic(status)
    return {"backend": name, "ready": ready, "lifecycle": status.state.value, "admin": status.admin.value,
            "reason": status.reason or ("ready and in service" if ready else status.state.value)}


def backends_view(c: WebContext) -> list[dict[str, Any]]:
    clocks = injected(c.clock)
    store = c.store
    now = c.clock()
    r = c.config.remediator
    out = []
    busy_dir = c.config.resolve_path(r.busy_dir) if r.busy_dir else None
    lifecycles = store.lifecycles()
    admins = store.admins()
    for b in c.config.backends:
        inc = store.active_incident(b.name)
        last = store.last_event(b.name, skip_kinds=("received",))
        restarts = store.restart_counts(b.name)
        times = store.restart_times(b.name, include_dry_run=r.dry_run, now=now, mono=clocks.mono(), boot=clocks.boot)
        allowed = policy.next_allowed(times, now, r.backoff)
        markers = list(store.markers(b.name))
        if busy_dir is not None:
            markers += file_markers(busy_dir, b.name, r.busy_file_ttl, r.marker_max_ttl, now=now)
        out.append({
            "backend": b.name,
            "url": redact(b.url),
            "host": b.host,
            "labels": dict(b.labels),
            "lifecycle": shown(clocks, lifecycle_view(lifecycles.get(b.name)), ("drain_deadline",)),
            "admin": admin_view(admins.get(b.name)),
            "diagnostics": diag.summary() if (diag := store.latest_capture(b.name)) is not None else None,
            "restart_configured": has_restart(b),
            "incident": shown(clocks, inc.as_dict(), MONOTONIC_INCIDENT_FIELDS) if inc else None,
            "last_decision": redact({"kind": last.kind, "reason": last.reason, "at": last.at}) if last else None,
            "restarts": {result: n for (_, result), n in restarts.items()},
            "next_allowed_restart": allowed,
            "markers": [{"id": m.id, "owner": m.owner, "expires_at": m.expires_at} for m in markers
                        if m.valid(now)],
        })
    return out


