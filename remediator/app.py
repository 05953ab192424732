"""Flask application factory: blueprints `webhook`, `api`, `status`.

The webhook only validates and records (one short SQLite transaction) and answers 2xx; the
authority thread does the work. Every reader (API, /metrics, status page) reads SQLite, so all
gunicorn workers agree.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from flask import Blueprint, Flask, Response, current_app, jsonify, render_template, request
from llm_health.remediator import discovered, fleet, metrics, policy
from llm_health.remediator.agent import AgentListener, FleetAgent
from llm_health.remediator.alert import PayloadError, parse_notification
from llm_health.remediator.authority import Authority, Verifier, WarmupCheck, state_path
from llm_health.remediator.clock import Clocks, injected
from llm_health.remediator.health import Health
from llm_health.remediator.incident import ingest
from llm_health.remediator.marker import file_markers
from llm_health.remediator.retention import Pruner
from llm_health.remediator.runbooks import runbooks
from llm_health.remediator.store import CLOSED, NEEDS_ACK, OBSERVED, StateError, Store
from werkzeug.exceptions import HTTPException

from llm_health.config import Config, ConfigError
from llm_health.discovery import Discovery, status_document
from llm_health.discovery.collector import DiscoveryCollector
from llm_health.redact import redact

log = logging.getLogger(__name__)
MAX_JSON_DEPTH = 32
MUTATING = ("POST", "PUT", "PATCH", "DELETE")
HIDDEN_OUTPUT = "[hidden: send the bearer token to see action output]"


class Ctx:
    """What the request handlers need; kept in app.extensions['remediator']."""

    def __init__(self, config: Config, store: Store, token: str, clock: Callable[[], float],
                 authority: Authority | None, agent: AgentListener | None = None,
                 discovery: Discovery | None = None) -> None:
        self.config = config
        self.discovery = discovery
        self.store = store
        self.token = token
        self.clock = clock
        self.authority = authority
        self.agent = agent
        self.health = Health(config, store, authority)
        self.registry = metrics.registry_for(config, store, self.health.report)
        if discovery is not None:
            self.registry.register(DiscoveryCollector(discovery.status))


def ctx() -> Ctx:
    return current_app.extensions["remediator"]


def _error(status: int, message: str) -> tuple[Response, int]:
    return jsonify({"error": message}), status


def _token_given() -> bool:
    token = ctx().token
    if not token:
        return False
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _authorized() -> bool:
    return not ctx().token or _token_given()


def _loopback_host(host: str) -> bool:
    if host in ("localhost", "localhost.") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_of(value: str) -> str:
    return (urlparse(f"//{value}").hostname or "") if value else ""


def _cross_site_problem() -> str:
    """Why this mutating request looks like it came from a web page of another site ('' = fine).

    Browsers send Origin (and Sec-Fetch-Site) on cross-origin POST/PUT/DELETE; Alertmanager, curl and
    our own clients send neither. Without a token (insecure_no_auth, loopback only) the Host header
    must name a loopback address too, against DNS rebinding."""
    origin = request.headers.get("Origin", "")
    if request.headers.get("Sec-Fetch-Site", "") in ("cross-site", "same-site"):
        return f"cross-site request refused (Sec-Fetch-Site {request.headers['Sec-Fetch-Site']})"
    if origin:
        parsed = urlparse(origin)
        if origin == "null" or parsed.netloc.lower() != request.host.lower():
            return f"cross-origin request refused (Origin {origin[:100]!r}, Host {request.host[:100]!r})"
    if not ctx().token and not _loopback_host(_host_of(request.host)):
        return f"Host {request.host[:100]!r} is not a loopback name: refused without a token (DNS rebinding)"
    return ""


def _guard_mutation() -> tuple[Response, int] | None:
    """For every mutating request: token, no cross-site origin, JSON bodies only."""
    if not _authorized():
        return _error(401, "missing or wrong bearer token")
    problem = _cross_site_problem()
    if problem:
        return _error(403, problem)
    limit = ctx().config.remediator.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        return _error(413, f"body too large: {request.content_length} bytes > {limit}")
    has_body = bool(request.content_length) or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    if (request.content_type or has_body) and request.mimetype != "application/json":
        return _error(415, f"Content-Type must be application/json, got {request.content_type[:80]!r}"
                      if request.content_type else "Content-Type must be application/json")
    return None


def _depth_ok(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def _json_body() -> Any:
    limit = ctx().config.remediator.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _BodyError(413, f"body too large: {request.content_length} bytes > {limit}")
    if request.mimetype != "application/json":
        raise _BodyError(415, "Content-Type must be application/json")
    raw = _read_body(limit)
    if len(raw) > limit:
        raise _BodyError(413, f"body too large: more than {limit} bytes")
    if not raw.strip():
        raise _BodyError(400, "empty body: expected JSON")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise _BodyError(400, f"body is nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _BodyError(400, f"body is not valid JSON: {str(exc)[:200]}") from None
    if not _depth_ok(data):
        raise _BodyError(400, f"body is nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _BodyError(400, "body contains a lone surrogate (\\ud800-\\udfff escape): not valid Unicode") from None
    return data


def _read_body(limit: int) -> bytes:
    """The body, or its first limit + 1 bytes when it is longer (so the caller can tell).

    A chunked body (no Content-Length) is read from the server's terminated input stream
    (`wsgi.input_terminated`): werkzeug's own stream stops at MAX_CONTENT_LENGTH and returns
    what it has, so a 2 MB body of spaces read as `limit` spaces ("empty body" instead of 413)."""
    if request.content_length is not None or not request.environ.get("wsgi.input_terminated"):
        return request.get_data(cache=False)
    stream = request.environ["wsgi.input"]
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        part = stream.read(limit + 1 - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def public_event(event: dict[str, Any], authenticated: bool) -> dict[str, Any]:
    out = redact(event)
    detail = out.get("detail")
    if not authenticated and isinstance(detail, dict) and "output" in detail:
        out["detail"] = {**detail, "output": HIDDEN_OUTPUT}
    return out


class _BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- webhook ---------------------------------------------------------------------------------------
webhook = Blueprint("webhook", __name__)


@webhook.post("/webhook")
def receive() -> Any:
    refused = _guard_mutation()
    if refused is not None:
        return refused
    try:
        notification = parse_notification(_json_body())
    except _BodyError as exc:
        return _error(exc.status, exc.message)
    except PayloadError as exc:
        return _error(400, f"not an Alertmanager webhook payload: {exc}")
    c = ctx()
    # never a Prometheus query here: an alert about a backend this worker's discovery has not seen yet
    # opens its incident, and the authority looks it up after a (rate-limited) refresh (incident.py)
    summary = ingest(c.store, c.config, notification, c.clock(), c.config.remediator.dedup_window)
    return jsonify({"accepted": True, **summary}), 202


# -- api -------------------------------------------------------------------------------------------
api = Blueprint("api", __name__, url_prefix="/api")


@api.before_request
def _api_auth() -> Any:
    if request.method in MUTATING:
        return _guard_mutation()
    return None


# Incident and lifecycle columns that hold monotonic deadlines (remediator/clock.py): shown as wall time.
MONOTONIC_INCIDENT_FIELDS = ("next_check_at", "warm_deadline", "unresponsive_since")


def _shown(clocks: Clocks, row: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """A row for people: its monotonic instants converted to wall time (None stays None)."""
    return {k: (clocks.wall_of(float(v)) if k in fields and v is not None else v) for k, v in row.items()}


def backends_view() -> list[dict[str, Any]]:
    c = ctx()
    clocks = injected(c.clock)
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
        times = Store.restart_times(conn, b.name, include_dry_run=r.dry_run, now=now, mono=clocks.mono(),
                                    boot=clocks.boot)
        allowed = policy.next_allowed(times, now, r.backoff)
        markers = list(Store.api_markers(conn, b.name))
        if busy_dir is not None:
            markers += file_markers(busy_dir, b.name, r.busy_file_ttl, r.marker_max_ttl, now=now)
        out.append({
            "backend": b.name,
            "url": redact(b.url),
            "host": b.host,
            "lifecycle": _shown(clocks, fleet.view(lifecycles.get(b.name)), ("drain_deadline",)),
            "restart_configured": bool(b.restart),
            "incident": _shown(clocks, dict(inc), MONOTONIC_INCIDENT_FIELDS) if inc else None,
            "last_decision": redact(dict(last)) if last else None,
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
    """Newest first, at most retention.page_size per answer; the next page: ?before=<next_before>."""
    page_size = ctx().config.remediator.retention.page_size
    try:
        limit = min(max(int(request.args.get("limit", "100")), 1), page_size)
        before = int(request.args["before"]) if request.args.get("before") else None
    except ValueError:
        return _error(400, "limit and before must be whole numbers")
    events = ctx().store.events(backend=request.args.get("backend", ""), limit=limit,
                                kind=request.args.get("kind", ""), before=before)
    authed = _token_given()
    return jsonify({"events": [public_event(e, authed) for e in events], "page_size": page_size,
                    "next_before": events[-1]["id"] if len(events) == limit else None})


def _ttl(data: dict[str, Any]) -> float | tuple[Response, int]:
    cap = ctx().config.remediator.marker_max_ttl
    ttl = data.get("ttl_seconds", min(3600.0, cap))
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= cap:
        return _error(400, f"ttl_seconds must be a number in (0, {cap:g}] (remediator.marker_max_ttl)")
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
        conn.execute("UPDATE breaker SET open = 0, reset_at = ?, reason = '', reset_after_action = "
                     "(SELECT coalesce(max(id), 0) FROM actions) WHERE id = 1", (now,))
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


@api.get("/discovery")
def discovery_view() -> Any:
    """Backends from Prometheus' targets: freshness, errors, refused targets and contested names (enabled
    false when off). Each gunicorn worker refreshes on its own: `worker` is the answering one's pid."""
    d = ctx().discovery
    return jsonify({**status_document(d.status()), "worker": os.getpid()} if d is not None else {"enabled": False})


