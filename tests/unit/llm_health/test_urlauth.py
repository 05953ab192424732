"""Credentials in a URL (`http://user:password@host`) go as HTTP Basic auth, never into the host name.

urllib hands `user:password@host` to the resolver as a host name: the password left in a DNS query and
the request never arrived. Real HTTP servers on 127.0.0.1 that require Basic auth; the resolver is
guarded in-process, so no name but 127.0.0.1 is ever looked up (the unfixed code fails here, it never
sends the query out).
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from llm_health import healthcheck
from llm_health.discovery import fetch_targets
from llm_health.httpserver import QuietHandler
from llm_health.urlauth import split_credentials
from tests.support.loopback import Loopback

USER, PASSWORD = "prom", "p@ss:w/rd"
QUOTED = "p%40ss%3Aw%2Frd"                       # as it is written in a URL
ANSWER = {"status": "success", "data": {"activeTargets": [{"labels": {"job": "vllm"}}]}}


class NeedsBasicAuth(QuietHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        auth = self.headers.get("Authorization", "")
        NeedsBasicAuth.seen.append(auth)
        good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        body = json.dumps(ANSWER).encode() if auth == good else b"unauthorized"
        self.reply(200 if auth == good else 401, body)



@pytest.fixture
def server() -> Iterator[Loopback]:
    NeedsBasicAuth.seen = []
    loop = Loopback(NeedsBasicAuth)
    try:
        yield loop
    finally:
        loop.stop()


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Host names looked up; anything but 127.0.0.1 is refused before it reaches a resolver."""
    names: list[str] = []
    real = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(str(host))
        if host != "127.0.0.1":
            raise socket.gaierror(socket.EAI_NONAME, f"test: refused to look up {host!r}")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    return names


def test_split_credentials() -> None:
    assert split_credentials("http://127.0.0.1:9090/x") == ("http://127.0.0.1:9090/x", {})
    assert split_credentials("http://h/a@b") == ("http://h/a@b", {})            # an @ in the path is no user
    url, auth = split_credentials(f"https://{USER}:{QUOTED}@[::1]:9090/prefix")
    assert url == "https://[::1]:9090/prefix"
    assert base64.b64decode(auth["Authorization"].removeprefix("Basic ")).decode() == f"{USER}:{PASSWORD}"
    url, auth = split_credentials("http://token@h:1")
    assert url == "http://h:1" and base64.b64decode(auth["Authorization"][6:]) == b"token:"


def test_discovery_sends_url_credentials_as_basic_auth(server: Loopback, resolved: list[str]) -> None:
    targets = fetch_targets(f"http://{USER}:{QUOTED}@127.0.0.1:{server.port}", timeout=10)
    assert targets == ANSWER["data"]["activeTargets"]
    assert set(resolved) <= {"127.0.0.1"}       # an IP literal needs no lookup; nothing else was looked up


def test_healthcheck_sends_url_credentials_as_basic_auth(server: Loopback, resolved: list[str]) -> None:
    assert healthcheck.check(f"http://{USER}:{QUOTED}@127.0.0.1:{server.port}/ok", timeout=10) == (True, "HTTP 200")
    assert healthcheck.check(f"http://{USER}:wrong@127.0.0.1:{server.port}/ok", timeout=10) == (False, "HTTP 401")
    assert healthcheck.check(f"{server.url}/ok", timeout=10) == (False, "HTTP 401")  # none given: none sent
    assert set(resolved) <= {"127.0.0.1"} and NeedsBasicAuth.seen[2] == ""   # an IP literal needs no lookup
