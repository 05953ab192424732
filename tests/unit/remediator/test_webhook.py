"""POST /webhook (remediator/web/webhook.py and the guard's body checks): the token, bodies refused
with a reason and without any effect, the body limit for chunked bodies, unknown keys; whatever
was accepted renders in every view.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, TOKEN, World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": f"Basic {TOKEN}"}, 401), (AUTH, 202)],
)
def test_webhook_requires_the_token(w: World, headers: dict[str, str], status: int) -> None:
    assert w.post(payload(alert()), headers=headers).status_code == status
    assert (w.incident() is not None) == (status == 202)


def test_bad_bodies_are_refused_and_change_nothing(w: World) -> None:
    bad = [
        (b"{not json", 400),
        (b"", 400),
        (b"[]", 400),
        (b'{"alerts": "x"}', 400),
        (b'{"version": "3", "alerts": []}', 400),
        (b'{"alerts": [{"status": "firing", "labels": {"a": 1}}]}', 400),
        (b'{"alerts": [{"status": "exploded", "labels": {}}]}', 400),
        # not JSON (RFC 8259), though Python's json module reads them: NaN, Infinity, a key twice in one object
        (b'{"alerts": [], "x": NaN}', 400),
        (b'{"alerts": [], "x": -Infinity}', 400),
        (b'{"alerts": [{"status": "firing", "labels": {"backend": "gpu-x", "backend": "gpu-a", '
         b'"remediation": "restart"}}]}', 400),
        # a NUL in a label or a field: PostgreSQL's text cannot hold it (it answered 500 there, 202 on SQLite)
        (json.dumps(payload(alert(alertname="Stall\u0000x"))).encode(), 400),
        (json.dumps(payload({**alert(), "fingerprint": "ab\u0000cd"})).encode(), 400),
        (json.dumps(payload({**alert(), "startsAt": "2026-11-30T00:00:00Z\u0000"})).encode(), 400),
        (b'{"alerts": [{"status": "firing", "labels": {"backend": "gpu-a"}}]}' + b" " * 2_000_000, 413),
    ]
    for body, status in bad:
        r = w.client.post("/webhook", data=body, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == status, body[:60]
        assert r.get_json()["error"]
    w.run()
    assert [e for e in w.store.events(limit=10) if e.kind != "lease_acquired"] == []
    assert w.store.active_incidents() == [] and w.calls == [] and w.store.counters("alerts_received") == {}


def test_an_alert_with_an_instance_that_is_no_url_is_ignored_and_the_others_are_recorded(w: World) -> None:
    """A non-restart alert grouped with a restart alert, its `instance` an unparsable URL: the whole
    notification was answered 500 (urlparse's ValueError), and Alertmanager retried it forever, so the
    restart alert beside it was never recorded."""
    for instance in ("http://x:abc", "http://[::1", "http://h:99999"):
        r = w.post(payload(alert(None, alertname="NodeDown", restart=False, instance=instance), alert()))
        assert r.status_code == 202, (instance, r.get_json())
    assert w.incident() is not None
    assert len(w.store.events(kind="ignored")) == 3


def chunked_post(w: World, body: bytes) -> Any:
    """A chunked request as gunicorn hands it over: no Content-Length, a terminated input stream."""
    return w.client.post("/webhook", input_stream=io.BytesIO(body), environ_overrides={"wsgi.input_terminated": True},
                         headers={**AUTH, "Content-Type": "application/json", "Transfer-Encoding": "chunked"})


def test_chunked_body_over_the_limit_gets_413(w: World) -> None:
    """Issue 18: a 2 MB chunked body of spaces was read as the first max_body_bytes of it: 400 "empty body"."""
    limit = 1_048_576
    body = json.dumps(payload(alert())).encode()
    for size, status in ((2_000_000, 413), (limit + 1, 413), (limit, 202)):
        r = chunked_post(w, body + b" " * (size - len(body)))
        assert r.status_code == status, (size, r.get_json())
        if status == 413:
            assert r.get_json()["error"] == f"body too large: more than {limit} bytes"
    assert len(w.store.events(kind="received")) == 1                   # the one within the limit


def test_unknown_keys_are_ignored(w: World) -> None:
    body = payload(alert(), notification_reason="new", routeLabels={"x": "y"})
    body["alerts"][0]["somethingNew"] = 1
    assert w.post(body).status_code == 202


def test_f6_f10_fuzzed_webhook_never_breaks_a_view(w: World) -> None:
    cyrillic = "Ж" * 200
    long_labels = {f"label{i}": cyrillic for i in range(7)}
    bodies: list[tuple[object, int]] = [
        (payload(alert(**long_labels)), 202),                                        # finding 6
        (payload(alert(backend="нет", **long_labels)), 202),
        (payload(alert(alertname="x" * 1024, **{f"k{i}": "ü" * 1024 for i in range(20)})), 202),
        (payload(alert(summary="emoji 🔥 " * 100)), 202),
    ]
    for body, code in bodies:
        assert w.post(body).status_code == code
    raw_cases = [
        "[" * 100_000 + "]" * 100_000,                                                 # deeply nested
        json.dumps({"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
        '{"version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {"backend": "\\ud800"}}]}',
        '{"version": "4", "alerts": [{"status": "firing", "labels": {"\\udfff": "x"}}]}',
        "\xff\xfe not utf-8",
        "null", "[]", '"string"', "1e999999", '{"alerts": {}}', '{"version": 4}',
    ]
    for raw in raw_cases:
        r = w.client.post("/webhook", data=raw.encode("utf-8", "surrogateescape"), headers=AUTH,
                          content_type="application/json")
        assert r.status_code == 400, (raw[:60], r.status_code, r.get_data(as_text=True)[:200])
    w.run(3)
    for path in ("/", "/api/events?limit=500", "/api/backends", "/metrics"):
        r = w.client.get(path)
        assert r.status_code == 200, path
    for e in w.client.get("/api/events?limit=500").get_json()["events"]:
        assert isinstance(e["detail"], dict)
