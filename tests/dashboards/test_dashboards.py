"""Offline checks of the Grafana dashboards: rendered, provisionable, consistent, valid PromQL, and
shaped by the rule settings (selectors, group labels, without the exporter)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llm_health.config import ConfigError
from llm_health.drill.procs import llm_health
from llm_health.render import dashboards as dash
from llm_health.render.rules import ALERT_NAMES, RuleSettings
from tests.support.dashboard_queries import (
    DASHBOARD_DIR,
    all_queries,
    dashboard_files,
    dashboards_queries,
    iter_panels,
    load_dashboard,
    promtool_check_exprs,
    raw_queries,
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
                 "5": "stalled", "6": "down", "7": "sleeping"}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
LITERAL_WINDOW = re.compile(r"\[\s*[0-9]")
BY_CLAUSE = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")
REPO = DASHBOARD_DIR.parent


def rendered(**changes: Any) -> dict[str, dict[str, Any]]:
    texts = dash.render(replace(RuleSettings(), **changes))
    return {name: json.loads(text) for name, text in texts.items()}


def exprs_of(dashboard: dict[str, Any]) -> list[str]:
    return [expr for _, expr in raw_queries(dashboard)]


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: load_dashboard(p) for p in dashboard_files()}


def all_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in iter_panels(dashboard) for t in p.get("targets", [])]


def test_checked_in_json_is_the_default_rendering() -> None:
    texts = dash.render()
    assert set(texts) == EXPECTED_FILES
    for name, text in texts.items():
        assert (DASHBOARD_DIR / name).read_text() == text, (
            f"dashboards/{name} is stale: run `llm-health dashboards render`"
        )


def test_cli_renders_the_same_as_the_library_with_the_rule_flags(tmp_path: Path) -> None:
    flags = ["--vllm-selector", 'job="gpu-vllm"', "--group-labels", "cluster,namespace", "--kv-threshold", "0.9"]
    done = subprocess.run(llm_health("dashboards", "render", "--out", tmp_path, *flags),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    expected = dash.render(RuleSettings(vllm_selector='job="gpu-vllm"', group_labels=("cluster", "namespace"),
                                            kv_threshold=0.9))
    assert {p.name: p.read_text() for p in tmp_path.glob("*.json")} == expected
    assert expected != dash.render()


def test_bad_settings_are_refused_and_write_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for flags in (["--group-labels", "cluster,backend"], ["--group-labels", "9x"],
                  ["--vllm-selector", 'job="a"} or vector(1) #']):
        done = subprocess.run(llm_health("dashboards", "render", "--out", out, *flags),
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, (flags, done.stderr)
        assert "--" in done.stderr and "Traceback" not in done.stderr
        assert not out.exists()
    with pytest.raises(ConfigError, match="--group-labels"):
        dash.render(RuleSettings(group_labels=("cluster", "cluster")))


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
        for name in ("job", "backend", "model"):
            assert variables[name]["type"] == "query"
            assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables["backend"]["allValue"] == ".+", "`.*` would also match series without a backend label"
        for p in iter_panels(d):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}", (name, p["title"])


def test_verdict_panels_map_every_verdict_code(dashboards: dict[str, dict[str, Any]]) -> None:
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


def test_kv_panel_has_threshold_lines_at_both_levels(dashboards: dict[str, dict[str, Any]]) -> None:
    panel = next(p for p in iter_panels(dashboards["llm-health-fleet.json"]) if p["title"] == "KV cache usage")
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    assert [s["value"] for s in defaults["thresholds"]["steps"]] == [None, 0.9, 0.95]
    assert defaults["unit"] == "percentunit"


# The saturation and latency panels: (title prefix, the recording rules they read, the alert they link to).
SATURATION_PANELS = [
    ("Queue depth", ["backend_model:llm_requests_waiting:sum"], "LLMQueueDepthHigh"),
    ("Mean queue time", ["backend_model:llm_queue_time_seconds:mean_queue_time_window"], "LLMQueueTimeHigh"),
    ("Requests waiting with none running", ["backend:llm_requests_waiting:sum", "backend:llm_requests_in_flight:sum"],
     "LLMBackendAdmissionStalled"),
    ("Prefix-cache hit rate", ["backend:llm_prefix_cache_hits:ratio_latency_window"], None),
    ("Time to first token", ["backend_model:llm_time_to_first_token_seconds:p95",
                             "backend:llm_time_to_first_token_seconds:p99"], "LLMTimeToFirstTokenHigh"),
    ("TTFT p95 over", ["backend:llm_time_to_first_token_seconds:p95_ttft_slo_window"], "LLMTimeToFirstTokenSLOBreach"),
    ("End-to-end request latency", ["backend_model:llm_e2e_request_latency_seconds:p95"], None),
    ("Inter-token latency against its baseline", ["backend:llm_inter_token_latency_seconds:mean_degraded_window",
                                                  "backend:llm_inter_token_latency_seconds:baseline",
                                                  "backend_model:llm_inter_token_latency_seconds:p95"],
     "LLMBackendDegraded"),
]


def panel_titled(dashboard: dict[str, Any], prefix: str) -> dict[str, Any]:
    (panel,) = [p for p in iter_panels(dashboard) if p["title"].startswith(prefix)]
    return panel


@pytest.mark.parametrize(("prefix", "records", "alert"), SATURATION_PANELS, ids=[p[0] for p in SATURATION_PANELS])
def test_saturation_and_latency_panels_read_their_records(dashboards: dict[str, dict[str, Any]], prefix: str,
                                                          records: list[str], alert: str | None) -> None:
    panel = panel_titled(dashboards["llm-health-fleet.json"], prefix)
    text = "\n".join(t["expr"] for t in panel["targets"])
    for record in records:
        assert re.search(re.escape(record) + r'\{[^}]*backend=~"\$backend"', text), (prefix, record, text)
        if record.startswith("backend_model:"):
            assert re.search(re.escape(record) + r'\{[^}]*model_name=~"\$model"', text), (prefix, record)
    if alert:
        assert any(link["url"].endswith("#" + alert.lower()) for link in panel["links"]), prefix


def test_the_affinity_payoff_sits_next_to_the_time_to_first_token() -> None:
    fleet = rendered()["llm-health-fleet.json"]
    hits, ttft = panel_titled(fleet, "Prefix-cache hit rate"), panel_titled(fleet, "Time to first token")
    assert hits["gridPos"]["y"] == ttft["gridPos"]["y"] and hits["gridPos"]["x"] + hits["gridPos"]["w"] == ttft["gridPos"]["x"]


def test_saturation_threshold_lines_follow_the_rule_settings() -> None:
    fleet = rendered(queue_depth_threshold=80, queue_time_threshold=12.5, ttft_threshold=4.0,
                     ttft_critical_threshold=9.0, ttft_slo_threshold=2.0, degraded_factor=2.5,
                     kv_threshold=0.8, kv_critical_threshold=0.9)["llm-health-fleet.json"]

    def steps(prefix: str) -> list[float | None]:
        return [s["value"] for s in panel_titled(fleet, prefix)["fieldConfig"]["defaults"]["thresholds"]["steps"]]

    assert steps("Queue depth") == [None, 80]
    assert steps("Mean queue time") == [None, 12.5]
    assert steps("Time to first token") == [None, 4.0, 9.0]
    assert steps("TTFT p95 over") == [None, 2.0]
    assert steps("KV cache usage") == [None, 0.8, 0.9]
    baseline = panel_titled(fleet, "Inter-token latency against its baseline")
    assert any(t["expr"].endswith("} * 2.5") for t in baseline["targets"])


@pytest.mark.parametrize(
    ("dashboard", "series"),
    [
        ("llm-health-fleet.json", [
            "llm_health_verdict_code", "vllm:num_requests_running", "vllm:num_requests_waiting",
            "llm_health_in_flight_requests", "llm_health_generation_tokens_per_second",
            "rate(vllm:generation_tokens_total", "vllm:kv_cache_usage_perc",
            "changes(process_start_time_seconds", "resets(vllm:generation_tokens_total",
            "llm_health_remediator_restarts_total", "llm_health_probes_total",
            "llm_health_readings_total", "llm_health_schedule_lag_seconds",
            "backend_model:llm_requests_waiting:sum", "backend_model:llm_queue_time_seconds:mean_queue_time_window",
            "backend_model:llm_time_to_first_token_seconds:p95", "backend:llm_time_to_first_token_seconds:p99",
            "backend:llm_time_to_first_token_seconds:p95_ttft_slo_window",
            "backend_model:llm_e2e_request_latency_seconds:p95", "backend_model:llm_inter_token_latency_seconds:p95",
            "backend:llm_inter_token_latency_seconds:mean_degraded_window",
            "backend:llm_inter_token_latency_seconds:baseline", "backend:llm_prefix_cache_hits:ratio_latency_window",
        ]),
        ("llm-health-remediator.json", [
            "llm_health_remediator_alerts_received_total", "llm_health_remediator_decisions_total",
            "llm_health_remediator_restarts_total", 'decision=~"deferred.*"',
            "llm_health_remediator_breaker_open", "llm_health_remediator_lifecycle_state",
            "llm_health_remediator_rollout_state", "llm_health_remediator_rollout_members",
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
    per_backend = ("llm_health_verdict_code", "vllm:num_requests_running", "sglang:num_running_reqs",
                   "llamacpp:requests_processing", "llm_health_probes_total", "backend:llm_health_state:code",
                   "llm_health_remediator_restarts_total", "llamacpp:n_decode_total")
    for name, d in dashboards.items():
        for where, expr in raw_queries(d):
            if where.startswith("variable"):
                continue
            for metric in per_backend:
                for selector in re.findall(re.escape(metric) + r"\{([^}]*)\}", expr):
                    assert 'backend=~"$backend' in selector, (name, where, expr)
                assert metric + "[" not in expr and not re.search(re.escape(metric) + r"\b(?!\{)", expr), (
                    name, where, f"{metric} without a selector")


def test_engine_series_take_the_rule_selectors_job_and_model() -> None:
    d = rendered(vllm_selector='job="gpu-vllm", env="prod"')["llm-health-fleet.json"]
    text = "\n".join(expr for where, expr in raw_queries(d) if not where.startswith("variable"))
    for selector in re.findall(r"vllm:[a-z_]+\{([^}]*)\}", text):
        assert selector.startswith('job="gpu-vllm", env="prod", job=~"$job"'), selector
        assert 'model_name=~"$model"' in selector
    assert 'job="vllm"' not in "\n".join(exprs_of(d))
    for selector in re.findall(r"llamacpp:[a-z_]+\{([^}]*)\}", text):
        assert "model_name" not in selector, "llama.cpp series carry no model label"


def test_no_literal_range_windows(dashboards: dict[str, dict[str, Any]]) -> None:
    for name, d in {**dashboards, **rendered(group_labels=("cluster",))}.items():
        for where, expr in raw_queries(d):
            assert not LITERAL_WINDOW.search(expr), f"{name}: {where}: literal window in {expr}"
        assert "$__rate_interval" in json.dumps(d)
    assert LITERAL_WINDOW.search("rate(x[5m])") and LITERAL_WINDOW.search("max_over_time(x[1h:30s])")
    assert not LITERAL_WINDOW.search("rate(x[$__rate_interval]) + increase(y[$__range])")


def test_backend_variable_comes_from_the_engines_targets_not_only_the_exporter() -> None:
    for exporter in (True, False):
        d = rendered(exporter=exporter)["llm-health-fleet.json"]
        variables = {v["name"]: v for v in d["templating"]["list"]}
        backend = variables["backend"]["definition"]
        for selector in ('up{job="vllm"', 'up{job="sglang"', 'up{job="llamacpp"'):
            assert selector in backend
        assert ("llm_health_verdict_code" in backend) is exporter
        assert 'job=~"$job"' in backend, "the backend list follows the chosen jobs"
        assert variables["model"]["allValue"] == ".*", "llama.cpp series have no model label"
        assert "model_name" in variables["model"]["definition"]


def test_without_the_exporter_no_panel_reads_it() -> None:
    for name, d in rendered(exporter=False).items():
        text = "\n".join(exprs_of(d))
        assert 'job="llm-health-exporter"' not in text, name
        assert "llm_health_verdict_code" not in text, name
    fleet = rendered(exporter=False)["llm-health-fleet.json"]
    titles = {p["title"] for p in iter_panels(fleet)}
    assert {"State per backend from the rules", "Requests running and waiting", "Engine targets up"} <= titles


def test_group_labels_are_variables_filters_aggregations_and_legends() -> None:
    groups = ("cluster", "namespace")
    for name, d in rendered(group_labels=groups).items():
        variables = [v["name"] for v in d["templating"]["list"]]
        assert variables[1:3] == ["cluster", "namespace"], variables
        for where, expr in raw_queries(d):
            for inside in BY_CLAUSE.findall(expr):
                if where.startswith("variable"):
                    continue
                assert [x.strip() for x in inside.split(",")][:2] == list(groups), (name, where, expr)
            if not where.startswith("variable"):
                for selector in re.findall(r"\{([^}]*)\}", expr):
                    assert 'cluster=~"$cluster"' in selector and 'namespace=~"$namespace"' in selector, (
                        name, where, selector)
        for panel in iter_panels(d):
            for target in panel["targets"]:
                if "backend" in target["legendFormat"]:
                    assert target["legendFormat"].startswith("{{cluster}}/{{namespace}}/{{backend}}"), panel["title"]
        definitions = {v["name"]: v.get("definition", "") for v in d["templating"]["list"]}
        assert "$cluster" not in definitions["cluster"] and "$namespace" not in definitions["namespace"]
        assert 'cluster=~"$cluster"' in definitions["namespace"], "namespaces of the chosen clusters"
        assert 'cluster=~"$cluster"' in definitions["backend"] and 'job=~"$job"' in definitions["backend"]
    # without group labels: no stray group variables, `by (backend)` alone
    fleet = rendered()["llm-health-fleet.json"]
    assert [v["name"] for v in fleet["templating"]["list"]] == ["datasource", "job", "backend", "model"]
    assert "by (backend)" in "\n".join(exprs_of(fleet))


def test_panels_cover_all_three_engines(dashboards: dict[str, dict[str, Any]]) -> None:
    fleet = dashboards["llm-health-fleet.json"]
    by_title = {p["title"]: "\n".join(t["expr"] for t in p["targets"]) for p in iter_panels(fleet)}
    running = by_title["Requests running and waiting"]
    for series in ("vllm:num_requests_running", "vllm:num_requests_waiting", "sglang:num_running_reqs",
                   "sglang:num_queue_reqs", "llamacpp:requests_processing", "llamacpp:requests_deferred"):
        assert series in running, series
    assert 'max by (backend, instance, dp_rank) (sglang:num_running_reqs' in running, "SGLang's TP ranks repeat"
    assert "rate(llamacpp:n_decode_total" in by_title["Engine steps per second"]
    assert "rate(sglang:generation_tokens_total" in by_title["Generation tokens per second"]
    assert "rate(sglang:cuda_graph_passes_total" in by_title["Engine steps per second"]
    stall = by_title["Work in flight and engine progress (what the stall alert reads)"]
    assert "backend:llm_requests_in_flight:sum" in stall and "backend:llm_engine_progress:rate_stall_window" in stall


def test_annotations_restarts_remediator_restarts_and_firing_alerts(dashboards: dict[str, dict[str, Any]]) -> None:
    for name, d in dashboards.items():
        annotations = {a["name"]: a for a in d["annotations"]["list"] if "expr" in a}
        assert set(annotations) == {"Engine restarts", "Remediator restarts", "Rollouts", "Canary soaking",
                                    "LLM alerts firing"}, name
        assert "changes(llm_health_remediator_rollout_state{" in annotations["Rollouts"]["expr"]
        assert 'llm_health_remediator_rollout_canary_soaking{' in annotations["Canary soaking"]["expr"]
        engine = annotations["Engine restarts"]["expr"]
        assert "changes(process_start_time_seconds{" in engine and "changes(vllm:prompt_tokens_created{" in engine
        assert "resets(llamacpp:n_decode_total{" in engine and "resets(sglang:num_requests_total{" in engine
        assert "sum by (backend) (llm_health_remediator_restarts_total{" in annotations["Remediator restarts"]["expr"]
        assert "offset $__rate_interval" in annotations["Remediator restarts"]["expr"]
        alerts = annotations["LLM alerts firing"]["expr"]
        assert alerts.startswith(f'ALERTS{{alertname=~"{dash.ANNOTATED_ALERTS}", alertstate="firing"'), alerts
        assert 'backend=~"$backend|"' in alerts, "fleet alerts have no backend label and must still show"
        for a in annotations.values():
            assert a["datasource"]["uid"] == "${datasource}" and a["enable"]


def test_the_alert_annotation_shows_our_alerts_and_no_one_elses() -> None:
    """Prometheus anchors a regex matcher (^(?:...)$): the annotation's regex, so anchored, matches each of
    our alerts but the always-firing watchdog, and none of llm-d's LLMD* alerts (LLM.* did)."""
    (annotation,) = [a for a in rendered()["llm-health-fleet.json"]["annotations"]["list"]
                     if a["name"] == "LLM alerts firing"]
    (regex,) = re.findall(r'alertname=~"([^"]*)"', annotation["expr"])
    matches = re.compile(f"^(?:{regex})$").match
    assert all(matches(a) for a in ALERT_NAMES if a != "LLMHealthWatchdog")
    for other in ("LLMHealthWatchdog", "LLMDHighQueueDepth", "LLMDInferencePoolDown", "LLMBackendStalledX", "XLLMProxyDown"):
        assert not matches(other), other


