"""Starting a rollout (remediator/rollout/start.py): bad input is a clear 400 that changes nothing; a rollout
that cannot run here is a 409 with the reason, audited; placeholders come from the configuration only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llm_health.config import Backend, parse_config
from llm_health.remediator.rollout.start import RequestError, fill, parse_request
from tests.support.remediator import AUTH, World, fleet

pytestmark = pytest.mark.usefixtures("store_kind")   # every test on SQLite and on PostgreSQL

CONFIG = parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:1", "restart": ["r"]}],
                       "remediator": {"rollout": {"soak": 120, "min_requests": 7}}})
GOOD = {"command": ["deploy", "{backend}"], "by": "ops", "reason": "upgrade"}


@pytest.mark.parametrize("change, message", [
    ({"command": []}, "command must be a non-empty list"),
    ({"command": "deploy --all"}, "command must be a non-empty list"),
    ({"command": ["deploy", ""]}, "command must be a non-empty list"),
    ({"command": ["deploy", "{pod}"]}, r"unknown placeholder \{pod\}"),
    ({"by": ""}, "by must be a non-empty string"),
    ({"reason": None}, "reason must be a non-empty string"),
    ({"soak": 0}, "soak must be"), ({"soak": True}, "soak must be"), ({"soak": float("inf")}, "soak must be"),
    ({"canary": 0}, "canary must be a whole number >= 1"),
    ({"per_host": 2}, "only 1 is supported"),
    ({"backends": ["a", "a"]}, "appears twice"),
    ({"gate": {"ttft_p95_ratio": 0.5}}, "ttft_p95_ratio"),
    ({"gate": {"nope": 1}}, "unknown gate setting"),
    ({"pass_without_traffic": "yes"}, "true or false"),
    ({"surge": 1}, "unknown field"),
])
def test_bad_requests_are_refused_with_a_clear_error(change: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_request({**GOOD, **change}, CONFIG)


def test_defaults_come_from_the_settings_and_flags_override_them() -> None:
    req = parse_request(GOOD, CONFIG)
    assert req.soak == 120 and req.canary == 1 and req.bounds.min_requests == 7 and not req.bounds.pass_without_traffic
    req = parse_request({**GOOD, "soak": 30, "gate": {"min_requests": 2}, "pass_without_traffic": True}, CONFIG)
    assert req.soak == 30 and req.bounds.min_requests == 2 and req.bounds.pass_without_traffic


def test_placeholders_are_filled_from_the_configuration_only() -> None:
    b = Backend(name="gpu-a", url="http://10.0.0.5:8000", host="node-1", model="llama")
    assert fill(["x", "--name={backend}", "{host}:{url}", "{model}", "{backend}{backend}"], b) == (
        "x", "--name=gpu-a", "node-1:http://10.0.0.5:8000", "llama", "gpu-agpu-a")


def post(w: World, **body: Any) -> Any:
    return w.client.post("/api/rollouts", json={**GOOD, **body}, headers=AUTH)


def test_a_rollout_that_cannot_run_here_is_refused_audited_and_changes_nothing(tmp_path: Path) -> None:
    for sub in ("without", "with", "small"):
        (tmp_path / sub).mkdir()
    without = fleet(tmp_path / "without", ("a", "b", "c"), min_ready=1)
    assert post(without).get_json()["refusal"] == "no_prometheus"
    w = fleet(tmp_path / "with", ("a", "b", "c"), min_ready=1, rollout={"prometheus_url": "http://127.0.0.1:9"})
    assert post(w, backends=["zz"]).get_json()["refusal"] == "member"
    assert post(w, canary=4).get_json()["refusal"] == "member"
    assert w.client.post("/api/rollouts", json=GOOD).status_code == 401                 # the token
    assert w.client.post("/api/rollouts", data="{", headers={**AUTH, "Content-Type": "application/json"}).status_code == 400
    assert post(w, command=[]).status_code == 400
    assert w.store.rollouts() == [] and len(w.events("", "rollout_refused")) == 2
    assert post(w).status_code == 201
    again = post(w)
    assert again.status_code == 409 and again.get_json()["refusal"] == "rollout_active"
    assert len(w.store.rollouts()) == 1
    small = fleet(tmp_path / "small", ("a", "b"), min_ready=2, rollout={"prometheus_url": "http://127.0.0.1:9"})
    assert post(small).get_json()["refusal"] == "min_ready"


def test_a_placeholder_without_a_value_is_refused_even_inside_an_argument(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    w = fleet(tmp_path / "w", ("a", "b", "c"), min_ready=1, rollout={"prometheus_url": "http://127.0.0.1:9"})
    r = post(w, command=["deploy", "--host={host}"])                       # no host configured
    assert r.status_code == 409 and "{host}" in r.get_json()["error"]
    assert post(w, command=["deploy", "--name={backend}"]).status_code == 201
