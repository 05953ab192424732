"""The rules bundle: rendering, conventions, metric names, and the example Prometheus/Alertmanager configs."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from llm_health import cli
from llm_health.config import ConfigError
from llm_health.render import rules as cli_rules
from llm_health.render.rules import RuleSettings, render, write_rendered
from tests.support.promtool import (
    AMTOOL,
    PROMTOOL,
    REPO,
    RULE_FILES,
    RULES_DIR,
    alert_rule_list,
    alert_rules,
    all_exprs,
)

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make debs)")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (make debs)")

RESTART_ALERTS = {"LLMBackendStalled", "LLMBackendDown"}
REQUIRED_ALERTS = {
    "LLMBackendStalled", "LLMBackendDown", "LLMBackendRestarted", "LLMBackendRestartLoop", "LLMKVCachePressure",
    "LLMPreemptions", "LLMMetricsBehindProxy", "LLMProxyDown", "LLMHealthExporterDown",
    "LLMHealthProbeSentToBusyBackend", "LLMBackendErrorRate",
    "LLMQueueDepthHigh", "LLMQueueTimeHigh", "LLMTimeToFirstTokenHigh", "LLMTimeToFirstTokenSLOBreach",
    "LLMBackendAdmissionStalled", "LLMBackendDegraded",
}
FLEET_ALERTS = {"LLMProxyDown", "LLMHealthExporterDown", "LLMTooFewBackendsUp"}


def test_checked_in_rules_are_a_fresh_render_of_the_defaults() -> None:
    for name, text in render().items():
        assert (RULES_DIR / name).read_text() == text, f"rules/{name} is stale: run `llm-health rules render`"


def test_the_restart_alerts_are_evaluated_in_a_group_of_their_own_at_their_interval(tmp_path: Path) -> None:
    """A stalled verdict scraped from the exporter fires at the restart group's next evaluation (5s), not up to a
    whole global evaluation interval (15s) later; every other alert keeps the global interval."""
    def groups(settings: RuleSettings) -> dict[str, dict]:
        doc = yaml.safe_load(render(settings)["llm_health_alerts.yml"])
        return {g["name"]: g for g in doc["groups"]}

    shipped = groups(RuleSettings())
    restart = shipped["llm-health.restart"]
    assert restart["interval"] == RuleSettings().restart_evaluation_interval == "5s"
    assert {r["alert"] for r in restart["rules"]} == RESTART_ALERTS
    assert "interval" not in shipped["llm-health.alerts"]
    assert not RESTART_ALERTS & {r["alert"] for r in shipped["llm-health.alerts"]["rules"]}
    assert groups(RuleSettings(restart_evaluation_interval="10s"))["llm-health.restart"]["interval"] == "10s"
    # the shipped Prometheus config scrapes the exporter as often as that group looks
    prom = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "llm-health-exporter"]
    assert job["scrape_interval"] == restart["interval"]


def test_alert_conventions() -> None:
    rules = alert_rules()
    assert REQUIRED_ALERTS <= set(rules)
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    for rule in alert_rule_list():   # every level of a two-level alert too
        name = rule["alert"]
        assert re.fullmatch(r"LLM[A-Z][A-Za-z]+", name)
        labels = rule.get("labels") or {}
        assert labels.get("severity") in {"critical", "warning", "info"}, name
        assert ("remediation" in labels) == (name in RESTART_ALERTS), name
        if name in RESTART_ALERTS:
            assert labels["remediation"] == "restart"
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        assert annotations["runbook_url"].endswith("#" + name.lower())
        assert f"\n## {name}\n" in runbooks, f"docs/runbooks.md has no section for {name}"
        if name not in FLEET_ALERTS:
            # per-backend alerts keep the backend label through their aggregations
            assert "by (backend" in rule["expr"] or re.match(r"[\s(]*backend:", rule["expr"]), name


def test_recording_rule_names_follow_level_metric_operations() -> None:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    assert re.fullmatch(r"backend(_instance(_engine)?|_model)?:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


@needs_promtool
def test_promtool_check_rules_and_lint() -> None:
    result = subprocess.run(
        [PROMTOOL, "check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_render_with_custom_settings_via_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main([
        "rules", "render", "--out", str(tmp_path), "--check",
        "--vllm-selector", 'job="inference", cluster=~"eu-.*"', "--exporter-selector", 'job="lh"',
        "--stall-window", "5m", "--kv-threshold", "0.9", "--restart-loop-threshold", "7",
        "--sglang-selector", 'job="sgl", team="a"', "--llamacpp-selector", 'service="llama"',
    ])
    assert rc == 0, capsys.readouterr()
    alerts = (tmp_path / "llm_health_alerts.yml").read_text()
    records = (tmp_path / "llm_health_records.yml").read_text()
    assert 'vllm:num_requests_running{job="inference", cluster=~"eu-.*"}[5m]' in records
    assert 'sglang:num_running_reqs{job="sgl", team="a", tp_rank=~"|0", pp_rank=~"|0"}[5m]' in records
    assert 'llamacpp:n_decode_total{service="llama"}[5m]' in records
    assert 'up{service="llama"}' in alerts
    for default in ('job="vllm"', 'job="sglang"', 'job="llamacpp"'):
        assert default not in records + alerts
    assert "backend:llm_kv_cache_usage:max > 0.9\n" in alerts
    assert "backend:llm_restarts:count_1h > 7\n" in alerts
    assert 'llm_health_probes_total{job="lh"}' in alerts
    assert cli.main(["rules", "check", "--dir", str(tmp_path)]) == 0


@pytest.mark.parametrize(
    "settings",
    [
        RuleSettings(vllm_selector='job="vllm"} or vector(1) or {x="'),
        RuleSettings(vllm_selector="job=vllm"),
        RuleSettings(sglang_selector='job="sglang"} or vector(1) or {x="'),
        RuleSettings(llamacpp_selector="job=llamacpp"),
        RuleSettings(stall_window="2 minutes"),
        RuleSettings(stall_window="0m"),
        RuleSettings(kv_threshold=85.0),
        RuleSettings(restart_loop_threshold=0),
        RuleSettings(runbook_url="javascript:alert(1)"),
        RuleSettings(scrape_interval="15 s"),
        RuleSettings(scrape_interval="20m"),  # the 1h restart count would hold 3 scrapes
        RuleSettings(down_busy_grace="later"),
        RuleSettings(rate_window="59s"),  # default scrape interval 15s: at least 1m
        RuleSettings(scrape_interval="1m", rate_window="1m"),
        RuleSettings(scrape_interval="1m", stall_window="2m"),
        RuleSettings(scrape_interval="1m", restart_window="3m"),
        RuleSettings(scrape_interval="5m", proxy_window="15m"),
        RuleSettings(scrape_interval="1m", probe_busy_window="3m59s"),
        RuleSettings(error_rate_threshold=0.0),
        RuleSettings(error_rate_threshold=5.0),  # a percentage, not a share
        RuleSettings(error_rate_for="a while"),
        RuleSettings(error_rate_handlers='/v1/completions"}) or vector(1) or ({x="'),
        RuleSettings(error_rate_handlers="/v1/(completions"),
        RuleSettings(error_rate_handlers=""),
        RuleSettings(kv_critical_threshold=0.8),          # below the warning level (0.9)
        RuleSettings(kv_critical_threshold=1.5),
        RuleSettings(ttft_critical_threshold=5.0),        # below the warning level (10 s)
        RuleSettings(queue_depth_threshold=0),
        RuleSettings(queue_time_threshold=-1.0),
        RuleSettings(ttft_slo_threshold=0.0),
        RuleSettings(degraded_factor=1.0),                # "slower than itself" needs a factor above 1
        RuleSettings(degraded_baseline="45m"),            # shorter than twice the 30m window
        RuleSettings(degraded_min_tokens=0),
        RuleSettings(scrape_interval="1m", latency_window="3m"),
        RuleSettings(severity=(("LLMKVCachePressure", "critical"),)),   # both levels critical
        RuleSettings(severity=(("LLMQueueDepthHigh:critical", "page"),)),  # one level only
        RuleSettings(restart_evaluation_interval="soon"),
        RuleSettings(restart_evaluation_interval="0s"),
    ],
)
def test_bad_settings_are_refused_and_write_nothing(settings: RuleSettings, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        write_rendered(tmp_path / "out", settings)
    assert not (tmp_path / "out").exists()


def test_error_rate_alert_is_a_signal_for_people_with_its_flags(tmp_path: Path) -> None:
    """LLMBackendErrorRate: no remediation label, category="error-rate", flags reach the expression."""
    rule = alert_rules()["LLMBackendErrorRate"]
    assert rule["labels"] == {"severity": "warning", "category": "error-rate"}
    assert 'status=~"5.."' in rule["expr"] and "> 0.05\n" in rule["expr"] and rule["for"] == "2m"
    assert cli.main([
        "rules", "render", "--out", str(tmp_path), "--error-rate-threshold", "0.2", "--error-rate-for", "5m",
        "--error-rate-handlers", "/v1/chat/completions|/generate",
    ]) == 0
    custom = alert_rules([tmp_path / "llm_health_records.yml", tmp_path / "llm_health_alerts.yml"])["LLMBackendErrorRate"]
    assert "> 0.2\n" in custom["expr"] and custom["for"] == "5m"
    assert 'handler=~"/v1/chat/completions|/generate"' in custom["expr"]
    assert "20%" in custom["annotations"]["summary"]


def test_cli_reports_bad_input_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "render", "--out", str(tmp_path), "--stall-window", "soon"]) == 2
    assert "--stall-window" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# --- windows versus the scrape interval ------------------------------------------------------------

RATE_FLAGS = ["--stall-window", "--restart-window", "--rate-window", "--proxy-window", "--probe-busy-window"]


@pytest.mark.parametrize("flag", RATE_FLAGS)
def test_window_shorter_than_four_scrapes_is_refused_naming_the_flag(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["rules", "render", "--out", str(tmp_path), "--scrape-interval", "1m", flag, "3m"]) == 2
    err = capsys.readouterr().err
    assert flag in err and "--scrape-interval" in err and "4m" in err
    assert list(tmp_path.iterdir()) == []
    # Exactly four scrapes is enough.
    assert cli.main(["rules", "render", "--out", str(tmp_path), "--scrape-interval", "1m", flag, "4m"]) == 0


def test_unset_windows_are_derived_from_the_scrape_interval() -> None:
    slow = RuleSettings(scrape_interval="1m").validated()
    assert (slow.rate_window, slow.stall_window, slow.restart_window, slow.proxy_window, slow.probe_busy_window) == (
        "4m", "4m", "5m", "15m", "5m")
    default = RuleSettings().validated()
    assert (default.rate_window, default.stall_window, default.restart_window, default.proxy_window,
            default.probe_busy_window) == ("1m", "2m", "5m", "15m", "5m")
    fast = RuleSettings(scrape_interval="1s", rate_window="4s").validated()
    assert (fast.rate_window, fast.stall_window) == ("4s", "2m")
    texts = render(RuleSettings(scrape_interval="1m"))
    records = texts["llm_health_records.yml"]
    assert 'rate(vllm:num_preemptions_total{job="vllm"}[4m])' in records
    assert 'min_over_time(vllm:num_requests_running{job="vllm"}[4m])' in records
    assert "[1m]" not in records + texts["llm_health_alerts.yml"]
    for text in texts.values():
        assert "# Assumes Prometheus scrapes vLLM and the exporter every 1m or faster (--scrape-interval)" in text


def test_checked_in_rules_state_their_scrape_interval_assumption() -> None:
    for path in RULE_FILES:
        assert "every 15s or faster (--scrape-interval)" in path.read_text(), path.name


def test_unset_settings_keep_their_documented_defaults() -> None:
    """The derived windows still show their default in --help; unset means derived, never empty."""
    parser = argparse.ArgumentParser()
    cli_rules.configure(parser)
    args = parser.parse_args(["render"])
    assert all(getattr(args, f.name) is None for f in fields(RuleSettings) if f.name in cli_rules.RATE_WINDOWS)
    settings = cli_rules.settings_from_args(args).validated()
    assert all(isinstance(getattr(settings, name), str) for name in cli_rules.RATE_WINDOWS)


@pytest.mark.parametrize(("seconds", "text"), [(60, "1m"), (240, "4m"), (90, "90s"), (7200, "2h"), (0.5, "500ms")])
def test_format_duration(seconds: float, text: str) -> None:
    assert cli_rules.format_duration(seconds) == text


HARNESS_FLAGS = [
    "--stall-window", "8s", "--stall-for", "3s", "--down-for", "3s", "--restart-window", "20s", "--rate-window", "4s",
    "--no-metrics-for", "5s", "--unknown-for", "30s", "--missing-window", "2m", "--missing-for", "10s",
    "--proxy-down-for", "3s", "--exporter-down-for", "10s", "--probe-busy-window", "10s", "--proxy-window", "30s",
]


@needs_promtool
def test_end_to_end_harness_flags_render_at_a_1s_scrape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The flags llm_health/drill/stack.py passes (1 s scrape interval) keep working."""
    rc = cli.main(["rules", "render", "--out", str(tmp_path), "--check", "--scrape-interval", "1s", *HARNESS_FLAGS])
    assert rc == 0, capsys.readouterr()
    records = (tmp_path / "llm_health_records.yml").read_text()
    assert 'rate(vllm:generation_tokens_total{job="vllm"}[4s])' in records
    assert "every 1s or faster" in records


