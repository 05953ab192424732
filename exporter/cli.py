"""`llm-health exporter`: read every backend's /metrics directly, judge it, probe only idle ones.

    llm-health exporter --config llm-health.yml
    llm-health exporter --backend gpu-a=http://10.0.0.5:8000 --proxy lb=http://10.0.0.9:8080 \\
        --interval 15 --stall-after 120 --listen 127.0.0.1:9410

Flags override the file's `exporter:` settings; --backend/--proxy add to its lists. SIGHUP reads the file
again with the same flags (`systemctl reload`): exporter/reload.py says what a reload applies.
"""

from __future__ import annotations

import argparse
import logging
import resource
import signal
import sys
import threading
from dataclasses import replace
from types import FrameType

from llm_health import logs
from llm_health.config import (
    Backend,
    Config,
    ConfigError,
    Proxy,
    check_discovery,
    load_config,
    parse_named_url,
)
from llm_health.discovery import Discovery, LiveBackends
from llm_health.exporter.app import ExporterServer
from llm_health.exporter.backend import load_api_key
from llm_health.exporter.reload import Reloader
from llm_health.exporter.scheduler import ReadScheduler
from llm_health.reload import ReloadCollector

log = logging.getLogger("llm_health.exporter")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="shared llm-health YAML file")
    parser.add_argument("--backend", action="append", default=[], metavar="NAME=URL",
                        help="a vLLM server, read directly (repeatable)")
    parser.add_argument("--proxy", action="append", default=[], metavar="NAME=URL",
                        help="a proxy, checked through GET /v1/models only (repeatable)")
    parser.add_argument("--discover-from", metavar="PROMETHEUS_URL",
                        help="also watch the targets this Prometheus scrapes (discovery.prometheus_url)")
    parser.add_argument("--discover-selector", metavar="SELECTOR",
                        help='which targets, e.g. \'job="vllm"\' (discovery.selector, default job="vllm")')
    parser.add_argument("--interval", type=float, help="seconds between two readings of one backend (default 15)")
    parser.add_argument("--stall-after", type=float,
                        help="seconds without progress before stalled, for an engine that says nothing of its steps "
                             "(default 120)")
    parser.add_argument("--stall-floor", type=float,
                        help="the least stall bound for an engine whose numbers bound its steps (default 30)")
    parser.add_argument("--down-after", type=int, help="consecutive failures before down (default 2)")
    parser.add_argument("--read-timeout", type=float, help="per-backend /metrics timeout (default 5)")
    parser.add_argument("--probe-timeout", type=float, help="idle probe timeout (default 10)")
    parser.add_argument("--probe-every", type=float, help="min seconds between probes of one backend")
    parser.add_argument("--listen", metavar="HOST:PORT", help="where to serve /metrics and /verdicts")
    parser.add_argument("--api-key-file", metavar="PATH",
                        help="file with the vLLM --api-key, sent as a bearer token on /v1/* (probe, models)")
    logs.add_arguments(parser)


def build_config(args: argparse.Namespace) -> Config:
    config = load_config(args.config) if args.config else Config()
    backends = list(config.backends)
    proxies = list(config.proxies)
    for spec in args.backend:
        name, url = parse_named_url(spec, "--backend")
        backends.append(Backend(name=name, url=url))
    for spec in args.proxy:
        name, url = parse_named_url(spec, "--proxy")
        proxies.append(Proxy(name=name, url=url))
    names = [b.name for b in backends] + [p.name for p in proxies]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"duplicate name(s) {', '.join(dupes)}")
    discovery = config.discovery
    if args.discover_from or args.discover_selector:
        discovery = replace(discovery, **({"prometheus_url": args.discover_from} if args.discover_from else {}),
                            **({"selector": args.discover_selector} if args.discover_selector else {}))
        check_discovery(discovery)
        if not discovery.enabled:
            raise ConfigError("--discover-selector: needs --discover-from or discovery.prometheus_url")
    if not backends and not proxies and not discovery.enabled:
        raise ConfigError("nothing to watch: give --config, --discover-from or at least one --backend/--proxy")
    overrides = {
        "interval": args.interval, "stall_after": args.stall_after,
        "stall_floor": args.stall_floor, "down_after": args.down_after,
        "read_timeout": args.read_timeout, "probe_timeout": args.probe_timeout,
        "probe_every": args.probe_every, "listen": args.listen, "api_key_file": args.api_key_file,
    }
    for key, value in overrides.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"--{key.replace('_', '-')}: must be >= 0")
    settings = replace(config.exporter, **{k: v for k, v in overrides.items() if v is not None})
    if settings.api_key_file and settings.api_key_file != args.api_key_file:
        # from the file: relative to the file's folder
        settings = replace(settings, api_key_file=str(config.resolve_path(settings.api_key_file)))
    load_api_key(settings.api_key_file, "exporter.api_key_file")  # fail at start, not at the first probe
    if settings.interval <= 0:
        raise ConfigError("--interval: must be > 0")
    parse_listen(settings.listen)
    return replace(config, backends=tuple(backends), proxies=tuple(proxies), exporter=settings,
                   discovery=discovery)


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"listen: expected HOST:PORT, got {listen!r}")
    return host or "127.0.0.1", int(port)


