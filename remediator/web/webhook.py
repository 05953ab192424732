"""POST /webhook: Alertmanager's notifications. Validated, recorded in one short transaction (shared with the
worker's other notifications of the moment: store/group.py), answered 2xx once committed;
the authority does the work (often in another gunicorn worker), from the store. When it arrived is stamped
in that same transaction (remediator/heartbeat.py: the remediator's own dead man's switch)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify

from llm_health.remediator import heartbeat
from llm_health.remediator.alert import PayloadError, parse_notification
from llm_health.remediator.incident import record
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
        summary = c.writes.run(lambda tx: heartbeat.watchdogs_only(tx, notification, now))
        return jsonify({"accepted": True, **summary}), 202
    # never a Prometheus query here: an alert about a backend this worker's discovery has not seen yet
    # opens its incident, and the authority looks it up after a (rate-limited) refresh (incident.py)
    window = c.config.remediator.dedup_window
    summary = c.writes.run(lambda tx: record(tx, c.config, notification, now, window))   # stamps it too
    return jsonify({"accepted": True, **summary}), 202
