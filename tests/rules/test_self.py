"""promtool unit tests for the llm-health.self group (issue 12, finding 1): per alert, a firing case
and a must-not-fire trap. Emitted as rules/tests/llm_health_self_test.yml (checked in; regenerate with
LLM_HEALTH_UPDATE_RULE_TESTS=1 pytest tests/rules/test_self.py) and run through the real promtool.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.promtool import (
    PROMTOOL,
    RULES_DIR,
    VALUE,
    Scenario,
    alert_levels,
    alert_rules,
    run_promtool_tests,
    series,
)

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make debs)")

SELF_RULES = RULES_DIR / "llm_health_self.yml"
CHECKED_IN = RULES_DIR / "tests" / "llm_health_self_test.yml"
REM = {"job": "llm-health-remediator"}
N = 300


def rem(name: str, labels: dict[str, str], values: str, instance: str = "rem-1:9411") -> dict[str, str]:
    return series(name, {**REM, "instance": instance, **labels}, values)


def remediator_down() -> Scenario:
    s = Scenario("one of two remediator instances dies at 10m; the other stays up")
    s.add(rem("up", {}, f"1x{N}", "rem-1:9411"))
    s.add(rem("up", {}, f"1x40 0x{N}", "rem-2:9411"))
    s.silent("10m", "LLMHealthRemediatorDown")
    s.silent("11m", "LLMHealthRemediatorDown")          # down, not yet for 2m
    s.expect("13m", "LLMHealthRemediatorDown", {**REM, "instance": "rem-2:9411"})
    return s


def remediator_absent() -> Scenario:
    s = Scenario("no remediator target at all (never deployed or removed from the scrape config)")
    s.add(series("up", {"job": "vllm", "instance": "x:8000"}, f"1x{N}"))
    s.expect("5m", "LLMHealthRemediatorDown", REM)
    return s


def remediator_unhealthy() -> Scenario:
    s = Scenario("remediator answers /metrics but its health checks fail from 10m (state file deleted)")
    s.add(rem("llm_health_remediator_healthy", {}, f"1x40 0x{N}", "rem-1:9411"))
    s.add(rem("llm_health_remediator_healthy", {}, f"1x{N}", "rem-2:9411"))
    s.silent("11m", "LLMHealthRemediatorUnhealthy")
    s.expect("13m", "LLMHealthRemediatorUnhealthy", {"instance": "rem-1:9411"})
    return s


def breaker() -> Scenario:
    s = Scenario("the fleet breaker opens at 10m and is reset at 30m; two workers answer scrapes")
    s.add(rem("llm_health_remediator_breaker_open", {}, f"0x40 1x80 0x{N}", "rem-1:9411"))
    s.add(rem("llm_health_remediator_breaker_open", {}, f"0x40 1x80 0x{N}", "rem-2:9411"))
    s.silent("9m", "LLMHealthBreakerOpen")
    s.expect("12m", "LLMHealthBreakerOpen", {"job": "llm-health-remediator"})
    s.silent("35m", "LLMHealthBreakerOpen")
    return s


def no_leader() -> Scenario:
    s = Scenario("two instances on one state; a failover at 5m leaves the lease lapsed 20 s; from 10m nobody renews it")
    for inst in ("rem-1:9411", "rem-2:9411"):
        s.add(rem("llm_health_remediator_lease_seconds_left", {}, f"4x19 -1 3x19 -1x{N}", inst))
    s.silent("5m", "LLMHealthNoLeader")                  # a lapse while the next holder takes over
    s.silent("10m30s", "LLMHealthNoLeader")
    s.expect("12m", "LLMHealthNoLeader", REM)
    return s


def split_authority() -> Scenario:
    s = Scenario("a failover at 5m both instances see; from 10m one instance reports a holder of its own")
    s.add(rem("llm_health_remediator_lease_holder_info", {"holder": "a"}, "1x19 stale", "rem-1:9411"))
    s.add(rem("llm_health_remediator_lease_holder_info", {"holder": "a"}, "1x19 stale", "rem-2:9411"))
    s.add(rem("llm_health_remediator_lease_holder_info", {"holder": "b"}, f"_x19 1x{N}", "rem-1:9411"))
    s.add(rem("llm_health_remediator_lease_holder_info", {"holder": "b"}, "_x19 1x20 stale", "rem-2:9411"))
    s.add(rem("llm_health_remediator_lease_holder_info", {"holder": "c"}, f"_x39 1x{N}", "rem-2:9411"))
    s.silent("6m", "LLMHealthSplitAuthority")
    s.silent("11m", "LLMHealthSplitAuthority")
    s.expect("13m", "LLMHealthSplitAuthority", REM)
    return s


def rollout_failed() -> Scenario:
    """A rollout's rollback did not complete (failed) from 10m; an earlier one only rolled back (no page)."""
    s = Scenario("rollout 3 rolled back at 5m (fine); rollout 4 failed its rollback at 10m; two workers")
    for inst in ("rem-1:9411", "rem-2:9411"):
        s.add(rem("llm_health_remediator_rollout_state", {"rollout": "3", "state": "rolled_back"}, "0x20 1x20 stale",
                  inst))
        s.add(rem("llm_health_remediator_rollout_state", {"rollout": "4", "state": "failed"}, f"0x40 1x{N}", inst))
        s.add(rem("llm_health_remediator_rollout_state", {"rollout": "4", "state": "rolling_back"}, f"1x40 0x{N}",
                  inst))
    s.silent("9m", "LLMHealthRolloutFailed")
    s.silent("10m", "LLMHealthRolloutFailed")              # not for 1m yet
    s.expect("12m", "LLMHealthRolloutFailed", {"job": "llm-health-remediator", "rollout": "4"})
    return s