# -- status, metrics, health ------------------------------------------------------------------------
status = Blueprint("status", __name__, template_folder="templates")


@status.get("/metrics")
def metrics_page() -> Any:
    return Response(metrics.render(ctx().registry), mimetype=metrics.CONTENT_TYPE.split(";")[0],
                    content_type=metrics.CONTENT_TYPE)


@status.get("/healthz")
def healthz() -> Any:
    report = ctx().health.report()
    return jsonify(report), 200 if report["ok"] else 503


@status.get("/")
def page() -> Any:
    c = ctx()
    authed = _token_given()
    events = [public_event(e, authed) for e in c.store.events(limit=50)]
    br = redact(dict(Store.breaker(c.store.conn())))
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


def token_file_warning(config: Config) -> str:
    """A warning when the token file can be read by anyone (others) or written by its group."""
    r = config.remediator
    if not r.token_file:
        return ""
    path = config.resolve_path(r.token_file)
    try:
        mode = path.stat().st_mode
    except OSError:
        return ""
    if mode & (stat.S_IRWXO | stat.S_IWGRP):
        return (f"WARNING: remediator.token_file {path} is readable or writable by other users (mode {stat.filemode(mode)}); "
                f"anyone who can read it can restart backends. Fix: chmod 600 {path}")
    return ""


