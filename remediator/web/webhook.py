"""POST /webhook: Alertmanager's notifications. Validated, recorded in one short transaction, answered 2xx;
the authority does the work (often in another gunicorn worker), from the store. When it arrived is stamped
in that same transaction (remediator/heartbeat.py: the remediator's own dead man's switch)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify

from llm_health.remediator import heartbeat
from llm_health.remediator.alert import PayloadError, parse_notification
from llm_health.remediator.incident import ingest
from llm_health.remediator.web.context import ctx
from llm_health.remediator.web.guard import BodyError, error, guard_mutation, json_body

webhook = Blueprint("webhook", __name__)


@webhook.post("/webhook")
def receive() -> Any:
    c = ctx()
    limit = c.config.remediator.max_body_bytes
    refused = guard_mutation(c.token, limit)
    if refused is not None:
        return refused
    try:
        notification = parse_notification(json_body(limit))
    except BodyError as exc:
        return error(exc.status, exc.message)
    except PayloadError as exc:
        return error(400, f"not an Alertmanager webhook payload: {exc}")
    now = c.clock()
    if heartbeat.only_watchdogs(notification):       # the dead man's switch: stamped, nothing else
        return jsonify({"accepted": True, **heartbeat.watchdogs_only(c.store, notification, now)}), 202
    # never a Prometheus query here: an alert about a backend this worker's discovery has not seen yet
    # opens its incident, and the authority looks it up after a (rate-limited) refresh (incident.py)
    summary = ingest(c.store, c.config, notification, now, c.config.remediator.dedup_window)   # stamps it too
    return jsonify({"accepted": True, **summary}), 202