def needs_ack() -> Scenario:
    s = Scenario("gpu-a needs an ack from 10m, gpu-b goes to ERROR at 10m, gpu-c to ERROR for 1m only")
    s.add(rem("llm_health_remediator_needs_ack", {"backend": "gpu-a"}, f"0x40 1x{N}"))
    s.add(rem("llm_health_remediator_needs_ack", {"backend": "gpu-b"}, f"0x{N}"))
    s.add(rem("llm_health_remediator_needs_ack", {"backend": "gpu-c"}, f"0x{N}"))
    s.add(rem("llm_health_remediator_lifecycle_state", {"backend": "gpu-b", "state": "error"}, f"0x40 1x{N}"))
    s.add(rem("llm_health_remediator_lifecycle_state", {"backend": "gpu-b", "state": "ready"}, f"1x40 0x{N}"))
    s.add(rem("llm_health_remediator_lifecycle_state", {"backend": "gpu-c", "state": "error"}, f"0x40 1x4 0x{N}"))
    s.add(rem("llm_health_remediator_lifecycle_state", {"backend": "gpu-a", "state": "ready"}, f"1x{N}"))
    s.silent("12m", "LLMHealthBackendNeedsAck")
    s.expect("16m", "LLMHealthBackendNeedsAck", {"backend": "gpu-a"}, {"backend": "gpu-b"})
    return s


def host_needs_attention() -> Scenario:
    s = Scenario("gpu-a's headroom never passed after its stop at 10m; a person acknowledges it at 30m")
    s.add(rem("llm_health_remediator_host_needs_attention", {"backend": "gpu-a"}, f"0x40 1x80 0x{N}"))
    s.add(rem("llm_health_remediator_host_needs_attention", {"backend": "gpu-b"}, f"0x{N}"))
    s.silent("9m", "LLMHealthHostNeedsAttention")
    s.expect("11m", "LLMHealthHostNeedsAttention", {"backend": "gpu-a"})    # at once: no `for`
    s.silent("31m", "LLMHealthHostNeedsAttention")
    return s


def restarts_failing() -> Scenario:
    s = Scenario("gpu-a's restart command fails 3 times in an hour; gpu-b restarts fine 5 times, fails once")
    # one failure every 20 minutes for gpu-a (the '3 failed per hour and never an escalation')
    s.add(rem("llm_health_remediator_restarts_total", {"backend": "gpu-a", "result": "failed"},
              "0x20 1x80 2x80 3x80 3x40"))
    s.add(rem("llm_health_remediator_restarts_total", {"backend": "gpu-b", "result": "ok"}, "0+0.02x300"))
    s.add(rem("llm_health_remediator_restarts_total", {"backend": "gpu-b", "result": "failed"}, "0x100 1x200"))
    s.silent("30m", "LLMHealthRestartsFailing")
    s.expect("46m", "LLMHealthRestartsFailing", {"backend": "gpu-a"})
    return s


