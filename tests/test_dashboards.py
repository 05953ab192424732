"""Offline checks of the Grafana dashboards: generated, provisionable, consistent, valid PromQL."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from dashboard_queries import (
    DASHBOARD_DIR,
    dashboard_files,
    dashboards_queries,
    iter_panels,
    load_dashboard,
    promtool_check_exprs,
    substitute,
)

UID_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
VLLM_METRIC_RE = re.compile(r"vllm:[A-Za-z0-9_:]+")
# vLLM series the reference lists as exported (vllm-metrics-facts.md §1.2).
KNOWN_VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:iteration_tokens_total_count",
    "vllm:iteration_tokens_total_sum",
}
EXPECTED_FILES = {"llm-health-fleet.json", "llm-health-remediator.json"}
VERDICT_CODES = {"0": "unknown", "1": "idle", "2": "busy", "3": "restarted", "4": "no_metrics",
                 "5": "stalled", "6": "down"}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards_generate", DASHBOARD_DIR / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: load_dashboard(p) for p in dashboard_files()}


def all_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in iter_panels(dashboard) for t in p.get("targets", [])]


def test_checked_in_json_matches_a_fresh_generation(tmp_path: Path) -> None:
    generator = load_generator()
    written = generator.generate(tmp_path)
    assert {p.name for p in written} == EXPECTED_FILES
    for path in written:
        checked_in = DASHBOARD_DIR / path.name
        assert checked_in.read_text() == path.read_text(), (
            f"{checked_in} is stale: run `python dashboards/generate.py`"
        )


def test_expected_dashboards_exist(dashboards: dict[str, dict[str, Any]]) -> None:
    assert set(dashboards) == EXPECTED_FILES


def test_top_level_is_file_provisionable(dashboards: dict[str, dict[str, Any]]) -> None:
    uids = []
    for name, d in dashboards.items():
        assert d["id"] is None, name
        assert UID_RE.match(d["uid"]), name
        uids.append(d["uid"])
        assert d["schemaVersion"] == 39
        assert d["refresh"] == "10s"
        assert "llm-health" in d["tags"]
        assert d["time"] == {"from": "now-1h", "to": "now"}
        assert "__inputs" not in d, "__inputs is import-only; provisioning would not resolve it"
        assert d["title"]
    assert len(uids) == len(set(uids)), "dashboard uids must be unique"


def test_panel_ids_unique_and_panels_complete(dashboards: dict[str, dict[str, Any]]) -> None:
    for name, d in dashboards.items():
        panels = list(iter_panels(d))
        assert panels, name
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for p in panels:
            assert p["type"] in {"timeseries", "stat", "state-timeline"}, p["title"]
            assert p["title"] and p["targets"], p
            assert set(p["fieldConfig"]) == {"defaults", "overrides"}
            ref_ids = [t["refId"] for t in p["targets"]]
            assert len(ref_ids) == len(set(ref_ids)), p["title"]


def test_grid_positions_fit_and_do_not_overlap(dashboards: dict[str, dict[str, Any]]) -> None:
    for name, d in dashboards.items():
        cells: set[tuple[int, int]] = set()
        for p in iter_panels(d):
            g = p["gridPos"]
            assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y")), p["title"]
            assert g["h"] > 0 and 0 < g["w"] <= 24 and g["x"] >= 0 and g["y"] >= 0, p["title"]
            assert g["x"] + g["w"] <= 24, f"{name}: {p['title']} leaves the 24-column grid"
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, f"{name}: {p['title']} overlaps another panel"
            cells |= mine


def test_every_datasource_is_the_template_variable(dashboards: dict[str, dict[str, Any]]) -> None:
    for name, d in dashboards.items():
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        backend = variables["backend"]
        assert backend["type"] == "query"
        assert backend["definition"] == "label_values(llm_health_verdict_code, backend)"
        assert backend["allValue"] == ".+", "`.*` would also match series without a backend label"
        assert backend["datasource"]["uid"] == "${datasource}"
        for p in iter_panels(d):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}", (name, p["title"])


def test_verdict_panels_map_all_seven_codes(dashboards: dict[str, dict[str, Any]]) -> None:
    fleet = dashboards["llm-health-fleet.json"]
    verdict_panels = [p for p in iter_panels(fleet) if "llm_health_verdict_code" in str(p["targets"])]
    assert {p["type"] for p in verdict_panels} == {"state-timeline", "stat"}
    for p in verdict_panels:
        value_maps = [m for m in p["fieldConfig"]["defaults"]["mappings"] if m["type"] == "value"]
        assert len(value_maps) == 1
        options = value_maps[0]["options"]
        assert {code: o["text"] for code, o in options.items()} == VERDICT_CODES
        colours = [o["color"] for o in options.values()]
        assert len(set(colours)) == len(colours), "each verdict needs its own colour"


def test_kv_panel_has_a_threshold_line_at_085(dashboards: dict[str, dict[str, Any]]) -> None:
    panel = next(p for p in iter_panels(dashboards["llm-health-fleet.json"]) if p["title"] == "KV cache usage")
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    assert [s["value"] for s in defaults["thresholds"]["steps"]] == [None, 0.85]
    assert defaults["unit"] == "percentunit"


@pytest.mark.parametrize(
    ("dashboard", "series"),
    [
        ("llm-health-fleet.json", [
            "llm_health_verdict_code", "vllm:num_requests_running", "vllm:num_requests_waiting",
            "llm_health_in_flight_requests", "llm_health_generation_tokens_per_second",
            "rate(vllm:generation_tokens_total", "vllm:kv_cache_usage_perc",
            "changes(process_start_time_seconds", "resets(vllm:generation_tokens_total",
            "llm_health_remediator_restarts_total", "increase(llm_health_probes_total",
            "llm_health_readings_total", "llm_health_schedule_lag_seconds",
        ]),
        ("llm-health-remediator.json", [
            "llm_health_remediator_alerts_received_total", "llm_health_remediator_decisions_total",
            "llm_health_remediator_restarts_total", 'decision=~"deferred.*"',
            "llm_health_remediator_breaker_open", "llm_health_remediator_lifecycle_state",
        ]),
    ],
)
def test_dashboard_covers_the_required_series(
    dashboards: dict[str, dict[str, Any]], dashboard: str, series: list[str]
) -> None:
    text = "\n".join(all_exprs(dashboards[dashboard]))
    missing = [s for s in series if s not in text]
    assert not missing, f"{dashboard} lacks {missing}"


def test_only_exported_vllm_metric_names(dashboards: dict[str, dict[str, Any]]) -> None:
    used = {m for d in dashboards.values() for e in all_exprs(d) for m in VLLM_METRIC_RE.findall(e)}
    assert used, "the fleet dashboard should read vLLM's own series"
    assert used <= KNOWN_VLLM_METRICS, f"not exported by vLLM: {sorted(used - KNOWN_VLLM_METRICS)}"


def test_backend_filter_is_applied_to_per_backend_series(dashboards: dict[str, dict[str, Any]]) -> None:
    for d in dashboards.values():
        for expr in all_exprs(d):
            for metric in ("llm_health_verdict_code", "vllm:num_requests_running", "llm_health_probes_total"):
                if metric in expr:
                    assert f'{metric}{{backend=~"$backend"}}' in expr, expr


def test_dashboards_queries_substitutes_every_variable() -> None:
    queries = dashboards_queries()
    assert {q[0] for q in queries} == {Path(n).stem for n in EXPECTED_FILES}
    assert len(queries) >= 20
    for dashboard, title, expr in queries:
        assert "$" not in expr, (dashboard, title, expr)
    assert substitute('rate(x{backend=~"$backend"}[$__rate_interval])') == 'rate(x{backend=~".+"}[1m])'
    with pytest.raises(ValueError, match="unknown Grafana variable"):
        substitute("rate(x[$unknown_var])")


@needs_promtool
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    exprs = [expr for _, _, expr in dashboards_queries()]
    result = promtool_check_exprs(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


@needs_promtool
def test_promtool_check_rejects_a_broken_query(tmp_path: Path) -> None:
    result = promtool_check_exprs(["sum by (backend) (rate(vllm:generation_tokens_total[1m])"], tmp_path)
    assert result.returncode != 0