# Grafana's unit ids used here (packages/grafana-data/src/valueFormats/categories.ts) and its documented custom
# units (`count:<unit>`, `suffix:<suffix>`, ...); any other id is shown as a literal, unscaled suffix.
GRAFANA_UNITS = {"none", "short", "percent", "percentunit", "s", "ms", "bytes", "reqps"}
GRAFANA_CUSTOM_UNIT = re.compile(r"^(count|suffix|prefix|si):\S.*$")


def test_every_unit_is_a_grafana_unit(dashboards: dict[str, dict[str, Any]]) -> None:
    units = {p["fieldConfig"]["defaults"].get("unit") for d in dashboards.values() for p in iter_panels(d)} - {None}
    assert "tps" not in units
    assert all(u in GRAFANA_UNITS or GRAFANA_CUSTOM_UNIT.match(u) for u in units), units
    fleet = {p["title"]: p for p in iter_panels(dashboards["llm-health-fleet.json"])}
    for title in ("Generation tokens per second", "Prompt tokens per second"):
        assert fleet[title]["fieldConfig"]["defaults"]["unit"] == "count:tokens/s"


def test_runbook_links_point_at_existing_sections() -> None:
    sections = {m.lower() for m in re.findall(r"^## (\w+)$", (REPO / "docs" / "runbooks.md").read_text(), re.M)}
    base = "https://runbooks.example.com/llm-health.html"
    for name, d in rendered(runbook_url=base).items():
        links = [link for link in d["links"] if link["type"] == "link"]
        assert [link["url"] for link in links] == [base], name
        panel_links = [link["url"] for p in iter_panels(d) for link in p.get("links", [])]
        assert panel_links, name
        for url in panel_links:
            page, anchor = url.split("#")
            assert page == base and anchor in sections, url