# --- engine metric names (vLLM, SGLang, llama.cpp) ---------------------------------------------------

ENGINE_NAME = re.compile(r"(?<![A-Za-z0-9_:])(?:vllm|sglang|llamacpp):[A-Za-z0-9_:]+")
NAME_FILES = {"vllm": "vllm_metric_names.yml", "sglang": "sglang_metric_names.yml",
              "llamacpp": "llamacpp_metric_names.yml"}


def known_names(engine: str) -> set[str]:
    names: set[str] = set()
    for entry in yaml.safe_load((RULES_DIR / NAME_FILES[engine]).read_text())["metrics"]:
        assert entry["name"].startswith(engine + ":"), entry
        # prometheus_client also exports <name>_created for counters and histograms (one-process mode)
        if entry["type"] == "histogram":
            names.update(entry["name"] + suffix for suffix in ("_bucket", "_count", "_sum", "_created"))
        elif entry["type"] == "counter":
            names.update((entry["name"], entry["name"].removesuffix("_total") + "_created"))
        else:
            names.add(entry["name"])
    return names


def known_vllm_names() -> set[str]:
    return known_names("vllm")


def dashboard_exprs() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in {"expr", "query", "definition"} and isinstance(value, str):
                    found.append((where, value))
                else:
                    walk(value, where)
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    for path in sorted((REPO / "dashboards").glob("*.json")):
        walk(json.loads(path.read_text()), path.name)
    return found


