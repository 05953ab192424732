"""The readiness sidecar's decision (remediator/sidecar/decision.py): the remediator's answer while it is
young enough, then the engine's own /health; never ready before the first answer or fallback."""

from __future__ import annotations

import json

import pytest

from llm_health.remediator.sidecar.decision import Answer, Engine, Source, decide, parse_answer

READY = Answer(True, "ready", "in_service", "ready and in service")
DRAINED = Answer(False, "ready", "drained", "drained by ops@host1: kernel upgrade")
OK = Engine(True, "HTTP 200")
SICK = Engine(False, "timeout: the exchange's deadline passed")


@pytest.mark.parametrize("engine", [None, OK, SICK])
def test_a_young_answer_decides_whatever_the_engine_says(engine: Engine | None) -> None:
    d = decide(READY, 1.0, "", engine, 30)
    assert (d.ready, d.source) == (True, Source.REMEDIATOR)
    assert d.reason == "remediator: ready and in service (lifecycle ready, admin in_service)"
    d = decide(DRAINED, 1.0, "", engine, 30)
    assert (d.ready, d.source) == (False, Source.REMEDIATOR)
    assert d.reason.startswith("remediator: not ready: drained by ops@host1") and "admin drained" in d.reason


def test_a_failed_poll_keeps_the_answer_until_fallback_after() -> None:
    d = decide(READY, 30.0, "the remediator did not answer: refused: connection refused", SICK, 30)
    assert (d.ready, d.source) == (True, Source.REMEDIATOR)
    assert "latest poll failed (the remediator did not answer: refused" in d.reason and "30s old" in d.reason
    d = decide(DRAINED, 29.0, "the remediator answered HTTP 502", OK, 30)
    assert (d.ready, d.source) == (False, Source.REMEDIATOR)   # a drain holds through a short outage


@pytest.mark.parametrize(("answer", "engine", "ready"), [(READY, OK, True), (DRAINED, OK, True),
                                                         (READY, SICK, False), (None, OK, True),
                                                         (READY, None, False)])
def test_past_fallback_after_the_engine_decides(answer: Answer | None, engine: Engine | None, ready: bool) -> None:
    d = decide(answer, 30.5, "the remediator answered HTTP 503", engine, 30)
    assert (d.ready, d.source) == (ready, Source.ENGINE)
    assert d.reason.startswith("fallback: no answer from the remediator for 30s (the remediator answered HTTP 503)")
    assert ("not checked yet" if engine is None else engine.detail) in d.reason


def test_not_ready_until_the_first_answer_or_the_fallback() -> None:
    d = decide(None, 5.0, "", OK, 30)
    assert (d.ready, d.source) == (False, Source.WAITING) and "not asked yet" in d.reason
    d = decide(None, 5.0, "the remediator did not answer: timeout: x", OK, 30)
    assert not d.ready and "timeout: x" in d.reason and "after 30s" in d.reason


def body(**fields: object) -> bytes:
    return json.dumps({"backend": "vllm-0", "ready": True, "lifecycle": "ready", "admin": "in_service",
                       "reason": "ready and in service", **fields}).encode()


def test_parse_answer_takes_only_a_readiness_answer_for_this_backend() -> None:
    assert parse_answer(200, body(), "vllm-0") == READY
    assert parse_answer(200, body(ready=False, lifecycle="draining", reason="draining"), "vllm-0") == Answer(
        False, "draining", "in_service", "draining")
    assert parse_answer(200, body(reason="x" * 1000), "vllm-0").reason == "x" * 300   # type: ignore[union-attr]
    assert parse_answer(404, b'{"error": "unknown backend"}', "vllm-0") == (
        "the remediator does not know backend 'vllm-0' (HTTP 404)")
    assert parse_answer(502, body(), "vllm-0") == "the remediator answered HTTP 502"
    assert parse_answer(200, b"<html>proxy error</html>", "vllm-0") == "the remediator's answer is not JSON"
    for bad in (body(backend="vllm-1"), body(ready="yes"), body(reason=7), b"[]", b'{"ready": true}'):
        assert parse_answer(200, bad, "vllm-0") == "the remediator's answer is not a readiness answer for this backend"
