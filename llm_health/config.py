"""One YAML file shared by the exporter and the remediator.

```yaml
backends:
  - name: gpu-a                      # [A-Za-z0-9_.-]{1,64}, no leading dot, unique
    url: http://10.0.0.5:8000        # the vLLM server itself, never a proxy
    host: node-1                     # optional: backends on one host restart one at a time
    model: my-model                  # optional: the model /v1/models must list (warm-up gate)
    restart: ["systemctl", "restart", "vllm@gpu-a"]   # argv, run without a shell
    labels: {namespace: llm}         # optional group labels its alerts must carry (llm_health/groups.py)
proxies:
  - name: lb
    url: http://10.0.0.9:8080        # checked through GET /v1/models only
exporter: {...}                      # see ExporterSettings
remediator: {...}                    # see RemediatorSettings
```

Bad input raises ConfigError with a message that names the offending key; nothing is half-loaded.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse, urlsplit

import yaml

from llm_health import groups

if TYPE_CHECKING:
    from llm_health.discovery import Discovery

#: backend and proxy names; also the marker file names (`<busy_dir>/<name>` or `<name>@<tag>`, see remediator/marker.py): no
#: leading dot (hidden files are never markers), at most 64 characters.
NAME_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")


class ConfigError(ValueError):
    """The configuration is invalid; the message says where."""


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    host: str = ""
    model: str = ""
    restart: tuple[str, ...] = ()
    labels: groups.Labels = ()          # group labels (cluster, namespace, ...) an alert about it must carry
    diagnostics: tuple[str, ...] | None = None   # capture argv before a restart; None: remediator.diagnostics
    stop: tuple[str, ...] = ()          # instead of `restart`: stop, wait for `headroom`, start
    start: tuple[str, ...] = ()         # (remediator/sequence.py)
    headroom: tuple[str, ...] = ()      # exit 0 = room for a new server (e.g. the GPUs' memory is free)
    workload: str = ""                  # discovered: the ReplicaSet that replaces this pod under a new name

    @property
    def address(self) -> str:
        """host:port of the URL, as Prometheus' `instance` label shows it."""
        parsed = urlparse(self.url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        return f"{parsed.hostname}:{port}"


@dataclass(frozen=True)
class Proxy:
    name: str
    url: str


@dataclass(frozen=True)
class ExporterSettings:
    listen: str = "127.0.0.1:9410"
    interval: float = 15.0          # seconds between readings of one backend
    stall_after: float = 120.0      # no engine progress for this long (and 2 readings) = stalled, when the
                                    # engine's numbers say nothing of its steps (exporter/steptime.py)
    stall_floor: float = 30.0       # the least stall bound when they do (2 x its slowest step, at least this)
    stall_ceiling: float = 900.0    # the most that step-derived stall bound may be (exporter/steptime.py)
    down_after: int = 2             # consecutive failed readings before "down"
    read_timeout: float = 5.0       # per-backend /metrics timeout
    probe_timeout: float = 10.0     # the idle probe (max_tokens 1)
    probe_every: float = 0.0        # min seconds between probes of one backend; 0 = every interval
    probe_model: str = ""           # model for the probe; default: first id of /v1/models
    api_key_file: str = ""          # file whose stripped content is sent as `Authorization: Bearer` on /v1/*
    max_reads_per_endpoint: int = 16  # reads and /health checks one host:port may have in flight (per lane)


@dataclass(frozen=True)
class Backoff:
    initial: float = 300.0          # seconds after the first restart before another is allowed
    factor: float = 2.0
    cap: float = 3600.0
    stable_after: float = 7200.0    # a backend this long without restart starts again at `initial`


@dataclass(frozen=True)
class Budget:
    restarts: int = 3
    window: float = 3600.0


@dataclass(frozen=True)
class Breaker:
    restarts: int = 5
    window: float = 3600.0


@dataclass(frozen=True)
class Retention:
    max_age: float = 30 * 86400.0        # events, finished actions, closed incidents older than this are pruned
    max_events: int = 100_000            # ... and events beyond the newest this many
    max_actions: int = 10_000            # ... and finished actions beyond the newest this many
    interval: float = 300.0              # seconds between prunes
    page_size: int = 500                 # most events one GET /api/events answers (pages: ?before=ID)


@dataclass(frozen=True)
class RolloutSettings:
    """Rolling operations (remediator/rollout/): the gate's Prometheus and the defaults of a rollout; a rollout
    keeps the values it started with (`llm-health ctl rollout` flags or a plan override them)."""

    prometheus_url: str = ""             # the gate's Prometheus; empty = discovery.prometheus_url
    query_timeout: float = 10.0          # one gate query, whole
    soak: float = 600.0                  # seconds a canary is watched before the rest follow
    canary: int = 1                      # canaries (the first members; one per host)
    canary_weight: int = 25              # percent of its HAProxy weight a soaking canary gets
    member_timeout: float = 0.0          # a member's restart not over by then fails (0: drain + action + warm-up + 5 min)
    gate_interval: float = 30.0          # between two gate measurements during the soak
    ttft_p95_ratio: float = 1.5          # canary TTFT p95 at most this x the fleet's
    e2e_p95_ratio: float = 1.5           # canary end-to-end p95 at most this x the fleet's
    latency_slack: float = 0.05          # seconds: a canary within this of the fleet's p95 passes
    error_ratio_delta: float = 0.01      # canary error ratio at most the fleet's + this
    min_requests: int = 10               # user requests (besides our probes) the canary must serve during the soak
    max_query_errors: int = 4            # gate queries failing in a row that fail the gate
    max_inconclusive: int = 5            # gate measurements in a row without a verdict that fail the gate (x gate_interval
    #                                      should outlast the exporter's stall_after, so a stall is named as one)


@dataclass(frozen=True)
class RemediatorSettings:
    listen: str = "127.0.0.1:9411"
    state: str = "var/remediator.db"     # SQLite file, or postgresql://user@host:port/dbname (docs/ha.md)
    state_password_file: str = ""        # PostgreSQL: the password, read from this file (else PGPASSWORD/~/.pgpass)
    state_timeout: float = 10.0          # PostgreSQL: connect, pooled-connection wait, statement and lock wait
    local_dir: str = ""                  # action status files, diagnostics: '' = beside the SQLite file (PostgreSQL: var/)
    token_file: str = ""                 # bearer token for webhook and mutating API (required, see insecure_no_auth)
    insecure_no_auth: bool = False       # allow no token_file: only with `listen` on a loopback address
    busy_dir: str = ""                   # marker files: <busy_dir>/<backend>[@<tag>]
    busy_file_ttl: float = 3600.0        # marker file expiry = mtime + this (or the ttl written in it)
    marker_max_ttl: float = 86400.0      # cap for every busy marker (API ttl_seconds, file ttl, busy --ttl)
    dry_run: bool = False
    workers: int = 2                     # gunicorn workers
    threads: int = 16                    # threads per worker (gthread); a request gets one once it has arrived whole
    request_timeout: float = 10.0        # a request (head and body) must arrive whole within this of its first byte
    idle_timeout: float = 5.0            # a connection silent this long is closed (before a request, between keep-alive ones)
    max_header_bytes: int = 65536        # request line and headers; longer: 431
    max_body_bytes: int = 1_048_576      # longer (Content-Length or chunked): 413, never read
    max_pending_connections: int = 512   # per worker: incomplete requests at once; at this, it stops accepting
    max_pending_per_peer: int = 128      # per worker and client address: incomplete requests; more get 503
    action_timeout: float = 600.0
    dedup_window: float = 300.0          # HA copies/repeats of one notification inside this are duplicates
    verify_readings: int = 2             # fresh direct readings before acting: the counters still frozen with
    verify_interval: float = 5.0         # work, this far apart; the readings go on while the engine's own numbers
    #                                      say one step could explain the frozen span (exporter/check.py), so the
    #                                      window need not outlast a long step; the alert's evidence is not re-waited
    unresponsive_after: float = 120.0    # `unresponsive` (hung) for this long within one incident = restart-worthy
    warmup_timeout: float = 900.0
    warmup_poll: float = 5.0
    drain_timeout: float = 60.0
    stalled_drain_timeout: float = 5.0
    drain_min: float = 0.0               # a drained backend is held this long before its restart (Kubernetes: the
    #                                      endpoint update after the readiness sidecar's answer; capped by the deadline)
    min_ready: int = 0
    alertmanager_url: str = ""           # for silences during a restart (API v2)
    exporter_url: str = ""               # the exporter whose /verdicts a verification reuses (how long the counters
    #                                      stood still): "" = http://<exporter.listen> of this file, "none" = off
    agent_listen: str = ""               # HAProxy agent-check endpoint host:port, empty = off
    haproxy_socket: str = ""             # HAProxy stats socket: during a drain its scur must reach 0 too
    haproxy_proxy: str = "vllm"          # the HAProxy backend (proxy) whose servers are our backends
    poll_interval: float = 1.0           # how often the authority looks at each open incident
    max_concurrent_incidents: int = 16   # incidents worked on at once (worker threads: verify, drain, action)
    max_concurrent_restarts: int = 8     # restarts taking capacity at once (draining, restarting, warming) fleet-wide
    restart_slot_warmup: float = 60.0    # a warm-up holds its restart slot this long at most (not back by then: freed)
    health_stale_after: float = 300.0    # /healthz fails when the authority loop has not finished a pass this long
    # Diagnostics before a kill (remediator/diagnostics.py): argv run right before the restart of a backend
    # verified stalled or unresponsive, e.g. [llm-health, diagnose]; a backend's own `diagnostics` wins; empty = off
    diagnostics: tuple[str, ...] = ()
    diagnostics_timeout: float = 30.0    # the capture's whole time (then killed; what it wrote is kept)
    diagnostics_max_bytes: int = 65536   # output kept with the incident
    # Headroom before a start (backends with stop/start/headroom: remediator/sequence.py)
    headroom_wait: float = 120.0         # how long the headroom check may keep failing before ERROR (host needs attention)
    headroom_poll: float = 5.0           # between two headroom checks
    headroom_timeout: float = 10.0       # one headroom check
    backoff: Backoff = field(default_factory=Backoff)
    budget: Budget = field(default_factory=Budget)
    breaker: Breaker = field(default_factory=Breaker)
    retention: Retention = field(default_factory=Retention)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    group_labels: groups.Labels = ()     # the group this remediator serves, e.g. {cluster: eu-1}: a restart
    #                                      alert must carry these values (a mapping in the file)


@dataclass(frozen=True)
class DiscoverySettings:
    """Backends from Prometheus' targets (llm_health/discovery/); off while prometheus_url is empty.

    Two kinds of labels (docs/discovery.md): a target's `labels` (after relabelling: whoever may create a
    PodMonitor/ServiceMonitor or scrape config sets them freely) and its `discoveredLabels` (before
    relabelling: from the service discovery itself, e.g. `__meta_kubernetes_pod_name`). What a restart acts
    on, and the host, come only from discovered labels."""

    prometheus_url: str = ""             # e.g. http://127.0.0.1:9090; empty = discovery off
    selector: str = 'job="vllm"'         # matchers: label="v", !=, =~, !~; names starting with __ match discovered
    #                                      labels (and __scrape_pool__ the target's scrape pool)
    name_label: str = "backend"          # the target label that names the backend (the alerts carry it)
    name_from: str = ""                  # the discovered label the name must equal for a restart (required with restart)
    host_from: str = "__meta_kubernetes_pod_node_name"   # discovered label naming its host (one restart per host)
    model_label: str = ""                # the target label naming the model the warm-up waits for
    refresh: float = 30.0                # seconds between looks at Prometheus
    timeout: float = 10.0                # HTTP timeout of one look
    grace: float = 300.0                 # a backend missing from the answers this long is removed
    extra_refresh_every: float = 10.0    # a backend not in the fleet asks for a refresh: at most one extra per this long
    restart: tuple[str, ...] = ()        # argv with {placeholder}s; values must be DNS-1123 names
    placeholders: tuple[tuple[str, str], ...] = ()   # placeholder -> discovered label (a mapping in the file)
    allow_networks: tuple[str, ...] = ()  # CIDRs a backend's address must be in; empty = any address
    allow_ports: tuple[int, ...] = ()    # ports a backend may be at; empty = any port
    allow_link_local: bool = False       # accept 169.254.0.0/16 and fe80::/10 addresses (cloud metadata lives there)
    allow_userinfo: bool = False         # accept user:password@ in a target's URL
    group_labels: tuple[str, ...] = ()   # target labels that are a backend's group labels, e.g. [namespace]:
    #                                      an alert about it must carry the same values

    @property
    def enabled(self) -> bool:
        return bool(self.prometheus_url)

    @property
    def placeholder_labels(self) -> dict[str, str]:
        return dict(self.placeholders)


@dataclass(frozen=True)
class Config:
    # the static list as a tuple; with discovery on, a live view (static first, then discovered):
    # llm_health.discovery.LiveBackends. Read it by iterating; each iteration is one consistent list.
    backends: Sequence[Backend] = ()
    proxies: tuple[Proxy, ...] = ()
    exporter: ExporterSettings = field(default_factory=ExporterSettings)
    remediator: RemediatorSettings = field(default_factory=RemediatorSettings)
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    source: str = ""                     # the file it came from, for relative paths

    def live_discovery(self) -> Discovery | None:
        """The Discovery behind `backends` when service discovery feeds them (`LiveBackends`), else None."""
        return getattr(self.backends, "discovery", None)

    def backend(self, name: str) -> Backend | None:
        for b in self.backends:
            if b.name == name:
                return b
        return None

    def backend_for_instance(self, instance: str) -> Backend | None:
        """Match an alert's `instance` label (host:port or a URL) against the configured URLs; one that is
        no URL (a bad port, a broken IPv6 literal: any label an alert may carry) matches nothing."""
        wanted = instance.strip()
        if "://" in wanted:
            try:
                parsed = urlparse(wanted)
                wanted = f"{parsed.hostname}:{parsed.port or (443 if parsed.scheme == 'https' else 80)}"
            except ValueError:
                return None
        for b in self.backends:
            if b.address == wanted:
                return b
        return None

    def resolve_path(self, path: str) -> Path:
        """Relative paths in the file are relative to the file's folder."""
        p = Path(path)
        if p.is_absolute() or not self.source:
            return p
        return Path(self.source).parent / p


def local_url(listen: str) -> str:
    """The http URL at which this host reaches a server listening on `listen` (host:port): a wildcard host
    (all interfaces) is reached on 127.0.0.1, an IPv6 one in brackets; "" when it has no port."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit():
        return ""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def _check_url(url: Any, where: str) -> str:
    if not isinstance(url, str):
        raise ConfigError(f"{where}: url must be a string")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"{where}: url {url!r} must be http(s)://host[:port]")
    return url.rstrip("/")


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{where}: name {name!r} must match {NAME_RE.pattern}")
    return name


def _section(cls: type, data: Any, where: str) -> Any:
    """Build a settings dataclass from a mapping, refusing unknown keys and wrong types."""
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        default = getattr(defaults, key)
        sub = f"{where}.{key}"
        if hasattr(default, "__dataclass_fields__"):
            kwargs[key] = _section(type(default), value, sub)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{sub}: must be true or false")
            kwargs[key] = value
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{sub}: must be a whole number >= 0")
            kwargs[key] = value
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"{sub}: must be a number >= 0")
            kwargs[key] = float(value)
        elif isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
                raise ConfigError(f"{sub}: must be a list of non-empty strings (argv)")
            kwargs[key] = tuple(value)
        else:
            if not isinstance(value, str):
                raise ConfigError(f"{sub}: must be a string")
            kwargs[key] = value
    return cls(**kwargs)


def parse_config(data: Any, source: str = "") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("config: top level must be a mapping")
    unknown = sorted(set(data) - {"backends", "proxies", "exporter", "remediator", "discovery"})
    if unknown:
        raise ConfigError(f"config: unknown key(s) {', '.join(unknown)}")
    backends: list[Backend] = []
    for i, raw in enumerate(data.get("backends") or []):
        where = f"backends[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: must be a mapping")
        extra = sorted(set(raw) - {"name", "url", "host", "model", "restart", "labels", "diagnostics", "stop",
                                   "start", "headroom"})
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}")
        restart = raw.get("restart") or []
        if not isinstance(restart, list) or not all(isinstance(a, str) and a for a in restart):
            raise ConfigError(f"{where}.restart: must be a list of non-empty strings (argv)")
        steps = {key: raw.get(key) or [] for key in ("stop", "start", "headroom")}
        for key, argv in steps.items():
            if not isinstance(argv, list) or not all(isinstance(a, str) and a for a in argv):
                raise ConfigError(f"{where}.{key}: must be a list of non-empty strings (argv)")
        if steps["start"] and restart:
            raise ConfigError(f"{where}: restart, or start (with stop and headroom): not both")
        if steps["headroom"] and not (steps["start"] and steps["stop"]):
            raise ConfigError(f"{where}.headroom: needs stop and start (one restart argv cannot wait between them)")
        if steps["stop"] and not steps["start"]:
            raise ConfigError(f"{where}.stop: needs start")
        diagnostics = raw.get("diagnostics")
        if diagnostics is not None and (not isinstance(diagnostics, list)
                                        or not all(isinstance(a, str) and a for a in diagnostics)):
            raise ConfigError(f"{where}.diagnostics: must be a list of non-empty strings (argv; [] = none)")
        for key in ("host", "model"):
            if not isinstance(raw.get(key, ""), str):
                raise ConfigError(f"{where}.{key}: must be a string")
        backends.append(
            Backend(
                name=_check_name(raw.get("name"), where),
                url=_check_url(raw.get("url"), where),
                host=raw.get("host", "") or "",
                model=raw.get("model", "") or "",
                restart=tuple(restart),
                labels=_group_labels(raw.get("labels"), f"{where}.labels"),
                diagnostics=None if diagnostics is None else tuple(diagnostics),
                stop=tuple(steps["stop"]), start=tuple(steps["start"]), headroom=tuple(steps["headroom"]),
            )
        )
    proxies: list[Proxy] = []
    for i, raw in enumerate(data.get("proxies") or []):
        where = f"proxies[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: must be a mapping")
        extra = sorted(set(raw) - {"name", "url"})
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}")
        proxies.append(Proxy(name=_check_name(raw.get("name"), where), url=_check_url(raw.get("url"), where)))
    names = [b.name for b in backends] + [p.name for p in proxies]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"config: duplicate name(s) {', '.join(dupes)}")
    raw_remediator = data.get("remediator")
    scope: groups.Labels = ()
    if isinstance(raw_remediator, dict) and "group_labels" in raw_remediator:
        raw_remediator = dict(raw_remediator)
        scope = _group_labels(raw_remediator.pop("group_labels"), "remediator.group_labels")
    remediator = replace(_section(RemediatorSettings, raw_remediator, "remediator"), group_labels=scope)
    _check_remediator(remediator)
    return Config(
        backends=tuple(backends),
        proxies=tuple(proxies),
        exporter=_check_exporter(_section(ExporterSettings, data.get("exporter"), "exporter")),
        remediator=remediator,
        discovery=parse_discovery(data.get("discovery")),
        source=source,
    )


def _group_labels(raw: Any, where: str) -> groups.Labels:
    try:
        return groups.parse_labels(raw, where)
    except groups.GroupLabelError as exc:
        raise ConfigError(str(exc)) from None


def _check_exporter(e: ExporterSettings) -> ExporterSettings:
    if e.max_reads_per_endpoint < 1:
        raise ConfigError("exporter.max_reads_per_endpoint: must be at least 1")
    if e.stall_ceiling < e.stall_after:
        raise ConfigError(f"exporter.stall_ceiling: must be at least stall_after ({e.stall_after:g} s)")
    if e.stall_floor <= 0:
        raise ConfigError("exporter.stall_floor: must be > 0 seconds (it is at most stall_after in effect)")
    return e


def _check_remediator(r: RemediatorSettings) -> None:
    if r.exporter_url not in ("", "none"):
        _check_url(r.exporter_url, "remediator.exporter_url")
    if r.request_timeout <= 0 or r.idle_timeout <= 0:
        raise ConfigError("remediator.request_timeout and remediator.idle_timeout: must be > 0 seconds")
    if r.max_header_bytes < 1024 or r.max_body_bytes < 1:
        raise ConfigError("remediator.max_header_bytes: must be at least 1024; remediator.max_body_bytes at least 1")
    if not 1 <= r.max_pending_per_peer <= r.max_pending_connections:
        raise ConfigError(f"remediator.max_pending_per_peer: must be in [1, max_pending_connections="
                          f"{r.max_pending_connections}]")
    if r.marker_max_ttl <= 0:
        raise ConfigError("remediator.marker_max_ttl: must be > 0 seconds")
    if r.state_timeout <= 0:
        raise ConfigError("remediator.state_timeout: must be > 0 seconds")
    if is_database_url(r.state):
        _check_database_url(r.state)
    elif r.state_password_file:
        raise ConfigError("remediator.state_password_file: only for a PostgreSQL state (remediator.state: "
                          "postgresql://...); the SQLite file has no password")
    if not 0 < r.busy_file_ttl <= r.marker_max_ttl:
        raise ConfigError(f"remediator.busy_file_ttl: must be in (0, marker_max_ttl={r.marker_max_ttl:g}]")
    if r.retention.page_size < 1 or r.retention.max_events < 1 or r.retention.max_actions < 1:
        raise ConfigError("remediator.retention: page_size, max_events and max_actions must be at least 1")
    if r.retention.max_age < 3600 or r.retention.interval <= 0:
        raise ConfigError("remediator.retention: max_age must be at least 3600 seconds, interval > 0")
    ro = r.rollout
    if ro.prometheus_url:
        _check_url(ro.prometheus_url, "remediator.rollout.prometheus_url")
    if ro.query_timeout <= 0 or ro.soak <= 0 or ro.gate_interval <= 0:
        raise ConfigError("remediator.rollout: query_timeout, soak and gate_interval must be > 0 seconds")
    if not 1 <= ro.canary_weight <= 100:
        raise ConfigError("remediator.rollout.canary_weight: must be a percentage in [1, 100]")


def is_database_url(state: str) -> bool:
    """remediator.state names a PostgreSQL database (else: a SQLite file)."""
    return state.startswith(("postgresql://", "postgres://"))


def _check_database_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ConfigError(f"remediator.state: not a usable PostgreSQL URL: {exc}") from exc
    if parts.password is not None or "password=" in parts.query:
        raise ConfigError("remediator.state: the PostgreSQL URL carries a password; put it in "
                          "remediator.state_password_file, PGPASSWORD or ~/.pgpass instead (a URL is logged and "
                          "shown, a password never is)")
    if not parts.path.strip("/"):
        raise ConfigError("remediator.state: name the database in the URL (postgresql://user@host:port/dbname)")


#: settings of older versions that are refused with a message saying what to write instead
_REMOVED_DISCOVERY_KEYS = {
    "host_label": "it read a target label, which any relabelling (a PodMonitor or ServiceMonitor in a watched "
                  "namespace) sets freely, so a target could claim another host's restart mutex. Name the "
                  "discovered label instead: host_from: __meta_kubernetes_pod_node_name (Kubernetes, the "
                  "default) or host_from: node (file_sd: the labels written in the file are discovered labels)",
}
_DISCOVERY_LISTS = ("restart", "placeholders", "allow_networks", "allow_ports", "group_labels")


def parse_discovery(data: Any) -> DiscoverySettings:
    """The `discovery:` section; the selector, the restart template and the allow-lists are checked here,
    at load time (`check_discovery`)."""
    if data is None:
        return DiscoverySettings()
    if not isinstance(data, dict):
        raise ConfigError("discovery: must be a mapping")
    for key, why in _REMOVED_DISCOVERY_KEYS.items():
        if key in data:
            raise ConfigError(f"discovery.{key}: no longer supported: {why}")
    settings = _section(DiscoverySettings, {k: v for k, v in data.items() if k not in _DISCOVERY_LISTS},
                        "discovery")
    restart = data.get("restart") or []
    if not isinstance(restart, list):
        raise ConfigError("discovery.restart: must be a list of non-empty strings (argv)")
    placeholders = data.get("placeholders") or {}
    if not isinstance(placeholders, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in placeholders.items()):
        raise ConfigError("discovery.placeholders: must be a mapping of placeholder name -> discovered label, "
                          "e.g. {pod: __meta_kubernetes_pod_name}")
    networks = data.get("allow_networks") or []
    if not isinstance(networks, list) or not all(isinstance(n, str) for n in networks):
        raise ConfigError("discovery.allow_networks: must be a list of CIDRs such as 10.0.0.0/8")
    ports = data.get("allow_ports") or []
    if not isinstance(ports, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in ports):
        raise ConfigError("discovery.allow_ports: must be a list of port numbers")
    try:
        group_labels = groups.parse_names(data.get("group_labels"), "discovery.group_labels")
    except groups.GroupLabelError as exc:
        raise ConfigError(str(exc)) from None
    settings = replace(settings, restart=tuple(restart), placeholders=tuple(placeholders.items()),
                       allow_networks=tuple(networks), allow_ports=tuple(ports), group_labels=group_labels)
    check_discovery(settings)
    return settings


def check_discovery(settings: DiscoverySettings) -> None:
    """ConfigError unless the settings are usable and say, for a restart, which discovered labels name what
    it acts on (principle 7: labels never choose what is restarted beyond what the operator allowed)."""
    from llm_health.discovery import parse_selector, template_placeholders  # discovery imports this module

    used = template_placeholders(settings.restart)
    label = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
    for name, source in settings.placeholders:
        if not label.fullmatch(name) or name == "backend":
            raise ConfigError(f"discovery.placeholders: {name!r} is not a placeholder name (a label name other "
                              "than 'backend')")
        if not label.fullmatch(source):
            raise ConfigError(f"discovery.placeholders.{name}: {source!r} is not a label name")
    mapped = settings.placeholder_labels
    unmapped = [p for p in used if p != "backend" and p not in mapped]
    if unmapped:
        example = ", ".join(f"{p}: {_K8S_SOURCES.get(p, '__meta_...')}" for p in unmapped)
        raise ConfigError(
            f"discovery.restart: placeholder(s) {', '.join('{' + p + '}' for p in unmapped)} not in "
            "discovery.placeholders. Placeholders are no longer filled from target labels (relabelling sets "
            "those freely, so any PodMonitor could name any pod); say which discovered label fills each, "
            f"e.g. placeholders: {{{example}}}")
    if settings.restart and not settings.name_from:
        raise ConfigError(
            "discovery.name_from: required with discovery.restart: the discovered label the backend's name "
            f"(target label {settings.name_label!r}) must equal, so a target gets only the restart of what it "
            "really is, e.g. name_from: __meta_kubernetes_pod_name (with the PodMonitor relabelling the pod "
            "name to the name label)")
    for key in ("name_label", "name_from", "host_from", "model_label"):
        value = getattr(settings, key)
        if value and not label.fullmatch(value):
            raise ConfigError(f"discovery.{key}: {value!r} is not a label name")
    for cidr in settings.allow_networks:
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            raise ConfigError(f"discovery.allow_networks: {cidr!r} is not a network ({exc})") from None
    for port in settings.allow_ports:
        if not 0 < port < 65536:
            raise ConfigError(f"discovery.allow_ports: {port} is not a port number (1-65535)")
    if settings.prometheus_url:
        _check_url(settings.prometheus_url, "discovery.prometheus_url")
        parse_selector(settings.selector)
        if not settings.name_label:
            raise ConfigError("discovery.name_label: must name a label")
        if settings.refresh <= 0 or settings.timeout <= 0 or settings.extra_refresh_every <= 0:
            raise ConfigError("discovery.refresh, discovery.timeout and discovery.extra_refresh_every: must be > 0")


#: what a Kubernetes restart template's usual placeholders are filled from (for the error message)
_K8S_SOURCES = {"pod": "__meta_kubernetes_pod_name", "namespace": "__meta_kubernetes_namespace",
                "node": "__meta_kubernetes_pod_node_name"}


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    return parse_config(data, source=str(p))


def parse_named_url(spec: str, flag: str) -> tuple[str, str]:
    """`NAME=URL` from the command line."""
    name, sep, url = spec.partition("=")
    if not sep:
        raise ConfigError(f"{flag}: expected NAME=URL, got {spec!r}")
    return _check_name(name, flag), _check_url(url, flag)