def webhook_failing() -> Scenario:
    s = Scenario("am-1 fails every webhook retry from 10m; am-2 fails once at 10m and recovers; email fails")
    am = {"job": "alertmanager"}
    s.add(series("alertmanager_notifications_failed_total", {**am, "instance": "am-1:9093", "integration": "webhook"},
                 "0x40 0+1x260"))
    s.add(series("alertmanager_notifications_failed_total", {**am, "instance": "am-2:9093", "integration": "webhook"},
                 f"0x40 1x{N}"))
    s.add(series("alertmanager_notifications_failed_total", {**am, "instance": "am-1:9093", "integration": "email"},
                 "0x40 0+1x260"))
    s.silent("15m", "LLMHealthWebhookDeliveryFailing")
    s.expect("25m", "LLMHealthWebhookDeliveryFailing", {"instance": "am-1:9093", "integration": "webhook"})
    return s


def discovery_stale() -> Scenario:
    s = Scenario("the exporter's discovery fails from 10m; the remediator's fails for 5m only")
    s.add(series("llm_health_discovery_stale", {"job": "llm-health-exporter", "instance": "ex-1:9410"}, f"0x40 1x{N}"))
    s.add(rem("llm_health_discovery_stale", {}, f"0x40 1x20 0x{N}"))
    s.silent("15m", "LLMHealthDiscoveryStale")
    s.expect("25m", "LLMHealthDiscoveryStale", {"job": "llm-health-exporter", "instance": "ex-1:9410"})
    return s


def backend_not_judged() -> Scenario:
    s = Scenario("the exporter judges a and c all along; its readings of b stop at 10m (readers taken)")
    ex = {"job": "llm-health-exporter", "instance": "ex-1:9410"}
    s.add(series("llm_health_reading_interval_seconds", ex, f"15x{N}"))
    s.add(series("llm_health_last_reading_timestamp_seconds", {**ex, "backend": "a"}, f"0+15x{N}"))
    s.add(series("llm_health_last_reading_timestamp_seconds", {**ex, "backend": "b"}, f"0+15x40 600x{N}"))
    # c is judged a little late every time (3 intervals behind): late, but not "not judged"
    s.add(series("llm_health_last_reading_timestamp_seconds", {**ex, "backend": "c"}, f"0x3 0+15x{N}"))
    s.silent("11m", "LLMHealthBackendNotJudged")       # 60 s old: 4 intervals, not more
    s.silent("12m", "LLMHealthBackendNotJudged")       # older, but not yet for 1m
    s.expect("13m", "LLMHealthBackendNotJudged", {**ex, "backend": "b", "$value": 180})
    return s


def discovery_duplicates() -> Scenario:
    s = Scenario("a rogue target copies a backend name in the remediator from 10m; the exporter sees a clash "
                 "for 1m only (a pod recreated while its old target lingers)")
    s.add(rem("llm_health_discovery_duplicate_names", {}, f"0x40 1x{N}"))
    s.add(series("llm_health_discovery_duplicate_names", {"job": "llm-health-exporter", "instance": "ex-1:9410"},
                 f"0x40 1x4 0x{N}"))
    s.silent("9m", "LLMHealthDiscoveryDuplicateNames")
    s.silent("11m", "LLMHealthDiscoveryDuplicateNames")       # for 1m only: not yet
    s.expect("13m", "LLMHealthDiscoveryDuplicateNames", {**REM, "instance": "rem-1:9411", VALUE: 1})
    return s


def stamps(every: int, until: int, total: int = 90) -> str:
    """A last-heard timestamp sampled every minute: a delivery at minute 1 and every `every` minutes after,
    none after minute `until` (the value then stays at the last delivery's time); 0 before the first."""
    values = []
    for minute in range(total + 1):
        last = 0 if minute < 1 else 1 + (min(minute, until) - 1) // every * every
        values.append(str(last * 60))
    return " ".join(values)