def listen_host(listen: str) -> str:
    return listen.rpartition(":")[0].strip("[]")


def check_exposure(config: Config, token: str) -> None:
    """Safe by default: no webhook or mutating API without a token, unless explicitly told
    (remediator.insecure_no_auth / --insecure-no-auth) AND listening on loopback only."""
    r = config.remediator
    if token:
        return
    if not r.insecure_no_auth:
        raise ConfigError("remediator.token_file is not set: refusing to serve the webhook and the mutating API "
                          "without a bearer token. Set token_file (e.g. `openssl rand -hex 32 > token; chmod 600 "
                          "token`), or for a local trial pass --insecure-no-auth with a loopback --listen")
    host = listen_host(r.listen)
    if not _loopback_host(host):
        raise ConfigError(f"remediator.insecure_no_auth: only allowed with a loopback listen address, got "
                          f"{r.listen!r}; set token_file to listen on {host}")


def create_app(
    config: Config,
    *,
    verifier: Verifier | None = None,
    warmup_check: WarmupCheck | None = None,
    clock: Callable[[], float] = time.time,
    start_authority: bool = True,
    expect_state: tuple[int, int] | None = None,
) -> Flask:
    """`expect_state`: (device, inode) of the state file the server opened before forking workers; a
    worker then only opens that very file (never creates one) and refuses any other."""
    token = read_token(config)
    check_exposure(config, token)
    store = Store(state_path(config), expect=expect_state)
    if expect_state is None:
        store.init()
    else:
        store.conn()   # the file the server's master created and checked, never a new one
    config, discovery = discovered.attach(config, store, clock)   # backends: static + discovered (if on)
    authority = None
    agent = None
    if start_authority:
        authority = Authority(store, config, verifier=verifier, warmup_check=warmup_check, clock=clock)
        authority.start()
        Pruner(store, config, clock).start()
        if config.remediator.agent_listen:
            agent = AgentListener(config.remediator.agent_listen, FleetAgent(store, config).status_for).start()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.remediator.max_body_bytes
    app.extensions["remediator"] = Ctx(config, store, token, clock, authority, agent, discovery)
    app.register_blueprint(webhook)
    app.register_blueprint(api)
    app.register_blueprint(status)
    app.register_blueprint(runbooks)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        return _error(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(StateError)
    def state_error(exc: StateError) -> Any:
        log.error("%s", exc)
        return _error(503, str(exc))

    return app
