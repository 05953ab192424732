"""remediator/silence.py, the Alertmanager silences client: the body it sends, and every bad input or
unreachable, dripping Alertmanager a clear error. Against a real Alertmanager: tests/e2e/test_silence.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llm_health.drill.procs import free_port
from llm_health.remediator.silence import (
    SilenceError,
    create_silence,
    expire_silence,
    silence_body,
)


def test_silence_body_is_exact_match_on_backend() -> None:
    now = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
    body = silence_body("gpu-a", 15, "restart by llm-health", "llm-health", now)
    assert body["matchers"] == [{"name": "backend", "value": "gpu-a", "isRegex": False, "isEqual": True}]
    assert body["startsAt"] == "2026-11-30T03:00:00.000000Z"
    assert body["endsAt"] == "2026-11-30T03:15:00.000000Z"


@pytest.mark.parametrize(
    ("backend", "minutes", "comment", "created_by", "match"),
    [
        ('gpu-a", x="', 5, "c", "me", "backend name"),
        ("gpu.*", 5, "c", "me", "backend name"),
        ("gpu-a", 0, "c", "me", "length"),
        ("gpu-a", True, "c", "me", "length"),
        ("gpu-a", 5, " ", "me", "comment"),
        ("gpu-a", 5, "c", "", "created_by"),
    ],
)
def test_bad_input_is_refused_before_any_request(backend, minutes, comment, created_by, match) -> None:
    # port 9 on loopback: if a request were sent it would fail differently
    with pytest.raises(SilenceError, match=match):
        create_silence("http://127.0.0.1:9", backend, minutes, comment, created_by)


def test_bad_id_and_url_refused() -> None:
    with pytest.raises(SilenceError, match="silence id"):
        expire_silence("http://127.0.0.1:9", "../status")
    with pytest.raises(SilenceError, match="http"):
        expire_silence("ftp://x", "abc")


def test_unreachable_alertmanager_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SilenceError, match="cannot create silence for gpu-a"):
        create_silence(url, "gpu-a", 5, "c", "me", timeout=2)
    with pytest.raises(SilenceError, match="cannot expire silence"):
        expire_silence(url, "abc", timeout=2)


def test_an_alertmanager_that_drips_its_answer_costs_at_most_the_timeout() -> None:
    """Silences are created mid-restart: a wedged proxy in front of Alertmanager must not hold it."""
    import time

    from llm_health.drill.hostile import DripServer

    d = DripServer(ports=1, mode="headers", every=0.2)
    try:
        started = time.monotonic()
        with pytest.raises(SilenceError, match="timeout"):
            create_silence(d.urls[0], "gpu-a", 5, "c", "me", timeout=1.0)
        assert time.monotonic() - started < 3.0
    finally:
        d.stop()
