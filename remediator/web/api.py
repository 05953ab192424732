"""/api: what the remediator knows (GET, no token) and what people may change (bearer token): busy
markers, the breaker, acknowledging an incident, and the operator commands (drain, undrain, retire,
activate: remediator/commands.py). Every view calls store verbs."""

from __future__ import annotations

import os
import secrets
from typing import Any

from flask import Blueprint, Response, jsonify, request

from llm_health.discovery import status_document
from llm_health.remediator import lease
from llm_health.remediator.commands import Command
from llm_health.remediator.operate import Request, carry_out
from llm_health.remediator.policy import Marker
from llm_health.remediator.store import ACKNOWLEDGEABLE, IncidentState
from llm_health.remediator.web.context import ctx
from llm_health.remediator.web.guard import MUTATING, BodyError, error, guard_mutation, json_body
from llm_health.remediator.web.views import HIDDEN_OUTPUT, backends_view, public_event, readiness_view

api = Blueprint("api", __name__, url_prefix="/api")


@api.before_request
def _guard() -> Any:
    if request.method in MUTATING:
        c = ctx()
        return guard_mutation(c.token, c.config.remediator.max_body_bytes)
    return None


@api.get("/backends")
def get_backends() -> Any:
    c = ctx()
    return jsonify({"backends": backends_view(c), "breaker": c.store.breaker().as_dict(),
                    "authority": lease.shown(c.store),
                    "dry_run": c.config.remediator.dry_run, "group": dict(c.config.remediator.group_labels)})


@api.get("/backends/<name>/readiness")
def get_readiness(name: str) -> Any:
    """Does this backend take traffic now? What each vLLM pod's readiness sidecar polls every few seconds
    (remediator/sidecar/), so it reads one backend's rows (AgentAnswers.status_for), not the fleet view."""
    status = ctx().answers.status_for(name, weigh=False)
    if status is None:
        return error(404, f"unknown backend {name[:80]!r}")
    return jsonify(readiness_view(name, status))


@api.get("/events")
def get_events() -> Any:
    """Newest first, at most retention.page_size per answer; the next page: ?before=<next_before>."""
    c = ctx()
    page_size = c.config.remediator.retention.page_size
    try:
        limit = min(max(int(request.args.get("limit", "100")), 1), page_size)
        before = int(request.args["before"]) if request.args.get("before") else None
    except ValueError:
        return error(400, "limit and before must be whole numbers")
    events = c.store.events(backend=request.args.get("backend", ""), limit=limit, kind=request.args.get("kind", ""),
                            before=before)
    authed = c.authenticated()
    return jsonify({"events": [public_event(e, authed) for e in events], "page_size": page_size,
                    "next_before": events[-1].id if len(events) == limit else None})


def marker_body(fields: str) -> dict[str, Any] | tuple[Response, int]:
    """A busy marker request's JSON object, or the error to answer."""
    try:
        data = json_body(ctx().config.remediator.max_body_bytes)
    except BodyError as exc:
        return error(exc.status, exc.message)
    if not isinstance(data, dict):
        return error(400, f"expected a JSON object {{{fields}}}")
    return data


def marker_ttl(data: dict[str, Any]) -> float | tuple[Response, int]:
    """ttl_seconds of a marker request (default min(3600, marker_max_ttl)), or the error to answer."""
    cap = ctx().config.remediator.marker_max_ttl
    ttl = data.get("ttl_seconds", min(3600.0, cap))
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= cap:
        return error(400, f"ttl_seconds must be a number in (0, {cap:g}] (remediator.marker_max_ttl)")
    return float(ttl)


@api.post("/busy")
def post_busy() -> Any:
    data = marker_body("backend, owner, ttl_seconds")
    if isinstance(data, tuple):
        return data
    c = ctx()
    backend, owner = data.get("backend"), data.get("owner", "")
    if not isinstance(backend, str) or c.config.backend(backend) is None:
        return error(404, f"unknown backend {str(backend)[:80]!r}")
    if not isinstance(owner, str) or not owner.strip() or len(owner) > 200:
        return error(400, "owner must be a non-empty string (at most 200 characters)")
    ttl = marker_ttl(data)
    if isinstance(ttl, tuple):
        return ttl
    now = c.clock()
    marker_id = secrets.token_hex(8)
    with c.store.tx() as tx:
        tx.add_marker(Marker(marker_id, backend, owner, now + ttl), now)
        tx.event(now, "marker_set", backend, reason=f"busy marker {marker_id} by {owner!r} for {ttl:g}s",
                 marker_id=marker_id, expires_at=now + ttl)
    return jsonify({"id": marker_id, "backend": backend, "owner": owner, "expires_at": now + ttl}), 201


