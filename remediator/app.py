"""Flask application factory: blueprints `webhook`, `api`, `status`.

The webhook only validates and records (one short SQLite transaction) and answers 2xx; the
authority thread does the work. Every reader (API, /metrics, status page) reads SQLite, so all
gunicorn workers agree.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, render_template, request
from llm_health.remediator import fleet, policy
from llm_health.remediator.agent import AgentListener, FleetAgent
from llm_health.remediator.alert import PayloadError, parse_notification
from llm_health.remediator.authority import VERIFY, WARMUP, Authority, Verifier, WarmupCheck, state_path
from llm_health.remediator.incident import ingest
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.marker import file_markers
from llm_health.remediator.runbooks import runbooks
from llm_health.remediator.store import CLOSED, NEEDS_ACK, OBSERVED, Store
from werkzeug.exceptions import HTTPException

from llm_health.config import Config, ConfigError

MAX_TTL = 7 * 24 * 3600.0


class Ctx:
    """What the request handlers need; kept in app.extensions['remediator']."""

    def __init__(self, config: Config, store: Store, token: str, clock: Callable[[], float],
                 authority: Authority | None, agent: AgentListener | None = None) -> None:
        self.config = config
        self.store = store
        self.token = token
        self.clock = clock
        self.authority = authority
        self.agent = agent


def ctx() -> Ctx:
    return current_app.extensions["remediator"]


def _error(status: int, message: str) -> tuple[Response, int]:
    return jsonify({"error": message}), status


def _authorized() -> bool:
    token = ctx().token
    if not token:
        return True
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _json_body() -> Any:
    limit = ctx().config.remediator.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _BodyError(413, f"body too large: {request.content_length} bytes > {limit}")
    raw = request.get_data(cache=False)  # MAX_CONTENT_LENGTH makes this raise 413 on a chunked body
    if len(raw) > limit:
        raise _BodyError(413, f"body too large: more than {limit} bytes")
    if not raw.strip():
        raise _BodyError(400, "empty body: expected JSON")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _BodyError(400, f"body is not valid JSON: {exc}") from None


class _BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- webhook ---------------------------------------------------------------------------------------
webhook = Blueprint("webhook", __name__)


@webhook.post("/webhook")
def receive() -> Any:
    if not _authorized():
        return _error(401, "missing or wrong bearer token")
    try:
        notification = parse_notification(_json_body())
    except _BodyError as exc:
        return _error(exc.status, exc.message)
    except PayloadError as exc:
        return _error(400, f"not an Alertmanager webhook payload: {exc}")
    c = ctx()
    summary = ingest(c.store, c.config, notification, c.clock(), c.config.remediator.dedup_window)
    return jsonify({"accepted": True, **summary}), 202


# -- api -------------------------------------------------------------------------------------------
api = Blueprint("api", __name__, url_prefix="/api")


@api.before_request
def _api_auth() -> Any:
    if request.method not in ("GET", "HEAD") and not _authorized():
        return _error(401, "missing or wrong bearer token")
    return None


def backends_view() -> list[dict[str, Any]]:
    c = ctx()
    conn = c.store.conn()
    now = c.clock()
    r = c.config.remediator
    out = []
    busy_dir = c.config.resolve_path(r.busy_dir) if r.busy_dir else None
    lifecycles = fleet.all_rows(conn)
    for b in c.config.backends:
        inc = Store.active_incident(conn, b.name)
        last = conn.execute("SELECT kind, reason, at FROM events WHERE backend = ? AND kind NOT IN "
                            "('received') ORDER BY id DESC LIMIT 1", (b.name,)).fetchone()
        restarts = conn.execute("SELECT coalesce(result, 'running') AS result, count(*) AS n FROM actions "
                                "WHERE backend = ? AND coalesce(result, '') != 'dry_run' GROUP BY 1",
                                (b.name,)).fetchall()
        times = Store.restart_times(conn, b.name, include_dry_run=r.dry_run)
        allowed = policy.next_allowed(times, now, r.backoff)
        markers = list(Store.api_markers(conn, b.name))
        if busy_dir is not None:
            markers += file_markers(busy_dir, b.name, r.busy_file_ttl)
        out.append({
            "backend": b.name,
            "url": b.url,
            "host": b.host,
            "lifecycle": fleet.view(lifecycles.get(b.name)),
            "restart_configured": bool(b.restart),
            "incident": dict(inc) if inc else None,
            "last_decision": dict(last) if last else None,
            "restarts": {row["result"]: row["n"] for row in restarts},
            "next_allowed_restart": allowed,
            "markers": [{"id": m.id, "owner": m.owner, "expires_at": m.expires_at} for m in markers
                        if m.valid(now)],
        })
    return out


@api.get("/backends")
def get_backends() -> Any:
    br = Store.breaker(ctx().store.conn())
    return jsonify({"backends": backends_view(), "breaker": dict(br), "dry_run": ctx().config.remediator.dry_run})


@api.get("/events")
def get_events() -> Any:
    try:
        limit = min(max(int(request.args.get("limit", "100")), 1), 10000)
    except ValueError:
        return _error(400, "limit must be a whole number")
    events = ctx().store.events(backend=request.args.get("backend", ""), limit=limit,
                                kind=request.args.get("kind", ""))
    return jsonify({"events": events})


def _ttl(data: dict[str, Any]) -> float | tuple[Response, int]:
    ttl = data.get("ttl_seconds", 3600)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL:
        return _error(400, f"ttl_seconds must be a number in (0, {MAX_TTL:g}]")
    return float(ttl)


@api.post("/busy")
def post_busy() -> Any:
    try:
        data = _json_body()
    except _BodyError as exc:
        return _error(exc.status, exc.message)
    if not isinstance(data, dict):
        return _error(400, "expected a JSON object {backend, owner, ttl_seconds}")
    c = ctx()
    backend, owner = data.get("backend"), data.get("owner", "")
    if not isinstance(backend, str) or c.config.backend(backend) is None:
        return _error(404, f"unknown backend {str(backend)[:80]!r}")
    if not isinstance(owner, str) or not owner.strip() or len(owner) > 200:
        return _error(400, "owner must be a non-empty string (at most 200 characters)")
    ttl = _ttl(data)
    if isinstance(ttl, tuple):
        return ttl
    now = c.clock()
    marker_id = secrets.token_hex(8)
    with c.store.tx() as conn:
        conn.execute("INSERT INTO markers (id, backend, owner, created_at, expires_at) VALUES (?,?,?,?,?)",
                     (marker_id, backend, owner, now, now + ttl))
        Store.event(conn, now, "marker_set", backend, reason=f"busy marker {marker_id} by {owner!r} for {ttl:g}s",
                    marker_id=marker_id, expires_at=now + ttl)
    return jsonify({"id": marker_id, "backend": backend, "owner": owner, "expires_at": now + ttl}), 201


@api.put("/busy/<marker_id>")
def refresh_busy(marker_id: str) -> Any:
    try:
        data = _json_body()
    except _BodyError as exc:
        return _error(exc.status, exc.message)
    if not isinstance(data, dict):
        return _error(400, "expected a JSON object {ttl_seconds}")
    ttl = _ttl(data)
    if isinstance(ttl, tuple):
        return ttl
    c = ctx()
    now = c.clock()
    with c.store.tx() as conn:
        n = conn.execute("UPDATE markers SET expires_at = ? WHERE id = ? AND expires_at > ?",
                         (now + ttl, marker_id, now)).rowcount
    if not n:
        return _error(404, f"no valid marker {marker_id[:40]!r} (expired or removed)")
    return jsonify({"id": marker_id, "expires_at": now + ttl})


@api.delete("/busy/<marker_id>")
def delete_busy(marker_id: str) -> Any:
    c = ctx()
    now = c.clock()
    with c.store.tx() as conn:
        row = conn.execute("SELECT * FROM markers WHERE id = ?", (marker_id,)).fetchone()
        if row is None:
            return _error(404, f"no marker {marker_id[:40]!r}")
        conn.execute("DELETE FROM markers WHERE id = ?", (marker_id,))
        Store.event(conn, now, "marker_removed", row["backend"], reason=f"busy marker {marker_id} removed",
                    marker_id=marker_id, owner=row["owner"])
    return jsonify({"id": marker_id, "removed": True})


@api.post("/breaker/reset")
def reset_breaker() -> Any:
    c = ctx()
    now = c.clock()
    with c.store.tx() as conn:
        was = bool(Store.breaker(conn)["open"])
        conn.execute("UPDATE breaker SET open = 0, reset_at = ?, reason = '' WHERE id = 1", (now,))
        Store.event(conn, now, "breaker_reset", reason="fleet circuit breaker reset through the API "
                    f"(was {'open' if was else 'closed'}); earlier restarts no longer count toward it")
    return jsonify({"breaker_open": False, "was_open": was})


@api.post("/backends/<name>/ack")
def ack(name: str) -> Any:
    c = ctx()
    if c.config.backend(name) is None:
        return _error(404, f"unknown backend {name[:80]!r}")
    now = c.clock()
    with c.store.tx() as conn:
        inc = Store.active_incident(conn, name)
        if inc is None or inc["state"] not in (NEEDS_ACK, OBSERVED):
            state = inc["state"] if inc else "none"
            return _error(409, f"nothing to acknowledge for {name}: active incident state is {state}")
        Store.set_state(conn, int(inc["id"]), now, CLOSED, close_reason="acknowledged")
        Store.event(conn, now, "acknowledged", name, int(inc["id"]),
                    reason=f"incident {inc['id']} ({inc['state']}) acknowledged through the API; closed")
    return jsonify({"backend": name, "incident": int(inc["id"]), "closed": True})


# -- status, metrics, health ------------------------------------------------------------------------
status = Blueprint("status", __name__, template_folder="templates")


def _labels(**kv: str) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kv.items()) + "}" if kv else ""


@status.get("/metrics")
def metrics() -> Any:
    store = ctx().store
    conn = store.conn()
    lines = [
        "# HELP llm_health_remediator_alerts_received_total Alerts received in webhook notifications.",
        "# TYPE llm_health_remediator_alerts_received_total counter",
    ]
    received = store.counters("alerts_received")
    for st in ("firing", "resolved"):
        lines.append(f"llm_health_remediator_alerts_received_total{_labels(status=st)} {received.get(st, 0)}")
    lines += ["# HELP llm_health_remediator_decisions_total Decisions recorded in the audit log, by kind.",
              "# TYPE llm_health_remediator_decisions_total counter"]
    for kind, n in sorted(store.counters("decisions").items()):
        lines.append(f"llm_health_remediator_decisions_total{_labels(decision=kind)} {n}")
    lines += ["# HELP llm_health_remediator_restarts_total Restart actions, by backend and result.",
              "# TYPE llm_health_remediator_restarts_total counter"]
    rows = conn.execute("SELECT backend, coalesce(result, 'running') AS result, count(*) AS n FROM actions "
                        "WHERE coalesce(result, '') != 'dry_run' GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    for r in rows:
        lines.append(f"llm_health_remediator_restarts_total{_labels(backend=r['backend'], result=r['result'])} "
                     f"{r['n']}")
    lines += ["# HELP llm_health_remediator_breaker_open 1 while the fleet circuit breaker is open.",
              "# TYPE llm_health_remediator_breaker_open gauge",
              f"llm_health_remediator_breaker_open {int(Store.breaker(conn)['open'])}"]
    lines += lifecycle_metrics(conn)
    return Response("\n".join(lines) + "\n", mimetype="text/plain; version=0.0.4")


def lifecycle_metrics(conn: Any) -> list[str]:
    config = ctx().config
    rows = fleet.all_rows(conn)
    lines = ["# HELP llm_health_remediator_lifecycle_state 1 for the lifecycle state each backend is in, 0 for "
             "the others.",
             "# TYPE llm_health_remediator_lifecycle_state gauge"]
    since = ["# HELP llm_health_remediator_lifecycle_since_seconds Unix time of the backend's last lifecycle "
             "transition (0 = not looked at yet).",
             "# TYPE llm_health_remediator_lifecycle_since_seconds gauge"]
    for b in config.backends:
        r = rows.get(b.name)
        current = r["state"] if r else fleet.UNSEEN.value
        for st in LifecycleState:
            lines.append(f"llm_health_remediator_lifecycle_state{_labels(backend=b.name, state=st.value)} "
                         f"{int(st.value == current)}")
        since.append(f"llm_health_remediator_lifecycle_since_seconds{_labels(backend=b.name)} "
                     f"{float(r['since']) if r else 0.0:.3f}")
    lines += since
    lines += ["# HELP llm_health_remediator_escalations_total Restarts that need a person (warm-up timeout, "
              "action timeout, never ready).",
              "# TYPE llm_health_remediator_escalations_total counter"]
    store = ctx().store
    esc = store.counters("escalations")
    for b in config.backends:
        lines.append(f"llm_health_remediator_escalations_total{_labels(backend=b.name)} {esc.get(b.name, 0)}")
    lines += ["# HELP llm_health_remediator_silences_total Alertmanager silences around restarts, by result.",
              "# TYPE llm_health_remediator_silences_total counter"]
    sil = store.counters("silences")
    for result in ("created", "create_failed", "expired", "expire_failed"):
        lines.append(f"llm_health_remediator_silences_total{_labels(result=result)} {sil.get(result, 0)}")
    lines += ["# HELP llm_health_remediator_probes_total Generation requests the remediator sent (idle probes of "
              "its verifications, one-token warm-up requests), by backend and purpose.",
              "# TYPE llm_health_remediator_probes_total counter"]
    probes = {tuple(k.split("\t", 1)): v for k, v in store.counters("probes").items() if "\t" in k}
    keys = {(b.name, purpose) for b in config.backends for purpose in (VERIFY, WARMUP)} | set(probes)
    for name, purpose in sorted(keys):
        lines.append(f"llm_health_remediator_probes_total{_labels(backend=name, purpose=purpose)} "
                     f"{probes.get((name, purpose), 0)}")
    return lines


@status.get("/healthz")
def healthz() -> Any:
    ctx().store.conn().execute("SELECT 1").fetchone()
    return jsonify({"ok": True})


@status.get("/")
def page() -> Any:
    c = ctx()
    events = c.store.events(limit=50)
    br = dict(Store.breaker(c.store.conn()))
    return render_template("status.html", backends=backends_view(), events=events, breaker=br,
                           dry_run=c.config.remediator.dry_run, now=c.clock(), fmt=_fmt_time)


def _fmt_time(t: float | None) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(t))) + "Z"


# -- factory ---------------------------------------------------------------------------------------
def read_token(config: Config) -> str:
    r = config.remediator
    if not r.token_file:
        return ""
    path = config.resolve_path(r.token_file)
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"remediator.token_file: cannot read {path}: {exc.strerror}") from exc
    if not token:
        raise ConfigError(f"remediator.token_file: {path} is empty")
    return token


def create_app(
    config: Config,
    *,
    verifier: Verifier | None = None,
    warmup_check: WarmupCheck | None = None,
    clock: Callable[[], float] = time.time,
    start_authority: bool = True,
) -> Flask:
    token = read_token(config)
    store = Store(state_path(config))
    store.init()
    authority = None
    agent = None
    if start_authority:
        authority = Authority(store, config, verifier=verifier, warmup_check=warmup_check, clock=clock)
        authority.start()
        if config.remediator.agent_listen:
            agent = AgentListener(config.remediator.agent_listen, FleetAgent(store, config).status_for).start()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.remediator.max_body_bytes
    app.extensions["remediator"] = Ctx(config, store, token, clock, authority, agent)
    app.register_blueprint(webhook)
    app.register_blueprint(api)
    app.register_blueprint(status)
    app.register_blueprint(runbooks)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        return _error(exc.code or 500, exc.description or exc.name)

    return app
