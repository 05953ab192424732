"""Alertmanager's webhook payload (remediator/alert.py): a real 0.25 payload, dedup keys, bad payloads
refused with a reason, fingerprints derived when missing.
"""

from __future__ import annotations

import pytest

from llm_health.remediator.alert import PayloadError, parse_notification
from tests.support.alerts import alert, payload

# a real Alertmanager 0.25 payload (docs: reference facts §1.1)
AM_025 = {
    "receiver": "hook", "status": "firing",
    "alerts": [{
        "status": "firing",
        "labels": {"alertname": "AppStuck", "cluster": "e2e", "instance": "127.0.0.1:18000", "job": "app",
                   "severity": "critical"},
        "annotations": {"summary": "stuck on 127.0.0.1:18000"},
        "startsAt": "2026-11-29T18:17:48.51Z", "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://vm:19090/graph?g0.expr=app_stuck+%3D%3D+1&g0.tab=1",
        "fingerprint": "ab26b92c61261eb6",
    }],
    "groupLabels": {"alertname": "AppStuck"}, "commonLabels": {}, "commonAnnotations": {},
    "externalURL": "http://vm:19093", "version": "4", "groupKey": "{}:{alertname=\"AppStuck\"}",
    "truncatedAlerts": 0,
}


def test_parses_a_real_alertmanager_payload() -> None:
    n = parse_notification(AM_025)
    assert n.status == "firing" and n.group_key == '{}:{alertname="AppStuck"}'
    (a,) = n.alerts
    assert a.name == "AppStuck" and a.fingerprint == "ab26b92c61261eb6" and not a.wants_restart
    assert a.labels["instance"] == "127.0.0.1:18000"


def test_dedup_key_ignores_external_url_and_order_but_not_status_or_firing() -> None:
    a1, a2 = alert(), alert(alertname="LLMBackendDown")
    key = parse_notification(payload(a1, a2)).dedup_key()
    assert parse_notification(payload(a2, a1, external="http://am-1:9093")).dedup_key() == key
    assert parse_notification(payload(a1, a2, receiver="other")).dedup_key() == key
    assert parse_notification(payload(a1)).dedup_key() != key
    refired = alert(starts_at="2026-11-30T01:00:00Z")
    assert parse_notification(payload(refired, a2)).dedup_key() != key
    resolved = payload(alert(status="resolved"), alert(alertname="LLMBackendDown", status="resolved"))
    assert parse_notification(resolved).dedup_key() != key


@pytest.mark.parametrize("bad", [
    None, [], "x", {"alerts": None}, {"alerts": [1]}, {"alerts": [{"status": "firing", "labels": []}]},
    {"alerts": [{"status": "firing", "labels": {"a": "b" * 5000}}]},
    {"alerts": [{"status": "firing", "labels": {}, "fingerprint": 5}]},
    {"version": 4, "alerts": []},
    {"alerts": [{"status": "firing", "labels": {}}] * 1001},
])
def test_bad_payloads_say_why(bad: object) -> None:
    with pytest.raises(PayloadError) as exc:
        parse_notification(bad)
    assert str(exc.value)


def test_missing_fingerprint_is_derived_from_labels() -> None:
    body = payload(alert())
    del body["alerts"][0]["fingerprint"]
    one = parse_notification(body).alerts[0].fingerprint
    assert one and one == parse_notification(body).alerts[0].fingerprint