@api.put("/busy/<marker_id>")
def refresh_busy(marker_id: str) -> Any:
    data = marker_body("ttl_seconds")
    if isinstance(data, tuple):
        return data
    ttl = marker_ttl(data)
    if isinstance(ttl, tuple):
        return ttl
    c = ctx()
    now = c.clock()
    with c.store.tx() as tx:
        refreshed = tx.refresh_marker(marker_id, now, now + ttl)
    if not refreshed:
        return error(404, f"no valid marker {marker_id[:40]!r} (expired or removed)")
    return jsonify({"id": marker_id, "expires_at": now + ttl})


@api.delete("/busy/<marker_id>")
def delete_busy(marker_id: str) -> Any:
    c = ctx()
    now = c.clock()
    with c.store.tx() as tx:
        gone = tx.remove_marker(marker_id)
        if gone is None:
            return error(404, f"no marker {marker_id[:40]!r}")
        tx.event(now, "marker_removed", gone.backend, reason=f"busy marker {marker_id} removed",
                 marker_id=marker_id, owner=gone.owner)
    return jsonify({"id": marker_id, "removed": True})


@api.post("/breaker/reset")
def reset_breaker() -> Any:
    c = ctx()
    now = c.clock()
    with c.store.tx() as tx:
        was = tx.reset_breaker(now)
        tx.event(now, "breaker_reset", reason="fleet circuit breaker reset through the API "
                 f"(was {'open' if was else 'closed'}); earlier restarts no longer count toward it")
    return jsonify({"breaker_open": False, "was_open": was})


@api.post("/backends/<name>/ack")
def ack(name: str) -> Any:
    c = ctx()
    if c.config.backend(name) is None:
        return error(404, f"unknown backend {name[:80]!r}")
    now = c.clock()
    with c.store.tx() as tx:
        inc = tx.active_incident(name)
        if inc is None or inc.state not in ACKNOWLEDGEABLE:
            state = inc.state if inc else "none"
            return error(409, f"nothing to acknowledge for {name}: active incident state is {state}")
        tx.move_incident(inc.id, now, IncidentState.CLOSED, close_reason="acknowledged")
        tx.event(now, "acknowledged", name, inc.id,
                 reason=f"incident {inc.id} ({inc.state}) acknowledged through the API; closed")
    return jsonify({"backend": name, "incident": inc.id, "closed": True})


@api.get("/backends/<name>/diagnostics")
def diagnostics(name: str) -> Any:
    """The backend's latest diagnostics capture (before a restart); its output only with the token (it
    may hold stacks, pages and log lines)."""
    c = ctx()
    if c.config.backend(name) is None:
        return error(404, f"unknown backend {name[:80]!r}")
    got = c.store.latest_capture(name)
    if got is None:
        return error(404, f"no diagnostics captured for {name}")
    out = got.as_dict()
    if not c.authenticated():
        out["output"] = HIDDEN_OUTPUT
    return jsonify(out)


@api.get("/discovery")
def discovery_view() -> Any:
    """Backends from Prometheus' targets: freshness, errors, refused targets and contested names (enabled
    false when off). Each gunicorn worker refreshes on its own: `worker` is the answering one's pid."""
    d = ctx().discovery
    return jsonify({**status_document(d.status()), "worker": os.getpid()} if d is not None else {"enabled": False})


MAX_REASON = 500
MAX_BY = 200


def command_view(command: Command) -> Any:
    def view(name: str) -> Any:
        c = ctx()
        if c.config.backend(name) is None:
            return error(404, f"unknown backend {name[:80]!r}")
        try:
            data = json_body(c.config.remediator.max_body_bytes)
        except BodyError as exc:
            return error(exc.status, exc.message)
        if not isinstance(data, dict):
            return error(400, "expected a JSON object {reason, by, force?}")
        reason, by, force = data.get("reason"), data.get("by"), data.get("force", False)
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
            return error(400, f"reason must be a non-empty string (at most {MAX_REASON} characters): it goes to "
                         "the audit log")
        if not isinstance(by, str) or not by.strip() or len(by) > MAX_BY:
            return error(400, f"by must be a non-empty string (at most {MAX_BY} characters): who asks")
        if not isinstance(force, bool):
            return error(400, "force must be true or false")
        done = carry_out(c.store, c.config, Request(command, name, by.strip(), reason.strip(), force), c.clock())
        p = done.plan
        body = {"backend": name, "command": command.value, "changed": p.changes, "admin": done.admin.value,
                "reason": p.reason, "forced": p.forced, "incident": done.incident_id}
        if p.refused is not None:
            return jsonify({**body, "error": p.reason, "refusal": p.refused.value}), 409
        return jsonify(body)

    view.__name__ = f"command_{command.value}"
    return view


for _command in Command:
    api.add_url_rule(f"/backends/<name>/{_command.value}", view_func=command_view(_command), methods=["POST"])
