"""The jsonnet mixin (mixin/mixin.libsonnet) is a fresh generation and, evaluated by the jsonnet package,
equals `llm-health rules render` and `llm-health dashboards render` with the same settings: the
defaults, `_config` overrides, and a mixin generated with another shape (group labels)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import _jsonnet
import pytest
import yaml

from llm_health.cli import main
from llm_health.render import dashboards, mixin
from llm_health.render.rules import RuleSettings, render
from tests.support.paths import REPO

MIXIN_DIR = REPO / "mixin"


def evaluate(folder: Path, overrides: str = "{}") -> dict[str, Any]:
    snippet = (f"local m = (import '{mixin.MIXIN_FILE}') + {overrides};\n"
               "{rules: m.prometheusRules, alerts: m.prometheusAlerts, dashboards: m.grafanaDashboards,"
               " config: m._config}")
    return json.loads(_jsonnet.evaluate_snippet("test.jsonnet", snippet, jpathdir=[str(folder)]))


def expected(settings: RuleSettings) -> dict[str, Any]:
    rules = {name: yaml.safe_load(text) for name, text in render(settings).items()}
    return {
        "rules": {"groups": rules[mixin.RECORDS_FILE]["groups"]},
        "alerts": {"groups": [g for name, doc in rules.items() if name != mixin.RECORDS_FILE for g in doc["groups"]]},
        "dashboards": {name: json.loads(text) for name, text in dashboards.render(settings).items()},
    }


def same(got: dict[str, Any], settings: RuleSettings) -> None:
    want = expected(settings)
    for part in ("rules", "alerts", "dashboards"):
        assert got[part] == want[part], part


@pytest.fixture(scope="module")
def fresh() -> str:
    return mixin.build()


def test_the_committed_mixin_is_a_fresh_generation(fresh: str) -> None:
    assert (MIXIN_DIR / mixin.MIXIN_FILE).read_text() == fresh, (
        "stale: llm-health rules render --format jsonnet --out mixin")
    assert json.loads((MIXIN_DIR / mixin.JSONNETFILE).read_text()) == json.loads(mixin.JSONNETFILE_TEXT)


def test_evaluated_it_equals_the_default_rendering() -> None:
    got = evaluate(MIXIN_DIR)
    same(got, RuleSettings())
    assert [g["name"] for g in got["rules"]["groups"]] == ["llm-health.records"]
    assert [g["name"] for g in got["alerts"]["groups"]] == ["llm-health.restart", "llm-health.alerts", "llm-health.self"]
    assert set(got["dashboards"]) == {p.name for p in (REPO / "dashboards").glob("*.json")}


def test_config_overrides_equal_the_same_flags() -> None:
    overrides = ("{_config+:: {vllmSelector: 'job=\"vllm-prod\", team=\"ml\"', sglangSelector: 'job=\"sgl\"',"
                 " runbookBaseUrl: 'https://ops.example.com/llm/runbooks', minBackendsUp: 2, downFor: '7m',"
                 " errorRateHandlers: '/v1/chat/completions', exporterSelector: 'job=\"exp\"', rateWindow: '3m'}}")
    got = evaluate(MIXIN_DIR, overrides)
    settings = RuleSettings(vllm_selector='job="vllm-prod", team="ml"', sglang_selector='job="sgl"',
                            runbook_url="https://ops.example.com/llm/runbooks", min_backends_up=2, down_for="7m",
                            error_rate_handlers="/v1/chat/completions", exporter_selector='job="exp"',
                            rate_window="3m")
    same(got, settings)
    assert got != evaluate(MIXIN_DIR)  # the keys change the output (the comparison is not vacuous)


def test_settings_that_shape_the_output_are_fixed_when_generating(tmp_path: Path) -> None:
    keys = {k.field for k in mixin.knobs_for(RuleSettings())}
    assert {"vllm_selector", "runbook_url", "down_for", "min_backends_up", "rate_window"} <= keys
    # computed from (the stall window is also written in seconds), or shaping: never a _config key
    assert not keys & {"stall_window", "scrape_interval", "kv_threshold", "group_labels",
                       "exporter", "watchdog", "keep_firing_for", "severity", "extra_labels"}
    assert not mixin._textual(RuleSettings(), [mixin.Knob("stall_window", "stallWindow", "96100s", "98100s")])
    assert "//   stall-window: 2m" in (MIXIN_DIR / mixin.MIXIN_FILE).read_text()
    settings = replace(RuleSettings(), group_labels=("cluster", "namespace"), watchdog=True,
                       runbook_url="https://ops.example.com/rb")
    assert main(["rules", "render", "--format", "jsonnet", "--out", str(tmp_path), "--group-labels",
                 "cluster,namespace", "--watchdog", "--runbook-base-url", "https://ops.example.com/rb"]) == 0
    text = (tmp_path / mixin.MIXIN_FILE).read_text()
    assert "//   group-labels: cluster,namespace" in text and "//   watchdog: on" in text
    got = evaluate(tmp_path)
    same(got, settings)
    assert got["config"]["runbookBaseUrl"] == "https://ops.example.com/rb"
    assert (tmp_path / mixin.JSONNETFILE).is_file()
