"""For people and for Prometheus: the status page (GET /), /metrics (a collector over the store, so every
worker answers the same; OpenMetrics or text, gzip when asked) and /healthz (this worker can do its job
now; health.py)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, render_template, request

from llm_health import groups
from llm_health.exposition import metrics_answer
from llm_health.redact import redact
from llm_health.remediator import lease
from llm_health.remediator.clock import wall_text
from llm_health.remediator.web.context import ctx
from llm_health.remediator.web.rollouts import rollout_view
from llm_health.remediator.web.views import backends_view, public_event

status = Blueprint("status", __name__)


@status.get("/metrics")
def metrics_page() -> Any:
    """OpenMetrics or text, gzip or not, as the scraper asks (llm_health/exposition.py); HEAD: Flask."""
    answer = metrics_answer(ctx().registry, request.headers.get("Accept"), request.headers.get("Accept-Encoding"))
    response = Response(answer.body, content_type=answer.content_type)
    for name, value in answer.headers:
        response.headers[name] = value
    return response


@status.get("/healthz")
def healthz() -> Any:
    report = ctx().health.report()
    return jsonify(report), 200 if report["ok"] else 503


@status.get("/")
def page() -> Any:
    c = ctx()
    authed = c.authenticated()
    events = [public_event(e, authed) for e in c.store.events(limit=50)]
    br = redact(c.store.breaker().as_dict())
    with c.store.reader() as rd:
        latest = rd.rollouts(limit=1)
        rollout = rollout_view(rd, latest[0]) if latest else None
    return render_template("status.html", backends=backends_view(c), events=events, breaker=br, rollout=rollout,
                           authority=lease.shown(c.store),
                           dry_run=c.config.remediator.dry_run, now=c.clock(), fmt=wall_text,
                           group=groups.shown(c.config.remediator.group_labels))
