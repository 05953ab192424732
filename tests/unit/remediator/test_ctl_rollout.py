"""`llm-health ctl rollout` (remediator/ctl_rollout.py): the API body from a YAML plan and the flags, the flags
winning; a bad plan is a clear error before anything is sent."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llm_health.config import ConfigError
from llm_health.remediator import ctl
from llm_health.remediator.ctl_rollout import body_from, summary


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ctl.configure(parser)
    return parser.parse_args(["--remediator", "http://127.0.0.1:9", *argv])


def test_the_command_is_the_rest_of_the_line_and_flags_fill_the_body() -> None:
    args = parse("rollout", "--canary", "2", "--soak", "10m", "--backend", "a", "--backend", "b",
                 "--pass-without-traffic", "--reason", "vLLM 0.9", "--by", "ops", "--command", "deploy", "--all", "{backend}")
    assert body_from(args) == {"command": ["deploy", "--all", "{backend}"], "canary": 2, "soak": 600.0,
                               "backends": ["a", "b"], "pass_without_traffic": True, "reason": "vLLM 0.9", "by": "ops"}


def test_a_plan_gives_the_fields_and_flags_override_it(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yml"
    plan.write_text("command: [deploy, --version, '0.9', '{backend}']\nsoak: 15m\ncanary: 1\nreason: monthly\n"
                    "gate: {min_requests: 20, ttft_p95_ratio: 1.2}\n")
    body = body_from(parse("rollout", "--plan", str(plan), "--canary", "2", "--by", "ops"))
    assert body == {"command": ["deploy", "--version", "0.9", "{backend}"], "soak": 900.0, "canary": 2,
                    "reason": "monthly", "gate": {"min_requests": 20, "ttft_p95_ratio": 1.2}, "by": "ops"}
    plan.write_text("- not a mapping\n")
    with pytest.raises(ConfigError, match="a plan is a mapping"):
        body_from(parse("rollout", "--plan", str(plan)))
    with pytest.raises(ConfigError, match="--soak"):
        body_from(parse("rollout", "--soak", "ten minutes", "--command", "x"))


def test_the_summary_names_every_member_and_its_step() -> None:
    text = summary({"id": 4, "state": "rolling_back", "steps": {"rolled_back": 1, "pending": 1}, "by": "ops",
                    "reason": "r", "soak": 60.0, "created_at": 0, "argv": ["deploy", "{backend}"], "note": "gate failed",
                    "members": [{"backend": "a", "host": "n1", "canary": True, "step": "rolled_back", "incident_id": 3,
                                 "note": "back"}, {"backend": "b", "host": "", "canary": False, "step": "pending",
                                                   "incident_id": None, "note": ""}]})
    assert text.startswith("rollout 4: rolling_back (1 pending, 1 rolled_back)") and "gate failed" in text
    assert "a        n1    yes     rolled_back  3" in text
