"""Rules for real operators' stacks (issue 14): group labels (`--group-labels cluster,namespace`) kept in
every aggregation, LLMTooFewBackendsUp per group, LLMHealthExporterDown per exporter instance, and the
alert details: $value in descriptions, keep_firing_for on the threshold alerts only, --severity and
--extra-label. Each case is a promtool unit test against rules rendered with those settings, with the
traps that must stay silent.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_health.config import ConfigError
from llm_health.drill.procs import llm_health
from llm_health.render.rules import ALERT_NAMES, REMEDIATION_ALERTS, RuleSettings, render, write_rendered
from tests.support.promtool import (
    EXPORTER,
    PROMTOOL,
    VALUE,
    N,
    Scenario,
    alert_levels,
    alert_rules,
    error_rate_quiet,
    exporter_series,
    promtool_document,
    run_promtool_tests,
    series,
    vllm_backend,
)

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make debs)")

THRESHOLD_ALERTS = {"LLMKVCachePressure", "LLMPreemptions", "LLMBackendErrorRate", "LLMQueueDepthHigh", "LLMQueueTimeHigh",
                    "LLMTimeToFirstTokenHigh", "LLMTimeToFirstTokenSLOBreach", "LLMBackendDegraded"}


def rules_with(tmp_path: Path, **changes: Any) -> list[Path]:
    return write_rendered(tmp_path / "rules", replace(RuleSettings(), **changes))


def passes(tmp_path: Path, files: list[Path], *scenarios: Scenario) -> None:
    result = run_promtool_tests(promtool_document(list(scenarios), files), tmp_path / "groups_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def idle(backend: str, up: str, **groups: str) -> list[dict[str, str]]:
    return vllm_backend(backend, running=f"0x{N}", waiting=f"0x{N}", progress=f"10x{N}", up=up, groups=groups)


# --- exporter down per instance ------------------------------------------------------------------------


def sharded_exporters() -> Scenario:
    s = Scenario("two sharded exporters: one dies at 2m (15 min down), one target vanishes at 30m")
    live = {**EXPORTER, "instance": "exporter-1:9410"}
    dead = {**EXPORTER, "instance": "exporter-2:9410"}
    gone = {**EXPORTER, "instance": "exporter-3:9410"}
    s.add(series("up", live, f"1x{N}"))
    s.add(series("up", dead, f"1x8 0x60 1x{N}"))        # down from 2m to 17m
    s.add(series("up", gone, "1x120 stale"))            # removed from service discovery at 30m
    s.silent("1m", "LLMHealthExporterDown")
    s.silent("6m30s", "LLMHealthExporterDown")           # down 4m30s: not yet 5m
    s.expect("7m30s", "LLMHealthExporterDown", dead)
    s.expect("16m", "LLMHealthExporterDown", dead)
    s.silent("18m", "LLMHealthExporterDown")             # back
    s.silent("34m", "LLMHealthExporterDown")
    s.expect("36m", "LLMHealthExporterDown", gone)
    return s


def test_one_of_two_sharded_exporters_down_fires_for_its_instance(tmp_path: Path) -> None:
    passes(tmp_path, rules_with(tmp_path), sharded_exporters())


def test_no_exporter_at_all_fires_once_without_labels(tmp_path: Path) -> None:
    s = Scenario("no exporter target was ever scraped; vLLM is")
    s.add(idle("a", f"1x{N}"))
    s.silent("4m", "LLMHealthExporterDown")
    s.expect("6m", "LLMHealthExporterDown", {})
    passes(tmp_path, rules_with(tmp_path), s)


# --- group labels -------------------------------------------------------------------------------------


def same_name_two_clusters() -> Scenario:
    s = Scenario("backend gpu-a: down in east (idle, then every scrape fails), up in west")
    s.add(idle("gpu-a", f"1x8 0x{N}", cluster="east", namespace="llm"))
    s.add(idle("gpu-a", f"1x{N}", cluster="west", namespace="llm"))
    return s


def test_same_backend_down_in_one_cluster_up_in_another_fires_with_group_labels(tmp_path: Path) -> None:
    s = same_name_two_clusters()
    s.silent("3m30s", "LLMBackendDown")
    s.expect("5m", "LLMBackendDown", {"cluster": "east", "namespace": "llm", "backend": "gpu-a"})
    s.value("5m", 'backend:llm_health_state:code{backend="gpu-a"}', [
        ('backend:llm_health_state:code{backend="gpu-a", cluster="east", namespace="llm"}', 6),
        ('backend:llm_health_state:code{backend="gpu-a", cluster="west", namespace="llm"}', 1),
    ])
    files = rules_with(tmp_path, group_labels=("cluster", "namespace"))
    # east counts 0 backends up, west 1: LLMTooFewBackendsUp (min 1 per group) fires for east only
    s.expect("5m", "LLMTooFewBackendsUp", {"cluster": "east", "namespace": "llm", VALUE: 0})
    passes(tmp_path, files, s)


def test_without_group_labels_the_same_name_hides_the_dead_one(tmp_path: Path) -> None:
    """Why the setting exists: aggregated by backend alone, west's healthy gpu-a masks east's dead one."""
    s = same_name_two_clusters()
    s.silent("5m", "LLMBackendDown")
    s.silent("5m", "LLMTooFewBackendsUp")
    passes(tmp_path, rules_with(tmp_path), s)


def test_too_few_backends_counts_per_group_and_a_vanished_group(tmp_path: Path) -> None:
    s = Scenario("min 2 up per cluster: north has 2, south 1, west's targets all vanish at 5m")
    for b in ("a", "b"):
        s.add(idle(b, f"1x{N}", cluster="north"))
        s.add(idle(b, "1x20 stale", cluster="west"))
    s.add(idle("a", f"1x{N}", cluster="south"))
    s.silent("1m", "LLMTooFewBackendsUp")
    s.expect("3m", "LLMTooFewBackendsUp", {"cluster": "south", VALUE: 1})
    s.expect("8m", "LLMTooFewBackendsUp", {"cluster": "south", VALUE: 1}, {"cluster": "west", VALUE: 0})
    s.expect("11m", "LLMBackendTargetMissing", {"cluster": "west", "backend": "a"}, {"cluster": "west", "backend": "b"})
    passes(tmp_path, rules_with(tmp_path, group_labels=("cluster",), min_backends_up=2), s)


def test_stalled_alert_keeps_namespace_for_alertmanagerconfig_routes(tmp_path: Path) -> None:
    groups = {"cluster": "east", "namespace": "team-a"}
    s = Scenario("stalled from counters, and from the exporter's verdict, in namespace team-a")
    s.add(vllm_backend("stuck", running=f"3x{N}", waiting=f"2x{N}", progress=f"0+100x20 2000x{N}", up=f"1x{N}",
                       groups=groups))
    s.add(vllm_backend("expstuck", running=f"1x{N}", waiting=f"0x{N}", progress=f"0+10x{N}", up=f"1x{N}",
                       groups=groups))
    s.add(exporter_series("llm_health_verdict_code", {"backend": "expstuck", **groups}, f"2x8 5x{N}"))
    s.add(series("up", {**EXPORTER, **groups}, f"1x{N}"))
    s.silent("2m", "LLMBackendStalled")   # the verdict says stalled from 2m15s; the alert has no `for` of its own
    s.expect("2m30s", "LLMBackendStalled", {"backend": "expstuck", **groups})
    s.expect("8m30s", "LLMBackendStalled", {"backend": "expstuck", **groups}, {"backend": "stuck", **groups})
    s.silent("8m30s", "LLMHealthExporterDown")
    passes(tmp_path, rules_with(tmp_path, group_labels=("cluster", "namespace")), s)


def test_every_aggregation_keeps_the_group_labels() -> None:
    texts = render(RuleSettings(group_labels=("cluster", "namespace")))
    clauses = [c for text in texts.values() for c in re.findall(r"\b(?:by|on) \(([^)]*)\)", text)]
    assert len(clauses) > 40
    for inside in clauses:
        if inside.strip():  # `on ()`: the labelless fallbacks
            assert inside.startswith("cluster, namespace"), inside
    default = render(RuleSettings())
    assert "cluster" not in "".join(default.values())


def test_bad_group_labels_are_refused() -> None:
    for labels in (("backend",), ("instance",), ("9x",), ("__name__",), ("a", "a")):
        with pytest.raises(ConfigError, match="--group-labels"):
            render(RuleSettings(group_labels=labels))


# --- alert details ------------------------------------------------------------------------------------


def test_keep_firing_for_only_on_threshold_alerts_never_on_remediation(tmp_path: Path) -> None:
    rules = alert_rules(rules_with(tmp_path, watchdog=True))
    assert set(rules) == set(ALERT_NAMES)
    kept = {name for name, rule in rules.items() if "keep_firing_for" in rule}
    assert kept == THRESHOLD_ALERTS
    assert all(rules[name]["keep_firing_for"] == "5m" for name in kept)
    for name in REMEDIATION_ALERTS:
        assert rules[name]["labels"]["remediation"] == "restart"
        assert "keep_firing_for" not in rules[name]
    off = alert_rules(rules_with(tmp_path / "off", keep_firing_for="0s"))
    assert not any("keep_firing_for" in rule for rule in off.values())
    result = subprocess.run([PROMTOOL, "check", "rules", *map(str, rules_with(tmp_path / "k", keep_firing_for="90s"))],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_keep_firing_for_holds_then_resolves_and_off_resolves_at_once(tmp_path: Path) -> None:
    passes(tmp_path, rules_with(tmp_path), error_rate_quiet(keep_firing=True))
    passes(tmp_path / "off", rules_with(tmp_path / "off", keep_firing_for="0s"), error_rate_quiet(keep_firing=False))


def test_severity_override_and_extra_labels_reach_the_alerts(tmp_path: Path) -> None:
    files = rules_with(tmp_path, severity=(("LLMTooFewBackendsUp", "page"), ("LLMBackendRestarted", "none")),
                       extra_labels=(("team", "ml-platform"), ("note", 'a "quoted" value: with # and $x')))
    rules = alert_rules(files)
    for rule in rules.values():
        assert rule["labels"]["team"] == "ml-platform" and rule["labels"]["note"] == 'a "quoted" value: with # and $x'
    assert rules["LLMTooFewBackendsUp"]["labels"]["severity"] == "page"
    assert rules["LLMBackendRestarted"]["labels"]["severity"] == "none"
    assert rules["LLMBackendStalled"]["labels"] == {"severity": "critical", "remediation": "restart",
                                                    "team": "ml-platform", "note": 'a "quoted" value: with # and $x'}
    s = Scenario("every backend gone: the fleet alert carries the overrides")
    s.add(idle("a", "1x20 stale"))
    s.expect("8m", "LLMTooFewBackendsUp", {VALUE: 0})   # expected labels come from the rendered rule
    passes(tmp_path, files, s)


def test_cli_severity_and_extra_label_flags(tmp_path: Path) -> None:
    done = subprocess.run(
        llm_health("rules", "render", "--out", tmp_path, "--severity", "LLMKVCachePressure=page",
                   "--severity", "LLMTimeToFirstTokenHigh:critical=page",
                   "--extra-label", "team=ml", "--extra-label", "env=prod", "--keep-firing-for", "10m", "--check"),
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    rules = alert_rules(sorted(tmp_path.glob("*.yml")))
    assert rules["LLMKVCachePressure"]["labels"] == {"severity": "page", "team": "ml", "env": "prod"}
    assert rules["LLMKVCachePressure"]["keep_firing_for"] == "10m"
    levels = alert_levels(sorted(tmp_path.glob("*.yml")))
    # a two-level alert: ALERT=LEVEL is its first level, ALERT:critical=LEVEL its second
    assert [r["labels"]["severity"] for r in levels["LLMKVCachePressure"]] == ["page", "critical"]
    assert [r["labels"]["severity"] for r in levels["LLMTimeToFirstTokenHigh"]] == ["warning", "page"]
    for flags, word in ((["--severity", "LLMNope=critical"], "no alert named"),
                        (["--severity", "LLMKVCachePressure=critical"], "would all be critical"),
                        (["--severity", "LLMKVCachePressure:warning=page"], "no alert named"),
                        (["--severity", "LLMBackendStalled:critical=page"], "no alert named"),
                        (["--severity", "LLMKVCachePressure=Very Bad"], "lowercase"),
                        (["--extra-label", "severity=x"], "set by the rules"),
                        (["--extra-label", "remediation=restart"], "set by the rules"),
                        (["--extra-label", "team"], "KEY=VALUE"),
                        (["--extra-label", "team={{ $labels.backend }}"], "templates"),
                        (["--keep-firing-for", "soon"], "--keep-firing-for")):
        out = tmp_path / "bad"
        bad = subprocess.run(llm_health("rules", "render", "--out", out, *flags),
                             capture_output=True, text=True, timeout=60, check=False)
        assert bad.returncode == 2, (flags, bad.stderr)
        assert word in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert not out.exists()


def test_value_in_descriptions_where_it_helps() -> None:
    text = render(RuleSettings())["llm_health_alerts.yml"]
    parsed = {r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"]}
    for name in ("LLMKVCachePressure", "LLMPreemptions", "LLMBackendErrorRate", "LLMBackendRestartLoop",
                 "LLMTooFewBackendsUp"):
        assert "$value" in parsed[name]["annotations"]["description"], name