#: kept-alive connections one backend may hold at once: /metrics, /health (after a timeout), the probe
FDS_PER_BACKEND = 3
FDS_SPARE = 256          # the exporter's own listener and clients, Prometheus' scrapes, logs


def fds_wanted(backends: int, proxies: int) -> int:
    return FDS_PER_BACKEND * backends + proxies + FDS_SPARE


def raise_fd_limit(wanted: int) -> None:
    """Kept-alive connections per backend: make sure a big fleet fits in the open-file limit (only
    ever raised, up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


class Watched:
    """The backends the fleet reads: the static list (the config's, replaced by a reload) then, with discovery
    on, the discovered ones (a discovered name that clashes with a static backend or a proxy is refused)."""

    def __init__(self, config: Config, fleet: ReadScheduler) -> None:
        self.fleet = fleet
        self.discovery: Discovery | None = None
        if config.discovery.enabled:
            self.discovery = Discovery(config.discovery, static=tuple(config.backends),
                                       reserved=[p.name for p in config.proxies])
        self._lock = threading.Lock()
        self._live = LiveBackends(tuple(config.backends), self.discovery)
        self._proxies = len(config.proxies)
        if self.discovery is not None:
            self.discovery.on_change(self._follow)
            self.discovery.refresh()   # the first readings already see what Prometheus knows (failure: static)

    def _follow(self, _backends: tuple[Backend, ...], _refusals: object) -> None:
        """After every good refresh of discovery: static + discovered."""
        with self._lock:
            self._watch()

    def _watch(self) -> None:
        current = self._live.snapshot()
        raise_fd_limit(fds_wanted(len(current), self._proxies))   # the limit set at start knew the static ones
        self.fleet.set_backends(current)

    def apply(self, config: Config) -> None:
        """A reloaded config: its thresholds, proxies and static backends (the others keep their state)."""
        with self._lock:
            self.fleet.update_settings(config.exporter)
            self._proxies = len(config.proxies)
            self.fleet.set_proxies(config.proxies)
            self._live = LiveBackends(tuple(config.backends), self.discovery)
            self._watch()


def watch_discovered(config: Config, fleet: ReadScheduler) -> Discovery | None:
    """The fleet follows static + discovered backends; the Discovery (None without discovery)."""
    return Watched(config, fleet).discovery


def api_key_of(config: Config) -> str:
    return load_api_key(config.exporter.api_key_file, "exporter.api_key_file")


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    # verdict changes (other than idle <-> busy) and discovery events, one line each, on stderr (URLs redacted)
    logs.setup(args.log_format, args.log_level, stream=sys.stderr)
    raise_fd_limit(fds_wanted(len(config.backends), len(config.proxies)))
    host, port = parse_listen(config.exporter.listen)
    fleet = ReadScheduler(config.backends, config.proxies, config.exporter, api_key=api_key_of(config),
                          dynamic=config.discovery.enabled)
    watched = Watched(config, fleet)
    reloader = Reloader(lambda: build_config(args), watched.apply, config, api_key_of)
    server = ExporterServer(fleet, host, port, watched.discovery,
                            collectors=[ReloadCollector("llm_health_exporter", lambda: reloader.status)])

    def stop(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    reload_wanted = threading.Event()

    def hang_up(_signum: int, _frame: FrameType | None) -> None:
        reload_wanted.set()             # the reload thread does the work, never the signal handler

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, hang_up)
    threading.Thread(target=reloader.serve, args=(reload_wanted, server.stop), name="reload", daemon=True).start()
    found = f" + discovery from {config.discovery.prometheus_url} ({config.discovery.selector})" \
        if watched.discovery is not None else ""
    log.info("llm-health exporter: %d backend(s)%s, %d proxy(ies), interval %g s, stall after %g s, listening on "
             "http://%s:%d (SIGHUP reloads %s)", len(config.backends), found, len(config.proxies),
             config.exporter.interval, config.exporter.stall_after, host, port, args.config or "the flags")
    server.serve_forever()
    return 0