def not_hearing_alertmanager() -> Scenario:
    s = Scenario("the Watchdog reaches the remediator every 5m until 31m, then stops", interval="1m")
    s.add(rem("llm_health_remediator_last_watchdog_timestamp_seconds", {}, stamps(5, 31)))
    s.add(rem("llm_health_remediator_last_watchdog_timestamp_seconds", {}, stamps(5, 31), "rem-2:9411"))
    s.silent("30m", "LLMHealthRemediatorNotHearingAlertmanager")
    s.silent("46m", "LLMHealthRemediatorNotHearingAlertmanager")     # 15m since the last one at 31m: not yet
    s.expect("48m", "LLMHealthRemediatorNotHearingAlertmanager", {**REM, VALUE: 48 * 60 - 31 * 60})
    return s


def never_heard_without_a_watchdog_rule() -> Scenario:
    s = Scenario("no Watchdog was ever received and the rules have none (rendered without --watchdog)",
                 interval="1m")
    s.add(rem("llm_health_remediator_last_watchdog_timestamp_seconds", {}, "0x90"))
    s.silent("60m", "LLMHealthRemediatorNotHearingAlertmanager")
    return s


def webhook_failing_elsewhere() -> Scenario:
    s = Scenario("another receiver's webhook fails from 10m on while the remediator hears a Watchdog every 5m",
                 interval="1m")
    s.add(series("alertmanager_notifications_failed_total",
                 {"job": "alertmanager", "instance": "am-1:9093", "integration": "webhook"}, "0x10 1+1x80"))
    s.add(rem("llm_health_remediator_last_webhook_timestamp_seconds", {}, stamps(5, 90)))
    s.silent("40m", "LLMHealthWebhookDeliveryFailing")
    s.silent("80m", "LLMHealthWebhookDeliveryFailing")
    return s


def webhook_failing_ours() -> Scenario:
    s = Scenario("the remediator's webhook fails from 11m on: it hears nothing after its last Watchdog at 11m",
                 interval="1m")
    s.add(series("alertmanager_notifications_failed_total",
                 {"job": "alertmanager", "instance": "am-1:9093", "integration": "webhook"}, "0x11 1+1x80"))
    s.add(rem("llm_health_remediator_last_webhook_timestamp_seconds", {}, stamps(5, 11)))
    s.silent("24m", "LLMHealthWebhookDeliveryFailing")        # taken for ours from 16m, for 10m: at 26m
    s.expect("27m", "LLMHealthWebhookDeliveryFailing", {"instance": "am-1:9093", "integration": "webhook"})
    return s


def remediator_reload_failed() -> Scenario:
    s = Scenario("rem-1's config reload fails at 10m and stays failed; rem-2's fails for 4m, then a reload works",
                 interval="1m")
    s.add(rem("llm_health_remediator_config_last_reload_successful", {}, "1x10 0x60", "rem-1:9411"))
    s.add(rem("llm_health_remediator_config_last_reload_successful", {}, "1x10 0x4 1x60", "rem-2:9411"))
    s.silent("19m", "LLMHealthRemediatorConfigReloadFailed")
    s.expect("21m", "LLMHealthRemediatorConfigReloadFailed", {**REM, "instance": "rem-1:9411"})
    return s


def exporter_reload_failed() -> Scenario:
    ex = {"job": "llm-health-exporter"}
    s = Scenario("ex-1's config reload fails at 10m and stays failed; ex-2's fails for 4m only", interval="1m")
    s.add(series("llm_health_exporter_config_last_reload_successful", {**ex, "instance": "ex-1:9410"}, "1x10 0x60"))
    s.add(series("llm_health_exporter_config_last_reload_successful", {**ex, "instance": "ex-2:9410"},
                 "1x10 0x4 1x60"))
    s.silent("19m", "LLMHealthExporterConfigReloadFailed")
    s.expect("21m", "LLMHealthExporterConfigReloadFailed", {**ex, "instance": "ex-1:9410"})
    return s


SCENARIOS = [remediator_down, remediator_absent, remediator_unhealthy, breaker, no_leader, split_authority,
             rollout_failed, needs_ack, host_needs_attention,
             restarts_failing,
             webhook_failing, discovery_stale, backend_not_judged, discovery_duplicates, not_hearing_alertmanager,
             never_heard_without_a_watchdog_rule, webhook_failing_elsewhere, webhook_failing_ours,
             remediator_reload_failed, exporter_reload_failed]


