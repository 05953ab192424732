"""`llm-health healthcheck`, the image's HEALTHCHECK: 2xx is healthy, anything else (error status,
refused connection, timeout) is not, and it never imports the web stack."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from llm_health.drill.procs import free_port
from llm_health.httpserver import QuietHandler
from tests.support.loopback import Loopback


class Handler(QuietHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        status = {"/ok": 200, "/broken": 500, "/gone": 404}.get(self.path, 404)
        if self.path == "/slow":
            self.server.release.wait(10)  # type: ignore[attr-defined]
            status = 200
        self.reply(status)



@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    loop = Loopback(Handler)
    loop.httpd.release = threading.Event()  # type: ignore[attr-defined]
    try:
        yield loop.url
    finally:
        loop.httpd.release.set()  # type: ignore[attr-defined]
        loop.stop()


def healthcheck(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llm_health.cli", "healthcheck", *args],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(("path", "code"), [("/ok", 0), ("/broken", 1), ("/gone", 1)])
def test_status_decides(server: str, path: str, code: int) -> None:
    assert healthcheck(server + path).returncode == code


def test_refused_and_timeout_are_unhealthy(server: str) -> None:
    assert healthcheck(f"http://127.0.0.1:{free_port()}/healthz").returncode == 1
    result = healthcheck(server + "/slow", "--timeout", "0.3")
    assert result.returncode == 1 and "timed out" in result.stderr


def test_url_from_the_environment(server: str) -> None:
    import os

    assert healthcheck(env={**os.environ, "LLM_HEALTH_HEALTHCHECK_URL": server + "/ok"}).returncode == 0
    assert healthcheck(env={**os.environ, "LLM_HEALTH_HEALTHCHECK_URL": server + "/broken"}).returncode == 1


def test_bad_url_is_a_usage_error() -> None:
    assert healthcheck("file:///etc/passwd").returncode == 2
