"""`llm-health healthcheck [URL] [--timeout S]`: exit 0 when URL answers 2xx, 1 otherwise (container HEALTHCHECK).

For our own processes only (exporter /metrics, remediator /healthz, simulator /health); the URL
defaults to $LLM_HEALTH_HEALTHCHECK_URL, else the remediator's http://127.0.0.1:9411/healthz.
Docker never restarts a container for being unhealthy; this reports, it decides nothing. Standard
library only (llm_health/http_client.py: one total deadline, user:password@ as Basic auth), so it starts
fast and imports nothing of the web stack.
"""

from __future__ import annotations

import argparse
import os
import sys
from urllib.parse import urlparse

from llm_health.config import ConfigError
from llm_health.http_client import HttpFailure, fetch
from llm_health.redact import redact

ENV = "LLM_HEALTH_HEALTHCHECK_URL"
DEFAULT_URL = "http://127.0.0.1:9411/healthz"


def check(url: str, timeout: float) -> tuple[bool, str]:
    try:
        resp = fetch("GET", url, timeout=timeout, max_bytes=1024 * 1024)
    except HttpFailure as exc:
        what = {"refused": "connection refused", "timeout": "timed out"}.get(exc.kind, "failed")
        return False, f"{what}: {exc.detail}"
    return 200 <= resp.status < 300, f"HTTP {resp.status}"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", default=None, help=f"default: ${ENV} or {DEFAULT_URL}")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get(ENV) or DEFAULT_URL
    if urlparse(url).scheme not in ("http", "https") or not urlparse(url).hostname:
        raise ConfigError(f"{redact(url)!r} is not an http(s) URL")
    if args.timeout <= 0:
        raise ConfigError("--timeout: must be > 0")
    ok, detail = check(url, args.timeout)
    print(redact(f"{url}: {detail}"), file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1
