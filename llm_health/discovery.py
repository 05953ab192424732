"""Backends from the targets Prometheus already scrapes (optional, beside the static list).

    discovery:
      prometheus_url: http://127.0.0.1:9090
      selector: 'job="vllm", __meta_kubernetes_namespace="llm"'
      name_label: backend
      name_from: __meta_kubernetes_pod_name
      restart: ["kubectl", "delete", "pod", "-n", "{namespace}", "{pod}"]
      placeholders: {namespace: __meta_kubernetes_namespace, pod: __meta_kubernetes_pod_name}

Source: `GET /api/v1/targets?state=active`. It lists every target Prometheus scrapes, with the labels
it puts on the series (after relabelling), the labels service discovery gave it (`discoveredLabels`,
before relabelling) and the final scrape URL, whether or not the last scrape worked: a target that is
down is still a backend, to be judged "down" by the exporter, not silently forgotten (principle 3).
Series or metadata queries would lose exactly those targets, so they are not used. The API has no
label filter, so the selector is applied here.

Trust (principle 7, docs/discovery.md): a target's `labels` are whatever relabelling made them, and
whoever may create a PodMonitor, ServiceMonitor or scrape config writes the relabelling. Its
`discoveredLabels` come from the service discovery itself (`__meta_kubernetes_pod_name` is the pod's
name as the API server says). So what a restart acts on (placeholders), the host (the per-host
restart mutex) and the check that a backend's name is what it restarts read discovered labels only;
a name claimed by two targets restarts neither; URLs at link-local addresses, with userinfo, or
outside the operator's allow-lists are refused.

Pure parts (unit-tested): `parse_selector`, `backends_from_targets` (one answer -> backends and the
reasons targets were refused), `url_refusal`, `expand_argv` (placeholders filled only with DNS-1123
names). `Discovery` is the I/O edge: it refreshes on a monotonic clock (and, asked to, once more at
most every `extra_refresh_every` seconds), keeps the last good list when an answer is bad, removes a
vanished backend only after `grace` seconds, and merges with the static backends (static ones always
stay and win a name clash). `LiveBackends` is the sequence the exporter and remediator read their
fleet from.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, overload
from urllib.parse import urlparse

from llm_health.config import NAME_RE, Backend, ConfigError, DiscoverySettings
from llm_health.http_client import fetch
from llm_health.redact import redact

log = logging.getLogger("llm_health.discovery")

MAX_ANSWER_BYTES = 64 * 1024 * 1024
MAX_SELECTOR_LENGTH = 2000
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# ---- selector ------------------------------------------------------------------------------------

_OPS = ("=~", "!~", "!=", "=")


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str            # = != =~ !~
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.label, "")   # as in PromQL: a missing label is the empty string
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        hit = re.fullmatch(self.value, have) is not None    # anchored, as in PromQL
        return hit if self.op == "=~" else not hit


def parse_selector(text: str) -> tuple[Matcher, ...]:
    """`job="vllm", namespace=~"llm-.*"` (optionally inside `{...}`) -> matchers; ConfigError otherwise.

    Grammar: matcher (',' matcher)*, matcher = label op "value", op one of = != =~ !~, values in
    double quotes with \\" and \\\\ escapes. Nothing else is accepted (no metric names, no functions).
    """
    if not isinstance(text, str):
        raise ConfigError("discovery.selector: must be a string")
    if len(text) > MAX_SELECTOR_LENGTH:
        raise ConfigError(f"discovery.selector: longer than {MAX_SELECTOR_LENGTH} characters")
    s = text.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    out: list[Matcher] = []
    i, n = 0, len(s)

    def fail(why: str) -> ConfigError:
        return ConfigError(f"discovery.selector: {why} at character {i + 1} of {text!r}")

    while True:
        while i < n and s[i].isspace():
            i += 1
        if i >= n:
            break
        m = LABEL_NAME.match(s, i)
        if m is None:
            raise fail("expected a label name")
        label = m.group(0)
        i = m.end()
        while i < n and s[i].isspace():
            i += 1
        op = next((o for o in _OPS if s.startswith(o, i)), None)
        if op is None:
            raise fail("expected one of = != =~ !~")
        i += len(op)
        while i < n and s[i].isspace():
            i += 1
        if i >= n or s[i] != '"':
            raise fail('expected a "quoted" value')
        i += 1
        chars: list[str] = []
        while True:
            if i >= n:
                raise fail("unterminated quoted value")
            c = s[i]
            if c == "\\":
                if i + 1 >= n or s[i + 1] not in '"\\':
                    raise fail('only \\" and \\\\ escapes are allowed')
                chars.append(s[i + 1])
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                chars.append(c)
                i += 1
        value = "".join(chars)
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise fail(f"bad regular expression {value!r} ({exc})") from None
        out.append(Matcher(label, op, value))
        while i < n and s[i].isspace():
            i += 1
        if i >= n:
            break
        if s[i] != ",":
            raise fail("expected ','")
        i += 1
    if not out:
        raise ConfigError("discovery.selector: empty; give at least one matcher such as job=\"vllm\"")
    return tuple(out)


#: the pseudo discovered label holding a target's scrape pool (its scrape config's job_name; with
#: prometheus-operator `podMonitor/<namespace>/<name>/<n>`, which only who may write that monitor sets)
SCRAPE_POOL = "__scrape_pool__"


def selects(matchers: Sequence[Matcher], labels: Mapping[str, str],
            discovered: Mapping[str, str] | None = None) -> bool:
    """All matchers hold. A matcher on a name starting with `__` reads the discovered labels (relabelling
    cannot set those; target labels never start with `__`), any other the target labels."""
    seen = discovered or {}
    return all(m.matches(seen if m.label.startswith("__") else labels) for m in matchers)


# ---- placeholders --------------------------------------------------------------------------------

#: DNS-1123 subdomain (Kubernetes pod and node names): lower-case labels of [a-z0-9-], dot-separated
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS1123_MAX = 253
_PLACEHOLDER = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)\}")


class PlaceholderError(ValueError):
    """A placeholder could not be filled safely; the message says which and why."""


def dns1123(value: str) -> bool:
    """True for a DNS-1123 subdomain: 1-253 characters, dot-separated labels of 1-63 [a-z0-9-], each
    starting and ending with a letter or digit. No spaces, shell characters, slashes, `..` or non-ASCII."""
    if not isinstance(value, str) or not 0 < len(value) <= DNS1123_MAX or not value.isascii():
        return False
    return all(DNS1123_LABEL.fullmatch(part) is not None for part in value.split("."))


def template_placeholders(argv: Sequence[str], where: str = "discovery.restart") -> tuple[str, ...]:
    """The placeholder names used in an argv template; ConfigError for any other brace.

    `{name}` is a placeholder, `{{` and `}}` are literal braces; nothing else (no format specs,
    no attribute access: this is not str.format)."""
    names: list[str] = []
    for k, arg in enumerate(argv):
        if not isinstance(arg, str) or not arg:
            raise ConfigError(f"{where}[{k}]: must be a non-empty string")
        rest = arg.replace("{{", "").replace("}}", "")
        for m in _PLACEHOLDER.finditer(rest):
            names.append(m.group(1))
        if "{" in _PLACEHOLDER.sub("", rest) or "}" in _PLACEHOLDER.sub("", rest):
            raise ConfigError(f"{where}[{k}]: {arg!r}: braces must be {{label}} placeholders (or {{{{ }}}})")
    return tuple(dict.fromkeys(names))


def expand_argv(argv: Sequence[str], values: Mapping[str, str],
                sources: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Fill `{name}` placeholders from `values`. Every value used must be a DNS-1123 name, otherwise
    PlaceholderError (the caller then does not restart). The result is argv: it never meets a shell.
    `sources` (placeholder -> the label it is read from) only makes the errors say where."""
    where = sources or {}

    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        source = where.get(name, name)
        if name not in values:
            raise PlaceholderError(f"placeholder {{{name}}}: the target has no label {source!r}")
        value = values[name]
        if not dns1123(value):
            shown = value if len(value) <= 80 else value[:80] + "..."
            raise PlaceholderError(f"placeholder {{{name}}}: label {source} value {shown!r} is not a DNS-1123 "
                                   f"name (lower-case a-z, 0-9, '-', '.', at most {DNS1123_MAX} characters)")
        return value

    out: list[str] = []
    for arg in argv:
        parts = re.split(r"(\{\{|\}\})", arg)
        filled = "".join({"{{": "{", "}}": "}"}.get(p) or _PLACEHOLDER.sub(fill, p) for p in parts)
        out.append(filled)
    return tuple(out)


