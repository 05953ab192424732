"""Every security check of the HTTP side (remediator/web/guard.py): no token only on loopback and when
told so, and cross-site requests (text/plain bodies, a foreign Origin, a rebound Host) refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.config import ConfigError, parse_config
from llm_health.remediator.app import create_app
from tests.support.alerts import alert, payload
from tests.support.remediator import AUTH, World, four_backends

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = four_backends(tmp_path)
    yield world
    world.close()


def test_f4_no_token_refused_unless_insecure_and_loopback(tmp_path: Path) -> None:
    base = {"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:1"}]}

    def cfg(**r: object) -> object:
        return parse_config({**base, "remediator": {"state": "s.db", **r}}, source=str(tmp_path / "c.yml"))

    with pytest.raises(ConfigError, match="token"):
        create_app(cfg(), with_authority=False)
    with pytest.raises(ConfigError, match="loopback"):
        create_app(cfg(insecure_no_auth=True, listen="0.0.0.0:9411"), with_authority=False)
    app = create_app(cfg(insecure_no_auth=True, listen="127.0.0.1:9411"), with_authority=False)
    client = app.test_client()
    assert client.post("/api/busy", json={"backend": "gpu-a", "owner": "me"}).status_code == 201
    # a cross-site page: text/plain body, or a foreign Origin, or a rebound Host name
    plain = client.post("/api/busy", data=json.dumps({"backend": "gpu-a", "owner": "evil", "ttl_seconds": 600000}),
                        content_type="text/plain")
    assert plain.status_code == 415
    assert client.post("/api/breaker/reset", headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.post("/api/backends/gpu-a/ack", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert client.post("/api/breaker/reset", headers={"Host": "evil.example:9411"}).status_code == 403
    assert client.post("/api/breaker/reset", data="", content_type="text/plain").status_code == 415
    assert client.post("/api/breaker/reset").status_code == 200       # curl-like, no body: fine


def test_f4_origin_checked_with_a_token_too(w: World) -> None:
    r = w.client.post("/api/breaker/reset", headers={**AUTH, "Origin": "http://evil.example"})
    assert r.status_code == 403
    r = w.client.post("/webhook", data=json.dumps(payload(alert())), content_type="text/plain", headers=AUTH)
    assert r.status_code == 415
