"""Backends from the targets Prometheus already scrapes (optional, beside the static list).

    discovery:
      prometheus_url: http://127.0.0.1:9090
      selector: 'job="vllm"'
      name_label: backend
      restart: ["kubectl", "delete", "pod", "-n", "{namespace}", "{pod}"]

Source: `GET /api/v1/targets?state=active`. It lists every target Prometheus scrapes, with the labels
it puts on the series (after relabelling) and the final scrape URL, whether or not the last scrape
worked: a target that is down is still a backend, to be judged "down" by the exporter, not silently
forgotten (principle 3). Series or metadata queries would lose exactly those targets, so they are not
used. The API has no label filter, so the selector is applied here, on each target's `labels`.

Pure parts (unit-tested): `parse_selector`, `backends_from_targets` (one answer -> backends and the
reasons targets were refused), `expand_argv` (placeholders filled only with DNS-1123 names).
`Discovery` is the I/O edge: it refreshes on a monotonic clock, keeps the last good list when an
answer is bad, removes a vanished backend only after `grace` seconds, and merges with the static
backends (static ones always stay and win a name clash). `LiveBackends` is the sequence the
exporter and remediator read their fleet from.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload
from urllib.parse import urlencode, urlparse

from llm_health.config import NAME_RE, Backend, ConfigError, DiscoverySettings
from llm_health.redact import redact
from llm_health.urlauth import split_credentials

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


def selects(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


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


def expand_argv(argv: Sequence[str], values: Mapping[str, str]) -> tuple[str, ...]:
    """Fill `{name}` placeholders from `values`. Every value used must be a DNS-1123 name, otherwise
    PlaceholderError (the caller then does not restart). The result is argv: it never meets a shell."""
    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise PlaceholderError(f"placeholder {{{name}}}: the target has no label {name!r}")
        value = values[name]
        if not dns1123(value):
            shown = value if len(value) <= 80 else value[:80] + "..."
            raise PlaceholderError(f"placeholder {{{name}}}: label value {shown!r} is not a DNS-1123 name "
                                   f"(lower-case a-z, 0-9, '-', '.', at most {DNS1123_MAX} characters)")
        return value

    out: list[str] = []
    for arg in argv:
        parts = re.split(r"(\{\{|\}\})", arg)
        filled = "".join({"{{": "{", "}}": "}"}.get(p) or _PLACEHOLDER.sub(fill, p) for p in parts)
        out.append(filled)
    return tuple(out)


# ---- one answer -> backends ----------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A target that did not become a backend, or a backend that may not be restarted, and why."""

    backend: str          # "" when no name could be read
    target: str           # its scrape URL (or address)
    reason: str
    restart_only: bool = False   # the backend is watched; only its restart is refused


@dataclass(frozen=True)
class Discovered:
    backends: tuple[Backend, ...]
    refusals: tuple[Refusal, ...]
    targets: int          # targets that matched the selector


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