def test_dashboards_queries_substitutes_every_variable() -> None:
    queries = dashboards_queries()
    assert {q[0] for q in queries} == {Path(n).stem for n in EXPECTED_FILES}
    assert len(queries) >= 20
    for dashboard, title, expr in all_queries():
        assert "$" not in expr, (dashboard, title, expr)
    variables = {"$backend": ".+", "$cluster": ".*"}
    assert substitute('rate(x{backend=~"$backend", cluster=~"$cluster"}[$__rate_interval])', variables) == (
        'rate(x{backend=~".+", cluster=~".*"}[1m])')
    with pytest.raises(ValueError, match="unknown Grafana variable"):
        substitute("rate(x[$unknown_var])")


@needs_promtool
@pytest.mark.parametrize("changes", [{}, {"group_labels": ("cluster", "namespace")}, {"exporter": False}],
                         ids=["default", "group-labels", "without-exporter"])
def test_every_query_is_valid_promql(tmp_path: Path, changes: dict[str, Any]) -> None:
    out = tmp_path / "dashboards"
    dash.write_rendered(out, replace(RuleSettings(), **changes))
    exprs = [expr for _, _, expr in all_queries(out)]
    result = promtool_check_exprs(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


@needs_promtool
def test_promtool_check_rejects_a_broken_query(tmp_path: Path) -> None:
    result = promtool_check_exprs(["sum by (backend) (rate(vllm:generation_tokens_total[1m])"], tmp_path)
    assert result.returncode != 0


def test_exporter_and_remediator_series_take_their_rule_selectors() -> None:
    for name, d in rendered(exporter_selector='job="exp-a"', remediator_selector='job="rem-a"').items():
        text = "\n".join(exprs_of(d))
        for selector in re.findall(r"llm_health_remediator_[a-z_]+\{([^}]*)\}", text):
            assert selector.startswith('job="rem-a"'), (name, selector)
        for selector in re.findall(r"llm_health_(?!remediator)[a-z_]+\{([^}]*)\}", text):
            assert selector.startswith('job="exp-a"'), (name, selector)
        assert "llm-health-exporter" not in text and "llm-health-remediator" not in text, name
    remediator = rendered(remediator_selector='job="rem-a"')["llm-health-remediator.json"]
    assert 'up{job="rem-a"}' in "\n".join(exprs_of(remediator))