def unknown_names(exprs: list[tuple[str, str]]) -> list[str]:
    known = set().union(*(known_names(e) for e in NAME_FILES))
    return sorted({f"{where}: {name}" for where, expr in exprs for name in ENGINE_NAME.findall(expr) if name not in known})


def removed_names() -> set[str]:
    """Names a release removed (llama.cpp's kv_cache_* in b11434): rules may read them only as optional."""
    return {e["name"] for e in yaml.safe_load((RULES_DIR / NAME_FILES["llamacpp"]).read_text())["metrics"]
            if "removed" in e}


def test_rules_and_dashboards_query_only_exported_engine_names() -> None:
    exprs = [("rules", e) for e in all_exprs()] + dashboard_exprs()
    for engine in NAME_FILES:
        assert any(re.search(rf"\b{engine}:", e) for _, e in exprs if _ == "rules"), f"no {engine} series in the rules"
    assert unknown_names(exprs) == []


def test_rules_read_removed_llamacpp_names_only_as_an_optional_fallback() -> None:
    for expr in all_exprs():
        for name in removed_names() & set(ENGINE_NAME.findall(expr)):
            assert re.search(rf"\bor\b[^\n]*{re.escape(name)}", expr) or re.search(
                rf"or label_replace\(\s*\(changes\({re.escape(name)}", expr), (name, expr)


