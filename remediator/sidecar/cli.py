"""`llm-health readiness`: the readiness sidecar of one vLLM pod (docs/kubernetes.md, "Traffic follows the
lifecycle").

    llm-health readiness --remediator http://llm-health-remediator:9411 --backend vllm-0 \\
        --engine-url http://127.0.0.1:8000 [--listen 0.0.0.0:8081] [--interval 2] [--timeout 2] \\
        [--engine-timeout 45] [--fallback-after 30]

Put the pod's readinessProbe on this container's GET /ready. `--backend` defaults to $POD_NAME (the
downward API's metadata.name: the PodMonitor makes the pod name the backend name). The remediator's
GET needs no token. No web stack (flask, requests, prometheus_client: tests/process/test_cli_lazy.py): the
standard library's HTTP server and llm_health/http_client.py, so it starts fast and stays small.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType
from urllib.parse import urlparse

from llm_health import logs
from llm_health.config import NAME_RE, ConfigError
from llm_health.redact import redact
from llm_health.remediator.sidecar.server import ReadinessServer
from llm_health.remediator.sidecar.watch import Settings, Watch

log = logging.getLogger("llm_health.readiness")

BACKEND_ENV = "POD_NAME"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remediator", metavar="URL", required=True,
                        help="the remediator's URL, e.g. http://llm-health-remediator:9411")
    parser.add_argument("--backend", default=os.environ.get(BACKEND_ENV, ""),
                        help=f"this pod's backend name (default ${BACKEND_ENV}: the downward API's pod name)")
    parser.add_argument("--engine-url", default="http://127.0.0.1:8000",
                        help="the engine in this pod, for the fallback's GET /health (default %(default)s)")
    parser.add_argument("--listen", default="0.0.0.0:8081", metavar="HOST:PORT",
                        help="where to serve /ready and /healthz (default %(default)s)")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds between two polls of the remediator and of the engine (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=2.0,
                        help="seconds for one call to the remediator, all of it (default %(default)s)")
    parser.add_argument("--engine-timeout", type=float, default=45.0,
                        help="seconds for one GET /health of the engine: a busy vLLM answers slowly "
                        "(default %(default)s)")
    parser.add_argument("--fallback-after", type=float, default=30.0,
                        help="seconds a remediator answer stays valid; without a newer one the engine's "
                        "/health decides (default %(default)s)")
    logs.add_arguments(parser)


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"--listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def check_url(flag: str, url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"{flag}: {redact(url)!r} is not an http(s) URL")
    return url


def settings_of(args: argparse.Namespace) -> Settings:
    if not args.backend:
        raise ConfigError(f"--backend: required (or ${BACKEND_ENV}, e.g. from the downward API)")
    if not NAME_RE.match(args.backend):
        raise ConfigError(f"--backend: {args.backend[:80]!r} is not a backend name")
    for flag in ("interval", "timeout", "engine_timeout", "fallback_after"):
        if not getattr(args, flag) > 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be > 0")
    if args.fallback_after <= args.interval + args.timeout:
        raise ConfigError("--fallback-after: must exceed --interval + --timeout, or the fallback would decide "
                          "between two polls of a remediator that answers")
    return Settings(check_url("--remediator", args.remediator), args.backend, check_url("--engine-url", args.engine_url),
                    args.interval, args.timeout, args.engine_timeout, args.fallback_after)


def run(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    host, port = parse_listen(args.listen)
    logs.setup(args.log_format, args.log_level, stream=sys.stderr)
    watch = Watch(settings)
    try:
        server = ReadinessServer(host, port, watch)
    except OSError as exc:
        raise ConfigError(f"--listen: cannot listen on {args.listen}: {exc.strerror or exc}") from exc

    def stop(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("llm-health readiness: backend %s, remediator %s, engine %s, every %g s, fallback after %g s, "
             "listening on http://%s:%d", settings.backend, redact(settings.remediator), redact(settings.engine),
             settings.interval, settings.fallback_after, host, server.port)
    watch.start()
    server.serve_forever()
    watch.stop()
    return 0