def document(rule_files: list[Path], written_as: list[str] | None = None,
             scenarios: list[Scenario] | None = None) -> dict[str, Any]:
    rules = alert_levels(rule_files)
    return {
        "rule_files": written_as or [str(p) for p in rule_files],
        "evaluation_interval": "15s",
        "tests": [s.as_dict(rules) for s in (scenarios or [make() for make in SCENARIOS])],
    }


def test_checked_in_promtool_file_is_current() -> None:
    text = yaml.safe_dump(document([SELF_RULES], [f"../{SELF_RULES.name}"]), sort_keys=False, width=200)
    header = "# Generated by tests/rules/test_self.py; run: promtool test rules rules/tests/llm_health_self_test.yml\n"
    if os.environ.get("LLM_HEALTH_UPDATE_RULE_TESTS"):
        CHECKED_IN.write_text(header + text)
    assert CHECKED_IN.exists() and CHECKED_IN.read_text() == header + text, (
        "rules/tests/llm_health_self_test.yml is stale: LLM_HEALTH_UPDATE_RULE_TESTS=1 pytest tests/rules/test_self.py"
    )


def test_self_rules_pass_promtool(tmp_path: Path) -> None:
    result = run_promtool_tests(document([SELF_RULES]), tmp_path / "self_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_self_alert_has_a_firing_case_and_a_trap() -> None:
    fires = {c["alertname"] for make in SCENARIOS for c in make().alerts if c["exp_alerts"]}
    silent = {c["alertname"] for make in SCENARIOS for c in make().alerts if not c["exp_alerts"]}
    names = set(alert_rules([SELF_RULES])) - {"LLMHealthWatchdog"}
    assert names and names <= fires, f"alerts never shown firing: {sorted(names - fires)}"
    assert names <= silent, f"alerts never shown silent: {sorted(names - silent)}"


def test_watchdog_is_opt_in_and_always_fires(tmp_path: Path) -> None:
    from llm_health.render.rules import RuleSettings, write_rendered

    assert "LLMHealthWatchdog" not in alert_rules([SELF_RULES])
    files = [p for p in write_rendered(tmp_path, RuleSettings(watchdog=True)) if p.name == SELF_RULES.name]
    s = Scenario("the Watchdog fires from the first evaluation on, with no input at all")
    s.add(series("up", {"job": "whatever", "instance": "x"}, "1x10"))
    s.expect("0m", "LLMHealthWatchdog", {})
    s.expect("2m", "LLMHealthWatchdog", {})
    result = run_promtool_tests(document(files, scenarios=[s]), tmp_path / "watchdog_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_with_the_watchdog_rule_never_hearing_one_fires(tmp_path: Path) -> None:
    """Rendered with --watchdog the Watchdog exists: a remediator that never received one is not hearing."""
    from llm_health.render.rules import RuleSettings, write_rendered

    files = [p for p in write_rendered(tmp_path, RuleSettings(watchdog=True)) if p.name == SELF_RULES.name]
    s = Scenario("the remediator never received a Watchdog", interval="1m")
    s.add(rem("llm_health_remediator_last_watchdog_timestamp_seconds", {}, "0x90"))
    s.silent("15m", "LLMHealthRemediatorNotHearingAlertmanager")
    s.expect("17m", "LLMHealthRemediatorNotHearingAlertmanager", {**REM, VALUE: 17 * 60})
    s.expect("60m", "LLMHealthRemediatorNotHearingAlertmanager", {**REM, VALUE: 60 * 60})
    heard = Scenario("the remediator hears the Watchdog every 5m", interval="1m")
    heard.add(rem("llm_health_remediator_last_watchdog_timestamp_seconds", {}, stamps(5, 90)))
    heard.silent("60m", "LLMHealthRemediatorNotHearingAlertmanager")
    result = run_promtool_tests(document(files, scenarios=[s, heard]), tmp_path / "watchdog_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_self_group_alerts_have_runbooks() -> None:
    runbooks = (RULES_DIR.parent / "docs" / "runbooks.md").read_text().lower()
    for name, rule in alert_rules([SELF_RULES]).items():
        assert rule["annotations"]["runbook_url"].endswith("#" + name.lower())
        assert f"## {name.lower()}" in runbooks, name