# ---- URLs ----------------------------------------------------------------------------------------

class RefusalKind(StrEnum):
    NAME = "name"                  # no valid backend name
    STATIC = "static"              # a static backend or proxy has the name
    DUPLICATE = "duplicate"        # two or more targets claim the name: neither is restarted
    URL = "url"                    # the URL cannot be told or is malformed
    USERINFO = "userinfo"
    LINK_LOCAL = "link_local"
    NETWORK = "network"            # outside allow_networks
    PORT = "port"                  # outside allow_ports
    PLACEHOLDER = "placeholder"    # restart only: a placeholder could not be filled safely
    NAME_MISMATCH = "name_mismatch"  # restart only: the name is not what the restart acts on


LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address a URL's host is (IPv4-mapped IPv6 as its IPv4), None for a host name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def url_refusal(url: str, settings: DiscoverySettings) -> tuple[RefusalKind, str] | None:
    """Why a discovered backend may not be at `url` (None: it may). Pure: names are never resolved.

    Refused: userinfo (`user:pass@`, also percent-encoded in the host part, as Prometheus writes an
    `__address__` holding one) unless allow_userinfo; numeric hosts in a form other than canonical
    dotted-quad or IPv6 (`2852039166`, `0xa9.0xfe.0xa9.0xfe`: the resolver reads them as addresses);
    link-local addresses (169.254.0.0/16, fe80::/10: cloud metadata services) unless allow_link_local;
    outside allow_networks (then host names too: a name cannot be checked without resolving it);
    a port outside allow_ports."""
    p = urlparse(url)
    netloc = p.netloc
    if ("@" in netloc or "%40" in netloc.lower()) and not settings.allow_userinfo:
        return RefusalKind.USERINFO, "its URL holds userinfo (user:password@); allow_userinfo is off"
    hostport = netloc.rpartition("@")[2]
    if "%" in hostport:
        return RefusalKind.URL, f"its address {hostport!r} is percent-encoded"
    try:
        port = p.port or (443 if p.scheme == "https" else 80)
    except ValueError:
        return RefusalKind.URL, f"its address {hostport!r} has no valid port"
    host = p.hostname or ""
    ip = _address(host)
    if ip is None:
        try:
            socket.inet_aton(host)
            return RefusalKind.URL, f"its host {host!r} is an address in a non-canonical form"
        except OSError:
            pass
    if ip is not None and any(ip in net for net in LINK_LOCAL if net.version == ip.version) \
            and not settings.allow_link_local:
        return RefusalKind.LINK_LOCAL, f"its address {ip} is link-local (cloud metadata lives there); " \
            "allow_link_local is off"
    if settings.allow_networks:
        if ip is None:
            return RefusalKind.NETWORK, f"its host {host!r} is a name, not an address: allow_networks is set and " \
                "names are not resolved"
        nets = [ipaddress.ip_network(n) for n in settings.allow_networks]
        if not any(ip in net for net in nets if net.version == ip.version):
            return RefusalKind.NETWORK, f"its address {ip} is outside allow_networks " \
                f"({', '.join(settings.allow_networks)})"
    if settings.allow_ports and port not in settings.allow_ports:
        return RefusalKind.PORT, f"its port {port} is not in allow_ports " \
            f"({', '.join(str(x) for x in settings.allow_ports)})"
    return None


