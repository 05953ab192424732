"""The readiness sidecar's pollers and its /ready (remediator/sidecar/watch.py, server.py): each poll
with its deadline, /ready from the latest facts only, one log line per change, the flags checked."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from llm_health.config import ConfigError
from llm_health.http_client import FailureKind, HttpFailure, Response
from llm_health.remediator.sidecar import cli
from llm_health.remediator.sidecar.server import ReadinessServer
from llm_health.remediator.sidecar.watch import Settings, Watch
from tests.support.fakes import FakeClock

SETTINGS = Settings("http://remediator:9411/", "vllm-0", "http://127.0.0.1:8000", interval=2, timeout=1.5,
                    engine_timeout=40, fallback_after=30)


class FakeNet:
    """Answers fetch() from `answers[url]`: a Response, or an HttpFailure to raise; records each call."""

    def __init__(self) -> None:
        self.answers: dict[str, Response | HttpFailure] = {}
        self.calls: list[tuple[str, float]] = []

    def __call__(self, method: str, url: str, *, timeout: float, **_: Any) -> Response:
        self.calls.append((url, timeout))
        got = self.answers[url]
        if isinstance(got, HttpFailure):
            raise got
        return got

    def remediator(self, status: int = 200, **fields: Any) -> None:
        body = {"backend": "vllm-0", "ready": True, "lifecycle": "ready", "admin": "in_service",
                "reason": "ready and in service", **fields}
        self.answers[SETTINGS.readiness_url] = Response(status, json.dumps(body).encode(), 0.01)

    def engine(self, status: int) -> None:
        self.answers[SETTINGS.health_url] = Response(status, b"", 0.01)


@pytest.fixture
def net() -> FakeNet:
    return FakeNet()


def test_each_poll_asks_once_with_its_own_deadline(net: FakeNet) -> None:
    net.remediator()
    net.engine(200)
    w = Watch(SETTINGS, FakeClock(), net)
    w.poll_remediator()
    w.poll_engine()
    assert net.calls == [("http://remediator:9411/api/backends/vllm-0/readiness", 1.5),
                         ("http://127.0.0.1:8000/health", 40)]
    assert w.decision().ready
    assert len(net.calls) == 2   # /ready asks no one


def test_ready_follows_the_remediator_then_the_engine_after_fallback_after(net: FakeNet) -> None:
    clock = FakeClock()
    w = Watch(SETTINGS, clock, net)
    net.engine(200)
    w.poll_engine()
    assert not w.decision().ready                              # no answer yet
    net.remediator(ready=False, admin="drained", reason="drained by ops")
    w.poll_remediator()
    assert not w.decision().ready and "drained by ops" in w.decision().reason
    net.remediator()
    w.poll_remediator()
    assert w.decision().ready
    net.answers[SETTINGS.readiness_url] = HttpFailure(FailureKind.REFUSED, "connection refused")
    clock.advance(29)
    w.poll_remediator()
    d = w.decision()
    assert d.ready and d.source == "remediator" and "latest poll failed" in d.reason
    clock.advance(2)                                           # the answer is 31 s old: the engine decides
    d = w.decision()
    assert d.ready and d.source == "engine" and "refused: connection refused" in d.reason
    net.engine(503)
    w.poll_engine()
    assert not w.decision().ready and "HTTP 503" in w.decision().reason
    net.answers[SETTINGS.health_url] = HttpFailure(FailureKind.TIMEOUT, "the exchange's deadline passed")
    w.poll_engine()
    assert not w.decision().ready and "timeout" in w.decision().reason
    net.remediator()
    w.poll_remediator()                                        # back: the remediator decides again
    assert w.decision().ready and w.decision().source == "remediator"


def test_garbage_and_an_unknown_name_are_no_answer(net: FakeNet) -> None:
    clock = FakeClock()
    w = Watch(SETTINGS, clock, net)
    net.engine(200)
    w.poll_engine()
    net.remediator(status=404)
    w.poll_remediator()
    assert "does not know backend 'vllm-0'" in w.decision().reason
    net.answers[SETTINGS.readiness_url] = Response(200, b"<html>", 0.01)
    clock.advance(31)
    w.poll_remediator()
    d = w.decision()
    assert d.ready and d.source == "engine" and "not JSON" in d.reason


def test_one_log_line_per_change(net: FakeNet, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    w = Watch(SETTINGS, clock, net)
    net.remediator()
    net.engine(200)
    with caplog.at_level(logging.INFO, logger="llm_health.readiness"):
        for _ in range(3):
            w.poll_remediator()
            w.poll_engine()
            w.decision()
        net.answers[SETTINGS.readiness_url] = HttpFailure(FailureKind.TIMEOUT, "deadline")
        clock.advance(31)
        for _ in range(3):
            w.poll_remediator()
            w.decision()
    lines = [r.getMessage() for r in caplog.records if r.name == "llm_health.readiness"]
    assert len(lines) == 2, lines           # ready (the remediator's word), ready (the fallback's)
    assert lines[0].startswith("backend vllm-0: ready: remediator:")
    assert lines[1].startswith("backend vllm-0: ready: fallback:")


@pytest.fixture
def served(net: FakeNet) -> Iterator[tuple[str, FakeNet, Watch]]:
    w = Watch(SETTINGS, FakeClock(), net)
    server = ReadinessServer("127.0.0.1", 0, w).start()
    yield f"http://127.0.0.1:{server.port}", net, w
    server.shutdown()


def test_the_server_answers_ready_healthz_and_nothing_else(served: tuple[str, FakeNet, Watch]) -> None:
    url, net, w = served
    r = requests.get(url + "/ready", timeout=5)
    assert r.status_code == 503 and r.text.startswith("not ready: waiting for the remediator's first answer")
    assert requests.get(url + "/healthz", timeout=5).status_code == 200
    net.remediator()
    w.poll_remediator()
    r = requests.get(url + "/ready", timeout=5)
    assert r.status_code == 200 and r.text == "ready: remediator: ready and in service (lifecycle ready, " \
        "admin in_service)\n"
    head = requests.head(url + "/ready", timeout=5)
    assert head.status_code == 200 and head.text == ""
    assert requests.get(url + "/metrics", timeout=5).status_code == 404


def args(**overrides: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    ns = parser.parse_args(["--remediator", "http://remediator:9411", "--backend", "vllm-0"])
    for k, v in overrides.items():
        setattr(ns, k, v)
    return ns


def test_the_flags_are_checked() -> None:
    assert cli.settings_of(args()) == Settings("http://remediator:9411", "vllm-0", "http://127.0.0.1:8000")
    for bad, match in (({"backend": ""}, "POD_NAME"), ({"backend": "a b"}, "not a backend name"),
                       ({"interval": 0}, "--interval"), ({"engine_timeout": -1}, "--engine-timeout"),
                       ({"fallback_after": 3}, "must exceed"), ({"remediator": "remediator:9411"}, "http"),
                       ({"engine_url": "ftp://x"}, "--engine-url")):
        with pytest.raises(ConfigError, match=match):
            cli.settings_of(args(**bad))
    assert cli.parse_listen("0.0.0.0:8081") == ("0.0.0.0", 8081)
    assert cli.parse_listen("[::]:8081") == ("::", 8081)
    with pytest.raises(ConfigError):
        cli.parse_listen("8081")


def test_the_backend_defaults_to_the_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "vllm-3")
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    assert parser.parse_args(["--remediator", "http://r:9411"]).backend == "vllm-3"
