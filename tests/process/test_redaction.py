"""Credentials in URLs (`http://user:secret@host`) are shown as `***@` everywhere: the exporter's
unauthenticated /verdicts and /metrics, its log (verdict changes, discovery failures, the start line),
`llm-health check` and `healthcheck` output, command-line errors, the remediator's API, status page
and log. One helper for all of them, llm_health.redact (the remediator's status page had it first).

Real processes on loopback; every URL with credentials points at 127.0.0.1 (credentials go as Basic
auth, never into a host name: llm_health.urlauth), at ports where nothing listens.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, wait_until
from llm_health.redact import RedactingFormatter, configure_logging, redact

SECRET = "hunter2-s3cret"


def with_secret(port: int, path: str = "") -> str:
    return f"http://admin:{SECRET}@127.0.0.1:{port}{path}"


def test_redact_strings_and_documents() -> None:
    assert redact(f"could not reach {with_secret(1, '/x')}: refused") == \
        "could not reach http://***@127.0.0.1:1/x: refused"
    assert redact({"url": with_secret(2), "n": 3, "list": [with_secret(4), None], "t": ("https://u@h",)}) == \
        {"url": "http://***@127.0.0.1:2", "n": 3, "list": ["http://***@127.0.0.1:4", None], "t": ["https://***@h"]}
    assert redact("http://127.0.0.1:9/a@b, mail a@b.c") == "http://127.0.0.1:9/a@b, mail a@b.c"  # no userinfo


def test_log_lines_and_tracebacks_are_redacted() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(RedactingFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test_redaction")
    logger.addHandler(handler)
    try:
        logger.warning("discovery from %s failed", with_secret(9090))
        try:
            raise OSError(f"cannot reach {with_secret(9093, '/api/v2/silences')}")
        except OSError:
            logger.exception("silencing failed")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert SECRET not in text
    assert "discovery from http://***@127.0.0.1:9090 failed" in text
    assert "OSError: cannot reach http://***@127.0.0.1:9093/api/v2/silences" in text       # the traceback


def test_configure_logging_installs_the_redacting_formatter() -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers = []
    try:
        out = io.StringIO()
        configure_logging("%(message)s", stream=out)
        logging.getLogger("test_redaction.root").info("to %s", with_secret(1))
        assert out.getvalue() == "to http://***@127.0.0.1:1\n"
    finally:
        root.handlers, root.level = saved, level


# -- the exporter: /verdicts, /metrics, its log ------------------------------------------------------------
def test_exporter_shows_no_credentials(launch: Callable[..., ManagedProcess]) -> None:
    port = free_port()
    proc = launch(llm_health("exporter", "--listen", f"127.0.0.1:{port}", "--interval", 0.3, "--read-timeout", 0.5,
                             "--backend", f"gpu-a={with_secret(free_port())}",
                             "--proxy", f"lb={with_secret(free_port())}",
                             "--discover-from", with_secret(free_port())), "exporter")
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health")

    def judged() -> dict | None:
        doc = requests.get(base + "/verdicts", timeout=5).json()
        ready = doc["backends"][0]["verdict"] == "down" and doc["discovery"]["errors"] >= 1 and \
            doc["proxies"][0]["up"] is not None
        return doc if ready else None

    doc = wait_until(judged, timeout=30, what="gpu-a down, a failed discovery refresh, the proxy checked")
    verdicts = requests.get(base + "/verdicts", timeout=5).text
    assert SECRET not in verdicts
    assert doc["backends"][0]["url"].startswith("http://***@127.0.0.1:")
    assert doc["proxies"][0]["url"].startswith("http://***@127.0.0.1:")
    metrics = requests.get(base + "/metrics", timeout=5).text
    assert "llm_health_verdict_code" in metrics and SECRET not in metrics
    log = wait_until(lambda: (text := proc.log()) and "discovery from" in text and "-> down" in text and text,
                     timeout=30, what="the start line, a discovery failure and a verdict change in the log")
    assert SECRET not in log, log[-3000:]
    assert "discovery from http://***@127.0.0.1:" in log


# -- check, healthcheck, command-line errors ---------------------------------------------------------------
def test_check_and_healthcheck_output_and_errors_show_no_credentials() -> None:
    runs = [   # argv, exit code, whether the output shows the URL
        (llm_health("check", with_secret(free_port()), "--readings", "1", "--no-probe"), 2, False),
        (llm_health("check", f"ftp://admin:{SECRET}@127.0.0.1:1"), 2, True),                 # a usage error
        (llm_health("healthcheck", with_secret(free_port(), "/healthz"), "--timeout", "5"), 1, True),
        (llm_health("healthcheck", f"file://admin:{SECRET}@127.0.0.1/etc/passwd"), 2, True),
    ]
    for argv, code, url_shown in runs:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        shown = done.stdout + done.stderr
        assert done.returncode == code, (argv, shown)
        assert SECRET not in shown, (argv, shown)
        assert ("***@127.0.0.1" in shown) == url_shown, (argv, shown)


# -- the remediator: API, status page, log ------------------------------------------------------------------
def test_remediator_shows_no_credentials(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0ken\n")
    os.chmod(tmp_path / "token", 0o600)
    config = tmp_path / "llm-health.yml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "gpu-a", "url": with_secret(free_port()), "restart": ["true"]}],
        "discovery": {"prometheus_url": with_secret(free_port()), "refresh": 0.5},
        "remediator": {"state": "state.db", "token_file": "token", "poll_interval": 0.2,
                       "alertmanager_url": with_secret(free_port())},
    }))
    port = free_port()
    proc = ManagedProcess(llm_health("remediator", "--config", config, "--listen", f"127.0.0.1:{port}",
                                     "--workers", 1), name="remediator", log_dir=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        proc.wait_http(base + "/healthz", timeout=30)
        discovery = wait_until(lambda: (d := requests.get(base + "/api/discovery", timeout=5).json())["errors"]
                               and d, timeout=30, what="a failed discovery refresh")
        assert discovery["last_error"]
        for path in ("/api/discovery", "/api/backends", "/"):
            body = requests.get(base + path, timeout=5).text
            assert SECRET not in body, path
        assert "http://***@127.0.0.1:" in requests.get(base + "/api/backends", timeout=5).text
        log = wait_until(lambda: (text := proc.log()) and "discovery from" in text and text, timeout=30,
                         what="a discovery failure in the log")
        assert SECRET not in log, log[-3000:]
        assert "discovery from http://***@127.0.0.1:" in log
    finally:
        proc.stop()