def backends_from_targets(targets: Sequence[Any], settings: DiscoverySettings,
                          matchers: Sequence[Matcher], reserved: Sequence[str] = ()) -> Discovered:
    """Active targets (`data.activeTargets` of /api/v1/targets) -> backends, pure.

    A target matching the selector becomes a backend named by its `name_label` (which must pass the
    backend naming rule), at the URL it is scraped from, on the host named by `host_label`. Its restart
    argv is `settings.restart` with placeholders filled from its labels (`{backend}` is the backend's
    name); a value that is not a DNS-1123 name leaves it without a restart (a `restart_only` refusal).
    Names in `reserved` (the static backends) and duplicates are refused; of duplicates the first by
    scrape URL is kept, so the outcome does not depend on the order of the answer."""
    refusals: list[Refusal] = []
    chosen: dict[str, Backend] = {}
    matched = 0
    reserved_names = set(reserved)
    rows = [t for t in targets if isinstance(t, dict)]
    rows.sort(key=lambda t: str(t.get("scrapeUrl", "")))
    for t in rows:
        labels = _str_labels(t.get("labels"))
        if not selects(matchers, labels):
            continue
        matched += 1
        where = str(t.get("scrapeUrl") or (t.get("discoveredLabels") or {}).get("__address__", "?"))
        name = labels.get(settings.name_label, "")
        if not name or NAME_RE.fullmatch(name) is None:
            refusals.append(Refusal("", where, f"label {settings.name_label}={name!r} is not a valid backend "
                                    f"name ({NAME_RE.pattern})"))
            continue
        if name in reserved_names:
            refusals.append(Refusal(name, where, "a static backend has this name; the static one is used"))
            continue
        if name in chosen:
            refusals.append(Refusal(name, where, f"duplicate: already discovered at {chosen[name].url}"))
            continue
        url = _base_url(t)
        if not url:
            refusals.append(Refusal(name, where, "cannot tell its URL (scheme must be http(s) and the "
                                    "metrics path /metrics)"))
            continue
        restart: tuple[str, ...] = ()
        if settings.restart:
            try:
                restart = expand_argv(settings.restart, {**labels, "backend": name})
            except PlaceholderError as exc:
                refusals.append(Refusal(name, where, f"no restart: {exc}", restart_only=True))
        host = labels.get(settings.host_label, "") if settings.host_label else ""
        chosen[name] = Backend(name=name, url=url, host=host, model=labels.get(settings.model_label, "")
                               if settings.model_label else "", restart=restart)
    return Discovered(tuple(sorted(chosen.values(), key=lambda b: b.name)), tuple(refusals), matched)


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
    base, auth = split_credentials(prometheus_url)   # user:password@ goes as Basic auth, never to DNS
    url = base.rstrip("/") + "/api/v1/targets?" + urlencode({"state": "active"})
    req = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "llm-health", **auth})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) checked in config
        body = resp.read(MAX_ANSWER_BYTES + 1)
    if len(body) > MAX_ANSWER_BYTES:
        raise ValueError(f"answer larger than {MAX_ANSWER_BYTES} bytes")
    return parse_answer(body)


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
        self._seen: dict[str, _Seen] = {}
        self._backends: tuple[Backend, ...] = ()
        self._last_ok_mono: float | None = None
        self._answering_since: float | None = None    # first good answer of the current unbroken run
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
            return Status(**{**st.__dict__, "stale": stale or bool(st.last_error)})

    def refresh(self) -> bool:
        """One look at Prometheus. A failure changes no backend (the last good list stays, marked stale)."""
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
                self._status = Status(**{**st.__dict__, "refreshes": st.refreshes + 1, "errors": st.errors + 1,
                                         "last_error": why})
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
            gone = [n for n, s in self._seen.items()
                    if now - max(s.last_seen, answering_since) > self.settings.grace]
        kept = {n for n in gone if self._keeps(n)}      # may read the state database: not under the lock
        with self._lock:
            for name in gone:
                seen = self._seen.get(name)
                if name in kept or seen is None or seen.last_seen >= now:
                    continue
                log.info("discovery: %s gone for more than %g s, removed", name, self.settings.grace)
                del self._seen[name]
            self._backends = tuple(self._seen[n].backend for n in sorted(self._seen))
            self._last_ok_mono = now
            st = self._status
            self._status = Status(enabled=True, last_success=self.wall(), refreshes=st.refreshes + 1,
                                  errors=st.errors, stale=False, last_error="", targets=found.targets,
                                  backends=len(self._backends), refused=len(found.refusals),
                                  refusals=found.refusals)
            current = self._backends
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
        """Refresh every `refresh` seconds (monotonic, fixed rate) until `stop` is set. Nothing ends
        the loop but `stop`: an error is logged and the next refresh comes on time."""
        interval = max(self.settings.refresh, 0.05)
        next_at = self.monotonic()
        while not stop.is_set():
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a dead refresher would freeze the fleet silently
                log.exception("discovery refresh failed")
            next_at += interval
            now = self.monotonic()
            if next_at < now:
                next_at = now
            stop.wait(next_at - now)

    def start(self) -> threading.Thread:
        """Refresh in a daemon thread until `stop()`."""
        t = threading.Thread(target=self.run_forever, args=(self.stop_event,), name="discovery", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self.stop_event.set()


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
                   "targets": status.targets, "backends": status.backends,
                   "refusals": [r.__dict__ for r in status.refusals]})