# ---- one answer -> backends ----------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A target that did not become a backend, or a backend that may not be restarted, and why."""

    backend: str          # "" when no name could be read
    target: str           # its scrape URL (or address)
    reason: str
    restart_only: bool = False   # the backend is watched; only its restart is refused
    kind: RefusalKind = RefusalKind.URL


@dataclass(frozen=True)
class Duplicate:
    """A backend name claimed by more than one target (e.g. a rogue monitor copying a real pod's name)."""

    name: str
    targets: tuple[str, ...]      # their scrape URLs (or addresses), sorted
    urls: tuple[str, ...] = ()    # the backend URLs among them that would be acceptable


@dataclass(frozen=True)
class Discovered:
    backends: tuple[Backend, ...]
    refusals: tuple[Refusal, ...]
    targets: int          # targets that matched the selector
    duplicates: tuple[Duplicate, ...] = ()


def _base_url(target: Mapping[str, Any]) -> str:
    """scheme://host:port[/prefix] of a target: its scrapeUrl minus the `/metrics` path (or, without a
    scrapeUrl, __scheme__ and __address__ from discoveredLabels). "" when it cannot be told."""
    scrape = target.get("scrapeUrl")
    if isinstance(scrape, str) and scrape:
        p = urlparse(scrape)
        path = p.path.rstrip("/")
        if not path.endswith("/metrics"):
            return ""
        prefix = path[: -len("/metrics")]
        return f"{p.scheme}://{p.netloc}{prefix}" if p.scheme in ("http", "https") and p.hostname else ""
    disc = target.get("discoveredLabels") or {}
    scheme, address = disc.get("__scheme__", "http"), disc.get("__address__", "")
    path = disc.get("__metrics_path__", "/metrics")
    if scheme not in ("http", "https") or not address or path.rstrip("/") != "/metrics":
        return ""
    return f"{scheme}://{address}"