def test_metric_name_check_catches_the_llm_d_bug() -> None:
    bad = [("llm-d", "rate(vllm:num_preemptions[5m])"), ("x", "vllm:iteration_tokens_total > 0"),
           ("y", "sglang:num_running_requests"), ("z", "rate(llamacpp:n_decode[1m])")]
    assert unknown_names(bad) == ["llm-d: vllm:num_preemptions", "x: vllm:iteration_tokens_total",
                                  "y: sglang:num_running_requests", "z: llamacpp:n_decode"]


# --- example configs --------------------------------------------------------------------------------

AM_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


@needs_amtool
def test_alertmanager_example_passes_amtool() -> None:
    result = subprocess.run([AMTOOL, "check-config", str(AM_CONFIG)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_amtool
@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["alertname=LLMBackendStalled", "backend=a", "remediation=restart", "severity=critical"],
         "llm-health-remediator,operators"),
        (["alertname=LLMBackendDown", "backend=a", "remediation=restart", "severity=critical"],
         "llm-health-remediator,operators"),
        (["alertname=LLMBackendRestartLoop", "backend=a", "severity=warning"], "operators"),
        (["alertname=LLMHealthProbeSentToBusyBackend", "backend=a", "severity=warning"], "operators"),
        (["alertname=LLMBackendErrorRate", "backend=a", "severity=warning", "category=error-rate"], "operators"),
        # saturation and latency: signals for people only, whatever their severity
        (["alertname=LLMQueueDepthHigh", "backend=a", "severity=warning"], "operators"),
        (["alertname=LLMQueueTimeHigh", "backend=a", "severity=warning"], "operators"),
        (["alertname=LLMKVCachePressure", "backend=a", "severity=critical"], "operators"),
        (["alertname=LLMTimeToFirstTokenHigh", "backend=a", "severity=critical"], "operators"),
        (["alertname=LLMTimeToFirstTokenSLOBreach", "backend=a", "severity=warning"], "operators"),
        (["alertname=LLMBackendAdmissionStalled", "backend=a", "severity=critical"], "operators"),
        (["alertname=LLMBackendDegraded", "backend=a", "severity=warning"], "operators"),
        # info is a record, not a page
        (["alertname=LLMBackendRestarted", "backend=a", "severity=info"], "operators-info"),
        # the Watchdog: the remediator (its own dead man's switch) and the dead man's switch, never people
        (["alertname=Watchdog", "severity=none"], "llm-health-remediator,watchdog"),
        (["alertname=LLMHealthWatchdog", "severity=none", "cluster=eu"], "llm-health-remediator,watchdog"),
    ],
)
def test_only_restart_alerts_and_the_watchdog_reach_the_remediator(labels: list[str], receivers: str) -> None:
    result = subprocess.run(
        [AMTOOL, "config", "routes", "test", f"--config.file={AM_CONFIG}", f"--verify.receivers={receivers}", *labels],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_example_shape() -> None:
    config = yaml.safe_load(AM_CONFIG.read_text())
    hook = next(r for r in config["receivers"] if r["name"] == "llm-health-remediator")["webhook_configs"][0]
    assert hook["url"] == "http://127.0.0.1:9411/webhook"
    assert hook["http_config"]["authorization"]["type"] == "Bearer"
    assert "credentials_file" in hook["http_config"]["authorization"]
    inhibits = {(tuple(r["source_matchers"]), tuple(r["target_matchers"])) for r in config["inhibit_rules"]}
    assert (('alertname="LLMBackendDown"',), ('alertname="LLMBackendStalled"',)) in inhibits
    # backend plus the group labels: one cluster's down backend never silences the same name in another
    # (the two-level alerts' critical-inhibits-warning rule also keeps the alert name)
    assert all(r["equal"][-3:] == ["backend", "cluster", "namespace"] and r["equal"][:-3] in ([], ["alertname"])
               for r in config["inhibit_rules"])
    levels = [r for r in config["inhibit_rules"] if 'severity="critical"' in r["source_matchers"]]
    assert len(levels) == 1 and levels[0]["equal"][0] == "alertname"
    assert 'severity="warning"' in levels[0]["target_matchers"]
    tiered = re.compile(r'alertname=~"([^"]+)"')
    for side in ("source_matchers", "target_matchers"):
        (names,) = [tiered.fullmatch(m).group(1) for m in levels[0][side] if tiered.fullmatch(m)]
        assert set(names.split("|")) == set(cli_rules.TIERED_ALERTS), side
    # a restarting or down backend's queue and first-token symptoms are inhibited; the stall inhibits admission
    for source in ('alertname="LLMBackendRestarted"', 'alertname="LLMBackendDown"'):
        (rule,) = [r for r in config["inhibit_rules"] if r["source_matchers"] == [source]
                   and "LLMBackendNoMetrics" in r["target_matchers"][0]]
        (targets,) = rule["target_matchers"]
        for name in ("LLMQueueDepthHigh", "LLMQueueTimeHigh", "LLMTimeToFirstTokenHigh", "LLMBackendAdmissionStalled"):
            assert re.search(rf"[~|\"]{name}[|\"]", targets), (source, name)
    assert (('alertname="LLMBackendStalled"',), ('alertname="LLMBackendAdmissionStalled"',)) in inhibits
    # A restarting backend inhibits its error-rate alerts (tests/e2e/test_alertmanager_inhibit.py runs it).
    assert (('alertname=~"LLMBackendRestarted|LLMBackendDown"',), ('category="error-rate"',)) in inhibits
    assert "category: error-rate" in AM_CONFIG.read_text()  # the header tells operators how to opt in


@needs_promtool
def test_prometheus_example_passes_promtool_and_loads_the_rules() -> None:
    config = REPO / "deploy" / "prometheus" / "prometheus.yml"
    result = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "llm_health_alerts.yml" in result.stdout and "llm_health_records.yml" in result.stdout
    parsed = yaml.safe_load(config.read_text())
    vllm_job = next(j for j in parsed["scrape_configs"] if j["job_name"] == "vllm")
    assert all("backend" in sc["labels"] for sc in vllm_job["static_configs"])


def test_dashboards_are_scanned_when_present() -> None:
    if list((REPO / "dashboards").glob("*.json")):
        assert dashboard_exprs(), "dashboards exist but no expr was found in them: the name check would be vacuous"


def test_dashboards_use_only_defined_recording_rules() -> None:
    defined = {
        rule["record"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    used = {name for _, expr in dashboard_exprs()
            for name in re.findall(r"\bbackend(?:_instance(?:_engine)?|_model)?:[a-z0-9_]+:[a-z0-9_]+", expr)}
    assert used - defined == set()


def test_rules_query_only_documented_exporter_series() -> None:
    """llm_health_* names in the rules are the exporter series of docs/design.md (counters with _total)."""
    design = (REPO / "docs" / "design.md").read_text()
    documented = set(re.findall(r"`(llm_health_[a-z_]+)[{`]", design))
    used = {name for expr in all_exprs() for name in re.findall(r"\bllm_health_[a-z_]+", expr)}
    assert used and used <= documented, sorted(used - documented)