def _str_labels(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, str)}


def discovered_labels(target: Mapping[str, Any]) -> dict[str, str]:
    """A target's discoveredLabels, plus its scrape pool as `__scrape_pool__`."""
    out = _str_labels(target.get("discoveredLabels"))
    pool = target.get("scrapePool")
    if isinstance(pool, str):
        out[SCRAPE_POOL] = pool
    else:
        out.pop(SCRAPE_POOL, None)      # never taken from the answer's labels
    return out


def _restart_of(name: str, discovered: Mapping[str, str], settings: DiscoverySettings,
                where: str) -> tuple[tuple[str, ...], Refusal | None]:
    """The restart argv of backend `name`, filled from its discovered labels only, or why it has none."""
    if not settings.restart:
        return (), None
    if not settings.name_from:
        return (), Refusal(name, where, "no restart: discovery.name_from is not set, so nothing ties the name to "
                           "what the restart acts on", True, RefusalKind.NAME_MISMATCH)
    real = discovered.get(settings.name_from)
    if real != name:
        shown = "missing" if real is None else repr(real if len(real) <= 80 else real[:80] + "...")
        return (), Refusal(name, where, f"no restart: its name {name!r} (label {settings.name_label}) is not its "
                           f"discovered {settings.name_from} ({shown}): what the restart would act on is not this "
                           "backend", True, RefusalKind.NAME_MISMATCH)
    sources = settings.placeholder_labels
    values = {p: discovered[label] for p, label in sources.items() if label in discovered}
    values["backend"] = name            # equal to the discovered name_from label (checked above)
    try:
        return expand_argv(settings.restart, values, sources), None
    except PlaceholderError as exc:
        return (), Refusal(name, where, f"no restart: {exc}", True, RefusalKind.PLACEHOLDER)


def backends_from_targets(targets: Sequence[Any], settings: DiscoverySettings,
                          matchers: Sequence[Matcher], reserved: Sequence[str] = ()) -> Discovered:
    """Active targets (`data.activeTargets` of /api/v1/targets) -> backends, pure.

    A target matching the selector becomes a backend named by its `name_label` (which must pass the
    backend naming rule), at the URL it is scraped from (`url_refusal` must pass), on the host named by
    its discovered label `host_from`. Its restart argv is `settings.restart` with placeholders filled
    from its discovered labels (`settings.placeholders`; `{backend}` is its name), and only when its name
    equals its discovered `name_from` label; otherwise, or when a value is not a DNS-1123 name, it is
    watched without a restart (a `restart_only` refusal). Names in `reserved` (the static backends) are
    refused. A name claimed by two or more targets is refused for all of them (a `Duplicate`): which
    one is real cannot be told, so neither gets a restart. The outcome does not depend on answer order."""
    refusals: list[Refusal] = []
    claims: dict[str, list[tuple[str, dict[str, str], dict[str, str], Mapping[str, Any]]]] = {}
    matched = 0
    reserved_names = set(reserved)
    rows = [t for t in targets if isinstance(t, dict)]
    rows.sort(key=lambda t: str(t.get("scrapeUrl", "")))
    for t in rows:
        labels = _str_labels(t.get("labels"))
        discovered = discovered_labels(t)
        if not selects(matchers, labels, discovered):
            continue
        matched += 1
        where = str(t.get("scrapeUrl") or discovered.get("__address__", "?"))
        name = labels.get(settings.name_label, "")
        if not name or NAME_RE.fullmatch(name) is None:
            refusals.append(Refusal("", where, f"label {settings.name_label}={name!r} is not a valid backend "
                                    f"name ({NAME_RE.pattern})", kind=RefusalKind.NAME))
            continue
        if name in reserved_names:
            refusals.append(Refusal(name, where, "a static backend has this name; the static one is used",
                                    kind=RefusalKind.STATIC))
            continue
        claims.setdefault(name, []).append((where, labels, discovered, t))
    chosen: list[Backend] = []
    duplicates: list[Duplicate] = []
    for name in sorted(claims):
        claimants = claims[name]
        if len(claimants) > 1:
            wheres = tuple(sorted(c[0] for c in claimants))
            urls = tuple(sorted({u for c in claimants if (u := _base_url(c[3])) and url_refusal(u, settings) is None}))
            duplicates.append(Duplicate(name, wheres, urls))
            for where, *_ in claimants:
                refusals.append(Refusal(name, where, f"duplicate: {len(claimants)} targets claim this name "
                                        f"({', '.join(wheres)}); none is restarted while this lasts",
                                        kind=RefusalKind.DUPLICATE))
            continue
        ((where, labels, discovered, t),) = claimants
        url = _base_url(t)
        if not url:
            refusals.append(Refusal(name, where, "cannot tell its URL (scheme must be http(s) and the "
                                    "metrics path /metrics)", kind=RefusalKind.URL))
            continue
        bad = url_refusal(url, settings)
        if bad is not None:
            refusals.append(Refusal(name, where, bad[1], kind=bad[0]))
            continue
        restart, refused = _restart_of(name, discovered, settings, where)
        if refused is not None:
            refusals.append(refused)
        host = discovered.get(settings.host_from, "") if settings.host_from else ""
        chosen.append(Backend(name=name, url=url, host=host, model=labels.get(settings.model_label, "")
                              if settings.model_label else "", restart=restart))
    return Discovered(tuple(chosen), tuple(refusals), matched, tuple(duplicates))


def parse_answer(body: bytes) -> list[Any]:
    """`data.activeTargets` of a /api/v1/targets answer; ValueError for anything else."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise ValueError(f"status {doc.get('status') if isinstance(doc, dict) else '?'!r}: "
                         f"{doc.get('error', '') if isinstance(doc, dict) else ''}")
    data = doc.get("data")
    targets = data.get("activeTargets") if isinstance(data, dict) else None
    if not isinstance(targets, list):
        raise ValueError("no data.activeTargets list in the answer")
    return targets


# ---- the refreshing edge -------------------------------------------------------------------------


def fetch_targets(prometheus_url: str, timeout: float) -> list[Any]:
    """One look at Prometheus' targets, over within `timeout` whatever Prometheus (or a proxy in front of
    it) does: connect, headers and body share one deadline (llm_health/http_client.py). A user:password@
    in the URL goes as Basic auth, never to DNS."""
    resp = fetch("GET", prometheus_url.rstrip("/") + "/api/v1/targets", timeout=timeout, params={"state": "active"},
                 headers={"Accept": "application/json"}, max_bytes=MAX_ANSWER_BYTES)
    if resp.status != 200:
        raise ValueError(f"HTTP {resp.status}: {resp.text[:200]}")
    return parse_answer(resp.body)


@dataclass(frozen=True)
class Status:
    """What the metrics show about discovery (a snapshot)."""

    enabled: bool = False
    last_success: float = 0.0         # wall clock of the last good answer, 0 = never
    refreshes: int = 0
    errors: int = 0
    stale: bool = True                # no good answer within 2 refresh intervals (or never)
    last_error: str = ""
    targets: int = 0                  # targets matching the selector in the last good answer
    backends: int = 0                 # discovered backends in the fleet (incl. those in their grace period)
    refused: int = 0                  # targets refused in the last good answer (restart-only refusals too)
    refusals: tuple[Refusal, ...] = ()
    duplicates: tuple[Duplicate, ...] = ()   # names claimed by more than one target in the last good answer
    extra_refreshes: int = 0          # refreshes done early because a backend not in the fleet was asked for


@dataclass
class _Seen:
    backend: Backend
    last_seen: float                  # monotonic


class Discovery:
    """Refreshes the discovered backends; `backends()` is always the last good list (plus grace)."""

    def __init__(self, settings: DiscoverySettings, static: Sequence[Backend] = (),
                 fetch: Callable[[], list[Any]] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 keep: Callable[[str], bool] | None = None, reserved: Sequence[str] = ()) -> None:
        self.settings = settings
        self.reserved = tuple(b.name for b in static) + tuple(reserved)
        self.matchers = parse_selector(settings.selector)
        self.static = tuple(static)
        self._fetch = fetch or (lambda: fetch_targets(settings.prometheus_url, settings.timeout))
        self.monotonic = monotonic
        self.wall = wall
        self.keep = keep or (lambda _name: False)
        self._lock = threading.Lock()
        self.stop_event = threading.Event()
        self._wanted = threading.Event()      # someone asked for a refresh (request_refresh)
        self._kick = threading.Event()        # wakes the refresher: a request, or stop()
        self._seen: dict[str, _Seen] = {}
        self._backends: tuple[Backend, ...] = ()
        self._last_ok_mono: float | None = None
        self._answering_since: float | None = None    # first good answer of the current unbroken run
        self._started = 0                     # refreshes started so far (see mark)
        self._answered = 0                    # the number (1, 2, ...) of the latest good refresh, 0 = none
        self._status = Status(enabled=True)
        self._listeners: list[Callable[[tuple[Backend, ...], tuple[Refusal, ...]], None]] = []

    def on_change(self, listener: Callable[[tuple[Backend, ...], tuple[Refusal, ...]], None]) -> None:
        """Called after every good refresh with the discovered backends and the refusals."""
        self._listeners.append(listener)

    def backends(self) -> tuple[Backend, ...]:
        with self._lock:
            return self._backends

    def status(self) -> Status:
        with self._lock:
            st = self._status
            stale = self._last_ok_mono is None or \
                self.monotonic() - self._last_ok_mono > 2 * max(self.settings.refresh, 0.001)
            return dataclasses.replace(st, stale=stale or bool(st.last_error))

    # -- asking for a refresh (never waits for Prometheus) ---------------------------------------------
    def mark(self) -> int:
        """A point in this refresher's history: `answered_since(mark)` tells whether a refresh that
        STARTED after it has had a good answer (so a backend missing from the list now is really missing,
        not just not seen yet)."""
        with self._lock:
            return self._started

    def answered_since(self, mark: int) -> bool:
        with self._lock:
            return self._answered > mark

    def request_refresh(self) -> None:
        """Ask the refresher thread for a refresh soon; returns at once. Requests are served at most once
        per `extra_refresh_every` seconds (counted from the latest refresh's start), so a storm of alerts
        about backends not in the fleet costs one extra query per interval, not one per alert."""
        self._wanted.set()
        self._kick.set()

    # -- one refresh ---------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """One look at Prometheus. A failure changes no backend (the last good list stays, marked stale)."""
        with self._lock:
            self._started += 1
            number = self._started
        try:
            targets = self._fetch()
            found = backends_from_targets(targets, self.settings, self.matchers, self.reserved)
        except Exception as exc:  # noqa: BLE001 - any failure: keep the last good list
            why = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("discovery from %s failed, keeping the last good list: %s",
                        self.settings.prometheus_url, why)
            with self._lock:
                self._answering_since = None
                st = self._status
                self._status = dataclasses.replace(st, refreshes=st.refreshes + 1, errors=st.errors + 1,
                                                   last_error=why)
            return False
        now = self.monotonic()
        with self._lock:
            # absence is counted only while Prometheus answers: after a failed refresh the grace period
            # starts again at the next good answer, which may well be empty or partial (a restarted
            # Prometheus whose service discovery has not run yet)
            if self._answering_since is None:
                self._answering_since = now
            answering_since = self._answering_since
            for b in found.backends:
                self._seen[b.name] = _Seen(b, now)
            for dup in found.duplicates:
                # a name two targets claim: never restarted while that lasts. A backend of that name already
                # in the fleet stays watched (without restart) while its URL is still one of the claimants,
                # so a copy of a real backend's name cannot hide it; otherwise it ages out after grace.
                seen = self._seen.get(dup.name)
                if seen is not None:
                    kept = dataclasses.replace(seen.backend, restart=())
                    self._seen[dup.name] = _Seen(kept, now if kept.url in dup.urls else seen.last_seen)
            gone = [n for n, s in self._seen.items()
                    if now - max(s.last_seen, answering_since) > self.settings.grace]
        kept_names = {n for n in gone if self._keeps(n)}      # may read the state database: not under the lock
        with self._lock:
            for name in gone:
                seen = self._seen.get(name)
                if name in kept_names or seen is None or seen.last_seen >= now:
                    continue
                log.info("discovery: %s gone for more than %g s, removed", name, self.settings.grace)
                del self._seen[name]
            self._backends = tuple(self._seen[n].backend for n in sorted(self._seen))
            self._last_ok_mono = now
            self._answered = max(self._answered, number)
            st = self._status
            self._status = dataclasses.replace(
                st, enabled=True, last_success=self.wall(), refreshes=st.refreshes + 1, stale=False,
                last_error="", targets=found.targets, backends=len(self._backends), refused=len(found.refusals),
                refusals=found.refusals, duplicates=found.duplicates)
            current = self._backends
        for dup in found.duplicates:
            log.warning("discovery: backend name %s claimed by %d targets (%s): neither is restarted",
                        dup.name, len(dup.targets), ", ".join(dup.targets))
        for listener in self._listeners:
            try:
                listener(current, found.refusals)
            except Exception:  # noqa: BLE001 - a listener must not stop discovery
                log.exception("discovery listener failed")
        return True

    def _keeps(self, name: str) -> bool:
        """`keep(name)`; when it cannot tell (e.g. the state database is busy), keep: never drop a
        backend because of our own error."""
        try:
            return bool(self.keep(name))
        except Exception:  # noqa: BLE001 - removal waits for the next refresh
            log.exception("discovery: cannot tell whether %s may be removed; kept", name)
            return True

    def run_forever(self, stop: threading.Event) -> None:
        """Refresh every `refresh` seconds (monotonic, fixed rate) until `stop` is set, and early when
        `request_refresh` asked, but never sooner than `extra_refresh_every` after the latest refresh
        started. Nothing ends the loop but `stop`: an error is logged and the next refresh comes on time.
        With a good answer already in (the caller refreshed before starting it), the first refresh comes
        one interval later, not at once."""
        interval = max(self.settings.refresh, 0.05)
        gap = max(self.settings.extra_refresh_every, 0.05)
        next_at = started = self.monotonic()
        extra = False                       # the coming refresh was asked for (request_refresh)
        due = not self.answered_since(0)
        while not stop.is_set():
            if due:
                started = self.monotonic()
                self._wanted.clear()        # requests made before this start are served by it
                try:
                    self.refresh()
                except Exception:  # noqa: BLE001 - a dead refresher would freeze the fleet silently
                    log.exception("discovery refresh failed")
                if extra:
                    with self._lock:
                        self._status = dataclasses.replace(self._status,
                                                           extra_refreshes=self._status.extra_refreshes + 1)
            due = True
            if not extra:                   # an extra refresh leaves the fixed-rate schedule as it was
                next_at += interval
            now = self.monotonic()
            if next_at < now:
                next_at = now
            while not stop.is_set():
                now = self.monotonic()
                wait, extra = next_at - now, False
                if self._wanted.is_set() and started + gap - now < wait:
                    wait, extra = started + gap - now, True
                if wait <= 0 or not self._sleep(stop, wait):
                    break                   # the time came (also with a clock that does not move)
                # woken by a request (or stop): look again at what is due

    def _sleep(self, stop: threading.Event, seconds: float) -> bool:
        """Sleep `seconds` of real time; True as soon as request_refresh or stop() wakes it (or `stop`,
        looked at twice a second, is set), False when the time has passed."""
        until = time.monotonic() + seconds
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return False
            if self._kick.wait(min(left, 0.5)):
                self._kick.clear()
                return True
            if stop.is_set():
                return True

    def start(self) -> threading.Thread:
        """Refresh in a daemon thread until `stop()`."""
        t = threading.Thread(target=self.run_forever, args=(self.stop_event,), name="discovery", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self.stop_event.set()
        self._kick.set()


class LiveBackends(Sequence[Backend]):
    """The fleet as the exporter and remediator read it: the static backends, then the discovered ones
    that do not clash with them. Each iteration, `len` or index reads one consistent snapshot; the next
    read may see a newer list. Without discovery it behaves like the static tuple."""

    def __init__(self, static: Sequence[Backend], discovery: Discovery | None = None) -> None:
        self.static = tuple(static)
        self.discovery = discovery
        self._names = frozenset(b.name for b in self.static)
        self._merged: tuple[tuple[Backend, ...], tuple[Backend, ...]] = ((), self.static)  # (source, merged)

    def snapshot(self) -> tuple[Backend, ...]:
        if self.discovery is None:
            return self.static
        found = self.discovery.backends()
        source, merged = self._merged         # one tuple read: safe without a lock
        if found is not source:
            merged = self.static + tuple(b for b in found if b.name not in self._names)
            self._merged = (found, merged)
        return merged

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        return len(self.snapshot())

    @overload
    def __getitem__(self, i: int) -> Backend: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Backend, ...]: ...

    def __getitem__(self, i: int | slice) -> Backend | tuple[Backend, ...]:
        return self.snapshot()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LiveBackends):
            return self.snapshot() == other.snapshot()
        return isinstance(other, tuple) and self.snapshot() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LiveBackends({len(self.static)} static, discovery {'on' if self.discovery else 'off'})"


def status_document(status: Status) -> dict[str, Any]:
    """Discovery's status as shown (exporter /verdicts, remediator /api/discovery): URLs redacted."""
    return redact({"enabled": status.enabled, "last_success": status.last_success, "stale": status.stale,
                   "refreshes": status.refreshes, "errors": status.errors, "last_error": status.last_error,
                   "targets": status.targets, "backends": status.backends, "extra_refreshes": status.extra_refreshes,
                   "refusals": [{**r.__dict__, "kind": str(r.kind)} for r in status.refusals],
                   "duplicates": [{"name": d.name, "targets": list(d.targets)} for d in status.duplicates]})

