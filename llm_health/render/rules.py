"""`llm-health rules`: render the Prometheus rules from their templates, and check them with promtool.

    llm-health rules render [--out DIR] [--scrape-interval 15s] [--vllm-selector 'job="vllm"']
                            [--sglang-selector 'job="sglang"'] [--llamacpp-selector 'job="llamacpp"'] [--stall-window 2m] ...
    llm-health rules render --format prometheusrule [--k8s-name llm-health] [--k8s-namespace NS] [--k8s-label release=prom]
    llm-health rules render --format jsonnet --out mixin     # the rules and dashboards as a jsonnet mixin
    llm-health rules check [--dir DIR]

Windows read through rate/increase/changes/resets (RATE_WINDOWS) need several samples: each must be
at least MIN_SCRAPES_PER_WINDOW scrape intervals (--scrape-interval, default 15s). Left unset they are
derived (max(default, 4 x scrape interval)); set explicitly too short they are refused.

The templates live in the package (llm_health/render/templates/rules/) so an installed copy can render them.
Jinja delimiters are `<< >>`, `<% %>` and `<# #>`, so PromQL ranges and Prometheus' own `{{ }}`
annotation templates pass through untouched. Bad settings raise ConfigError and write nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from llm_health import promregex
from llm_health.config import ConfigError
from llm_health.render import prometheusrule, settingsfile

TEMPLATE_PACKAGE = "llm_health.render"
TEMPLATE_DIR = "templates/rules"
OUTPUTS = {
    "llm_health_records.yml.j2": "llm_health_records.yml",
    "llm_health_alerts.yml.j2": "llm_health_alerts.yml",
    "llm_health_self.yml.j2": "llm_health_self.yml",   # llm-health watching itself (group llm-health.self)
}
DEFAULT_OUT = Path("rules")  # relative to the working directory (the repo root in a checkout)

DURATION_RE = re.compile(r"^([0-9]+)(ms|s|m|h|d|w)$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# One or more label matchers: name op "value", comma separated; values without quotes or backslashes
# inside, so a selector can never close the braces it is placed in.
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"[^"\\{}\n]*"\s*'
SELECTOR_RE = re.compile(rf"^{_MATCHER}(,{_MATCHER})*$")
ZERO_DURATION_RE = re.compile(r"^0+(ms|s|m|h|d|w)?$")
URL_RE = re.compile(r"^https?://[^\s\"#{}<>]+$")
# A PromQL regex placed inside "...": no quotes, backslashes, braces or line breaks.
HANDLER_RE = re.compile(r'^[^"\\{}\n]+$')
LABEL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Labels the rules and dashboards set or aggregate by themselves; a group label must be another one.
RESERVED_GROUP_LABELS = {"backend", "instance", "engine", "signal", "le", "__name__"}
# Labels an --extra-label may not set: the alerts' own, and those their expressions carry.
RESERVED_ALERT_LABELS = {"alertname", "severity", "remediation", "category", "backend", "instance", "job",
                         "proxy", "engine", "signal"}
SEVERITY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# Every alert the templates define (a test holds this list to the rendered rules).
ALERT_NAMES = (
    "LLMBackendStalled", "LLMBackendDown", "LLMBackendRestarted", "LLMBackendRestartLoop", "LLMKVCachePressure",
    "LLMPreemptions", "LLMBackendErrorRate", "LLMMetricsBehindProxy", "LLMBackendNoMetrics",
    "LLMBackendVerdictUnknown", "LLMBackendTargetMissing", "LLMTooFewBackendsUp", "LLMProxyDown",
    "LLMHealthExporterDown", "LLMHealthProbeSentToBusyBackend",
    # saturation and latency: signals for people, never a restart
    "LLMQueueDepthHigh", "LLMQueueTimeHigh", "LLMTimeToFirstTokenHigh", "LLMTimeToFirstTokenSLOBreach",
    "LLMBackendAdmissionStalled", "LLMBackendDegraded",
    # llm-health.self
    "LLMHealthRemediatorDown", "LLMHealthRemediatorUnhealthy", "LLMHealthBreakerOpen", "LLMHealthNoLeader",
    "LLMHealthSplitAuthority", "LLMHealthRolloutFailed",
    "LLMHealthBackendNeedsAck",
    "LLMHealthHostNeedsAttention",
    "LLMHealthRestartsFailing", "LLMHealthWebhookDeliveryFailing", "LLMHealthWatchdog",
    "LLMHealthRemediatorNotHearingAlertmanager", "LLMHealthRemediatorConfigReloadFailed",
    "LLMHealthExporterConfigReloadFailed",
    "LLMHealthDiscoveryStale", "LLMHealthDiscoveryDuplicateNames", "LLMHealthBackendNotJudged",
)
# The two alerts that trigger restarts: their labels are a contract with the remediator's route.
REMEDIATION_ALERTS = ("LLMBackendStalled", "LLMBackendDown")
# Alerts with two levels (one alert name, one rule per level): the first level's severity is overridden
# with --severity ALERT=LEVEL, a further one's with --severity ALERT:DEFAULT=LEVEL (e.g.
# LLMKVCachePressure:critical=page). The levels of one alert must keep distinct severities.
TIERED_ALERTS: dict[str, tuple[str, ...]] = {
    "LLMKVCachePressure": ("warning", "critical"),
    "LLMTimeToFirstTokenHigh": ("warning", "critical"),
}


# Windows read through rate/increase/changes/resets, with their defaults at the default scrape interval.
RATE_WINDOWS = {
    "stall_window": "2m",
    "restart_window": "5m",
    "rate_window": "1m",
    "proxy_window": "15m",
    "probe_busy_window": "5m",
    "webhook_window": "5m",
    "latency_window": "5m",
    "queue_time_window": "15m",
    "ttft_slo_window": "1h",
    "degraded_window": "30m",
}
MIN_SCRAPES_PER_WINDOW = 4
# The runbook base when the operator has not set one: a placeholder under .invalid (RFC 6761: never
# resolves, so a link can never open somebody else's page) whose name says what to do. A render with
# it says so on stderr (runbook_warning). The remediator serves the runbooks at /runbooks; only the
# operator knows the address people reach it at.
DEFAULT_RUNBOOK_BASE_URL = "https://runbook-base-url-not-set.invalid/runbooks"
_LOOPBACK_HOST = re.compile(r"^(localhost|127(\.[0-9]+){3}|\[::1\])(:[0-9]+)?$")
# Settings whose flag is not --FIELD-NAME (first is shown in errors and help; the rest are aliases).
FLAG_NAMES = {"runbook_url": ("--runbook-base-url", "--runbook-url"), "extra_labels": ("--extra-label",)}
FORMATS = ("rules", "prometheusrule", "jsonnet")
FLAG_HELP = {
    "scrape_interval": "Prometheus' scrape interval for the engines and the exporter; the rate windows must hold 4 scrapes",
    "vllm_selector": "label matchers of the vLLM scrape targets",
    "sglang_selector": "label matchers of the SGLang scrape targets (must not match another engine's)",
    "llamacpp_selector": "label matchers of the llama.cpp (llama-server) scrape targets (must not match another engine's)",
    "down_for": "grace before LLMBackendDown; must exceed the model load time",
    "down_busy_grace": "failed scrapes within this long of a reading with work in flight are not 'down'",
    "error_rate_threshold": "LLMBackendErrorRate: share (0..1) of 5xx among generation responses over the rate window",
    "error_rate_for": "LLMBackendErrorRate: the share stays above the threshold this long",
    "error_rate_handlers": "LLMBackendErrorRate: regex of vLLM's generation handlers (http_requests_total handler label)",
    "runbook_url": "URL serving docs/runbooks.md (the remediator's /runbooks); alerts link to BASE#alertname",
    "keep_firing_for": "the threshold alerts (KV pressure, preemptions, error rate) keep firing this long after "
                       "their condition clears, against flapping; 0s = off (Prometheus < 2.42 needs 0s)",
    "severity": "ALERT=LEVEL: another severity label for one alert (repeatable); for the second level of "
                "LLMKVCachePressure or LLMTimeToFirstTokenHigh: ALERT:critical=LEVEL",
    "kv_threshold": "LLMKVCachePressure warning: KV-cache usage (0..1) of the fullest engine above this",
    "kv_critical_threshold": "LLMKVCachePressure critical: KV-cache usage (0..1) above this (>= --kv-threshold)",
    "latency_window": "window of the TTFT / end-to-end / inter-token latency quantiles and means and the "
                      "prefix-cache hit ratio",
    "queue_depth_threshold": "LLMQueueDepthHigh: requests waiting in the engine's queue above this",
    "queue_time_window": "LLMQueueTimeHigh: mean queue time over this window",
    "queue_time_threshold": "LLMQueueTimeHigh: mean queue time in seconds above this",
    "ttft_threshold": "LLMTimeToFirstTokenHigh warning: TTFT p99 in seconds above this",
    "ttft_critical_threshold": "LLMTimeToFirstTokenHigh critical: TTFT p99 in seconds above this (>= --ttft-threshold)",
    "ttft_slo_threshold": "LLMTimeToFirstTokenSLOBreach: TTFT p95 over --ttft-slo-window in seconds above this",
    "ttft_slo_window": "LLMTimeToFirstTokenSLOBreach: the SLO's window",
    "admission_stalled_for": "LLMBackendAdmissionStalled: requests waiting and none running for this long",
    "degraded_factor": "LLMBackendDegraded: mean inter-token latency above this many times the backend's own baseline",
    "degraded_window": "LLMBackendDegraded: the mean inter-token latency compared is over this window",
    "degraded_baseline": "LLMBackendDegraded: the baseline is the median of that mean over this much history "
                         "before the window",
    "degraded_min_tokens": "LLMBackendDegraded: at least this many tokens (inter-token intervals) in the window",
    "extra_labels": "KEY=VALUE: a label added to every alert (repeatable), e.g. team=ml-platform",
    "not_judged_intervals": "LLMHealthBackendNotJudged: a backend's last judged reading older than this many "
                            "reading intervals (the exporter's llm_health_reading_interval_seconds)",
    "not_judged_for": "LLMHealthBackendNotJudged: ... for this long",
    "group_labels": "comma-separated labels kept in every aggregation next to `backend` (e.g. cluster,namespace): "
                    "one backend name may exist once per group",
}
FIXED_WINDOWS = {"1h": "the 1h restart count (LLMBackendRestartLoop)"}
# The engines' latency histograms (rules/*_metric_names.yml), per kind: (engine, wire name without the
# _bucket/_sum/_count suffix) in order of preference. vLLM 0.10-0.11 export both inter-token names with
# the same observations: per target the new name wins (`or`), never both added. llama.cpp has none
# (its mean time per predicted token comes from two counters, see the records).
LATENCY_HISTOGRAMS: dict[str, tuple[tuple[str, str], ...]] = {
    "ttft": (("vllm", "vllm:time_to_first_token_seconds"), ("sglang", "sglang:time_to_first_token_seconds")),
    "e2e": (("vllm", "vllm:e2e_request_latency_seconds"), ("sglang", "sglang:e2e_request_latency_seconds")),
    "itl": (("vllm", "vllm:inter_token_latency_seconds"), ("vllm", "vllm:time_per_output_token_seconds"),
            ("sglang", "sglang:inter_token_latency_seconds")),
    "queue": (("vllm", "vllm:request_queue_time_seconds"), ("sglang", "sglang:queue_time_seconds")),
}


def format_duration(seconds: float) -> str:
    """The shortest single-unit Prometheus duration for `seconds` (whole milliseconds)."""
    ms = round(seconds * 1000)
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def parse_duration(text: str, flag: str) -> float:
    """Seconds in a Prometheus duration like 90s, 2m, 1h (one unit only)."""
    match = DURATION_RE.match(text)
    if not match or int(match.group(1)) == 0:
        raise ConfigError(f"{flag}: {text!r} is not a Prometheus duration like 30s, 2m or 1h")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@dataclass(frozen=True)
class RuleSettings:
    """Everything a rendering can change. Field metadata is the command-line help."""

    vllm_selector: str = 'job="vllm"'
    sglang_selector: str = 'job="sglang"'      # SGLang targets (--enable-metrics); must not match vLLM's
    llamacpp_selector: str = 'job="llamacpp"'  # llama-server targets (--metrics); must not match the others
    exporter_selector: str = 'job="llm-health-exporter"'
    scrape_interval: str = "15s"      # Prometheus' scrape interval for vLLM and the exporter (an assumption)
    # Windows of RATE_WINDOWS: None = derived, max(default, MIN_SCRAPES_PER_WINDOW x scrape_interval).
    stall_window: str | None = None   # no progress with work present for this long = stalled (2m)
    stall_for: str = "0s"             # ... on consecutive evaluations for this long before firing: none by
    #                                   default, the evidence is waited out once (the window; the exporter's
    #                                   two frozen readings over its step-derived bound), never stacked
    down_for: str = "2m"              # must exceed the model load time (a restarted vLLM refuses until loaded)
    # LLMBackendStalled and LLMBackendDown, the two restart triggers, are evaluated in a group of their own
    # (llm-health.restart) this often: a scraped stalled verdict fires within it, not within the global
    # evaluation interval. Every other rule keeps the global interval.
    restart_evaluation_interval: str = "5s"
    down_busy_grace: str = "10m"      # failed scrapes within this long of a reading with work are not "down"
    restart_window: str | None = None  # LLMBackendRestarted looks back this far (5m)
    restart_loop_threshold: int = 3   # more restarts than this in an hour = LLMBackendRestartLoop
    rate_window: str | None = None    # generation tokens / preemptions per second (1m)
    kv_threshold: float = 0.90        # LLMKVCachePressure, severity warning
    kv_for: str = "10m"
    kv_critical_threshold: float = 0.95   # LLMKVCachePressure, severity critical
    kv_critical_for: str = "5m"
    preemption_rate_threshold: float = 0.0
    preemption_for: str = "10m"
    # LLMBackendErrorRate (signal only, category="error-rate"): 5xx share of generation responses.
    error_rate_threshold: float = 0.05
    error_rate_for: str = "2m"
    error_rate_handlers: str = "/v1/chat/completions|/v1/completions|/v1/responses"
    proxy_window: str | None = None   # (15m)
    # Saturation and latency signals (for people; none carries a remediation label). Records per backend
    # and per backend and model; windows of RATE_WINDOWS derived like the others.
    latency_window: str | None = None     # TTFT / e2e / ITL quantiles and means, prefix-cache hits (5m)
    queue_depth_threshold: int = 50       # LLMQueueDepthHigh: requests waiting
    queue_depth_for: str = "5m"
    queue_time_window: str | None = None  # LLMQueueTimeHigh: mean queue time over this (15m)
    queue_time_threshold: float = 30.0    # seconds
    queue_time_for: str = "5m"
    ttft_threshold: float = 10.0          # LLMTimeToFirstTokenHigh warning: TTFT p99, seconds
    ttft_for: str = "10m"
    ttft_critical_threshold: float = 30.0  # ... critical
    ttft_critical_for: str = "5m"
    ttft_slo_threshold: float = 3.0       # LLMTimeToFirstTokenSLOBreach: TTFT p95 over the SLO window
    ttft_slo_window: str | None = None    # (1h)
    ttft_slo_for: str = "15m"
    admission_stalled_for: str = "5m"     # LLMBackendAdmissionStalled: waiting > 0, running == 0
    degraded_factor: float = 1.8          # LLMBackendDegraded: ITL over the window > factor x own baseline
    degraded_window: str | None = None    # (30m)
    degraded_baseline: str = "1d"         # the baseline: median of the window's mean over this history
    degraded_for: str = "15m"
    degraded_min_tokens: int = 1000       # ... with at least this many tokens in the window
    no_metrics_for: str = "5m"
    unknown_for: str = "10m"
    missing_window: str = "1h"
    missing_for: str = "5m"
    min_backends_up: int = 1
    proxy_down_for: str = "2m"
    exporter_down_for: str = "5m"
    probe_busy_window: str | None = None  # (5m)
    # Base of every alert's runbook_url (flag --runbook-base-url): the remediator serves docs/runbooks.md
    # at /runbooks; each alert links to its section (#alertname, lowercase). Unset, it is a placeholder
    # that never resolves (and the render warns); set the address people reach the remediator at
    # (docs/install.md, docs/kubernetes.md).
    runbook_url: str = DEFAULT_RUNBOOK_BASE_URL
    exporter: bool = True             # False: rules over vLLM's metrics only (no exporter alerts/branches)
    # llm-health.self: the remediator and Alertmanager's deliveries to it
    remediator_selector: str = 'job="llm-health-remediator"'
    webhook_selector: str = 'integration="webhook"'
    remediator_down_for: str = "2m"
    needs_ack_for: str = "5m"
    restart_failures_threshold: int = 3
    webhook_window: str | None = None  # LLMHealthWebhookDeliveryFailing's increase() window (5m)
    webhook_failing_for: str = "10m"
    watchdog: bool = False            # True: the always-firing LLMHealthWatchdog (for a dead man's switch)
    not_judged_intervals: int = 4     # LLMHealthBackendNotJudged: last reading older than this many intervals
    not_judged_for: str = "1m"
    # Target labels that tell backends of the same name apart (cluster, namespace, ...): rendered into
    # every `by (...)`/`on (...)` of the rules and the dashboards, and a dashboard variable each.
    group_labels: tuple[str, ...] = ()
    keep_firing_for: str = "5m"       # on the threshold alerts only; "0s" = off (Prometheus >= 2.42 has it)
    severity: tuple[tuple[str, str], ...] = ()       # (alert, level) overrides, --severity ALERT=LEVEL
    extra_labels: tuple[tuple[str, str], ...] = ()   # (name, value) on every alert, --extra-label KEY=VALUE

    def validated(self) -> RuleSettings:
        """A copy with every derived window filled in; ConfigError naming the flag on bad input."""
        s = self._with_windows()
        for f in fields(s):
            value = getattr(s, f.name)
            flag = _flag(f.name)
            if f.name.endswith("_selector"):
                if not isinstance(value, str) or not SELECTOR_RE.match(value):
                    raise ConfigError(f'{flag}: {value!r} must be label matchers like job="vllm"')
            elif f.name == "runbook_url":
                if not URL_RE.match(value):
                    raise ConfigError(f"{flag}: {value!r} must be an http(s) URL without a fragment")
            elif f.name == "error_rate_handlers":
                _check_handler_regex(value, flag)
            elif f.name == "group_labels":
                _check_group_labels(value, flag)
            elif f.name == "severity":
                _check_severities(value, flag)
            elif f.name == "extra_labels":
                _check_extra_labels(value, flag, s.group_labels)
            elif f.name in ("keep_firing_for", "stall_for"):         # 0s: fire at the first evaluation
                if not ZERO_DURATION_RE.match(value):
                    parse_duration(value, flag)
            elif isinstance(value, bool):
                continue
            elif isinstance(value, str):
                parse_duration(value, flag)
        if not 0 < s.kv_threshold <= 1:
            raise ConfigError(f"--kv-threshold: {s.kv_threshold} must be in (0, 1]")
        if not s.kv_threshold <= s.kv_critical_threshold <= 1:
            raise ConfigError(f"--kv-critical-threshold: {s.kv_critical_threshold} must be in "
                              f"[--kv-threshold ({s.kv_threshold}), 1]")
        for name in ("queue_depth_threshold", "queue_time_threshold", "ttft_threshold", "ttft_slo_threshold",
                     "degraded_min_tokens"):
            if getattr(s, name) <= 0:
                raise ConfigError(f"{_flag(name)}: must be > 0")
        if s.ttft_critical_threshold < s.ttft_threshold:
            raise ConfigError(f"--ttft-critical-threshold: {s.ttft_critical_threshold} must be >= "
                              f"--ttft-threshold ({s.ttft_threshold})")
        if s.degraded_factor <= 1:
            raise ConfigError(f"--degraded-factor: {s.degraded_factor} must be > 1 (a multiple of the baseline)")
        assert s.degraded_window is not None
        if parse_duration(s.degraded_baseline, "--degraded-baseline") < 2 * parse_duration(s.degraded_window, "--degraded-window"):
            raise ConfigError(f"--degraded-baseline: {s.degraded_baseline} must be at least twice --degraded-window "
                              f"({s.degraded_window})")
        _check_tiers(s)
        if not 0 < s.error_rate_threshold < 1:
            raise ConfigError(f"--error-rate-threshold: {s.error_rate_threshold} must be in (0, 1)")
        if s.preemption_rate_threshold < 0:
            raise ConfigError("--preemption-rate-threshold: must be >= 0")
        if s.restart_failures_threshold < 1:
            raise ConfigError("--restart-failures-threshold: must be >= 1")
        if s.restart_loop_threshold < 1:
            raise ConfigError("--restart-loop-threshold: must be >= 1")
        if s.min_backends_up < 1:
            raise ConfigError("--min-backends-up: must be >= 1")
        if s.not_judged_intervals < 2:
            raise ConfigError("--not-judged-intervals: must be >= 2 (one late reading is normal)")
        return s

    def _with_windows(self) -> RuleSettings:
        """Derive the unset rate windows from the scrape interval; refuse explicit ones that are too short."""
        scrape = parse_duration(self.scrape_interval, "--scrape-interval")
        minimum = MIN_SCRAPES_PER_WINDOW * scrape
        for window, what in FIXED_WINDOWS.items():
            if parse_duration(window, window) < minimum:
                raise ConfigError(
                    f"--scrape-interval: {self.scrape_interval} is too long for {what}: "
                    f"{window} must span at least {MIN_SCRAPES_PER_WINDOW} scrapes"
                )
        derived: dict[str, str] = {}
        for name, default in RATE_WINDOWS.items():
            value = getattr(self, name)
            flag = _flag(name)
            if value is None:
                derived[name] = format_duration(max(parse_duration(default, flag), minimum))
            elif not isinstance(value, str):
                raise ConfigError(f"{flag}: {value!r} is not a Prometheus duration like 30s, 2m or 1h")
            elif parse_duration(value, flag) < minimum:
                raise ConfigError(
                    f"{flag}: {value} is shorter than {MIN_SCRAPES_PER_WINDOW} scrape intervals "
                    f"({format_duration(minimum)} at --scrape-interval {self.scrape_interval}): "
                    f"rate()/changes()/resets() over it would be empty or noise. Use {flag} "
                    f"{format_duration(minimum)} or more, or pass the real --scrape-interval"
                )
        if ZERO_DURATION_RE.match(str(self.keep_firing_for)):
            derived["keep_firing_for"] = "0s"
        return replace(self, **derived)

    # helpers used by the templates
    def seconds(self, duration: str) -> str:
        value = parse_duration(duration, "duration")
        return f"{value:g}"

    @property
    def kv_percent(self) -> str:
        return f"{self.kv_threshold * 100:g}"

    @property
    def kv_critical_percent(self) -> str:
        return f"{self.kv_critical_threshold * 100:g}"

    @property
    def error_rate_percent(self) -> str:
        return f"{self.error_rate_threshold * 100:g}"

    @property
    def min_scrapes(self) -> int:
        return MIN_SCRAPES_PER_WINDOW

    def severity_for(self, alert: str, default: str) -> str:
        """The severity of `alert` (of its level `default`: a tiered alert's further levels are keyed
        ALERT:DEFAULT in --severity)."""
        key = alert
        if alert in TIERED_ALERTS and default != TIERED_ALERTS[alert][0]:
            key = f"{alert}:{default}"
        return dict(self.severity).get(key, default)

    def alert_labels(self, alert: str, severity: str, own: dict[str, str] | None = None) -> str:
        """An alert's `labels:` block: its severity (--severity), its own fixed labels, then every
        --extra-label (values JSON-quoted, which is a double-quoted YAML string)."""
        if alert in TIERED_ALERTS:
            assert severity in TIERED_ALERTS[alert], (alert, severity)
        lines = ["        labels:", f"          severity: {self.severity_for(alert, severity)}"]
        lines += [f"          {key}: {value}" for key, value in (own or {}).items()]
        lines += [f"          {key}: {json.dumps(value)}" for key, value in self.extra_labels]
        return "\n".join(lines)

    @property
    def group_text(self) -> str:
        """` in {{ $labels.cluster }}/{{ $labels.namespace }}` for summaries; empty without group labels."""
        if not self.group_labels:
            return ""
        return " in " + "/".join(f"{{{{ $labels.{g} }}}}" for g in self.group_labels)

    @property
    def stall_window_seconds(self) -> str:
        """The stall window in seconds (the exporter's stall bound is compared with it)."""
        assert self.stall_window is not None
        return f"{parse_duration(self.stall_window, '--stall-window'):g}"

    def labels(self, *names: str) -> str:
        """The group labels followed by `names`, comma separated: the inside of a by (...)/on (...)."""
        return ", ".join((*self.group_labels, *names))

    def engine_selector(self, engine: str) -> str:
        """The label matchers of an engine's own series. SGLang: tp_rank 0 / pp_rank 0 only (every rank
        repeats the scheduler's series; `=~"|0"` also matches pages without the labels)."""
        if engine == "sglang":
            return f'{self.sglang_selector}, tp_rank=~"|0", pp_rank=~"|0"'
        return str(getattr(self, f"{engine}_selector"))

    def hist(self, kind: str, suffix: str, window: str, fn: str = "rate") -> str:
        """`fn(<histogram>_<suffix>{selector}[window])` of every engine's histogram of `kind`
        (LATENCY_HISTOGRAMS), joined by `or` one per line: the first name present wins per target."""
        return "\nor ".join(f"{fn}({name}_{suffix}{{{self.engine_selector(engine)}}}[{window}])"
                            for engine, name in LATENCY_HISTOGRAMS[kind])


def _check_handler_regex(value: object, flag: str) -> None:
    if not isinstance(value, str) or not HANDLER_RE.match(value):
        raise ConfigError(f"{flag}: {value!r} must be a regex without quotes, backslashes, braces or line breaks")
    try:
        promregex.compile_matcher(value)   # Prometheus evaluates it: RE2, not Python's re
    except promregex.PromRegexError as exc:
        raise ConfigError(f"{flag}: {value!r} is not a valid regex: {exc}") from None


def _check_group_labels(value: object, flag: str) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{flag}: {value!r} must be a list of label names")
    for name in value:
        if not LABEL_NAME_RE.match(name) or name.startswith("__"):
            raise ConfigError(f"{flag}: {name!r} is not a Prometheus label name")
        if name in RESERVED_GROUP_LABELS:
            raise ConfigError(f"{flag}: {name!r} is set by the rules themselves and cannot be a group label")
    if len(set(value)) != len(value):
        raise ConfigError(f"{flag}: {', '.join(value)} names a label twice")


def _check_severities(value: object, flag: str) -> None:
    if not isinstance(value, tuple):
        raise ConfigError(f"{flag}: {value!r} must be ALERT=LEVEL pairs")
    seen: set[str] = set()
    levels = {f"{a}:{level}" for a, tiers in TIERED_ALERTS.items() for level in tiers[1:]}
    for alert, level in value:
        if alert not in ALERT_NAMES and alert not in levels:
            raise ConfigError(f"{flag}: no alert named {alert!r} (one of {', '.join(ALERT_NAMES)}; "
                              f"the second level of a two-level alert: {', '.join(sorted(levels))})")
        if not SEVERITY_RE.match(level):
            raise ConfigError(f"{flag}: {level!r} for {alert} must be a lowercase word like critical or page")
        if alert in seen:
            raise ConfigError(f"{flag}: {alert} given twice")
        seen.add(alert)


def _check_tiers(s: RuleSettings) -> None:
    """The levels of one tiered alert keep distinct severities (two rules of one name with the same labels
    would write the same ALERTS series)."""
    for alert, tiers in TIERED_ALERTS.items():
        resolved = [s.severity_for(alert, level) for level in tiers]
        if len(set(resolved)) != len(resolved):
            raise ConfigError(f"--severity: the levels of {alert} ({', '.join(tiers)}) would all be "
                              f"{resolved[0]}; give each its own (e.g. {alert}={tiers[0]} and "
                              f"{alert}:{tiers[1]}=page)")


def _check_extra_labels(value: object, flag: str, group_labels: tuple[str, ...]) -> None:
    if not isinstance(value, tuple):
        raise ConfigError(f"{flag}: {value!r} must be KEY=VALUE pairs")
    seen: set[str] = set()
    for name, text in value:
        if not LABEL_NAME_RE.match(name) or name.startswith("__"):
            raise ConfigError(f"{flag}: {name!r} is not a Prometheus label name")
        if name in RESERVED_ALERT_LABELS or name in group_labels:
            raise ConfigError(f"{flag}: {name!r} is set by the rules themselves (use --severity for severity)")
        if name in seen:
            raise ConfigError(f"{flag}: {name} given twice")
        if not text or len(text) > 200 or not text.isprintable():
            raise ConfigError(f"{flag}: the value of {name} must be 1-200 printable characters")
        if "{{" in text or "}}" in text:
            raise ConfigError(f"{flag}: the value of {name} may not contain {{{{ or }}}} (Prometheus expands "
                              "alert label values as templates)")
        seen.add(name)


def parse_pair(text: str) -> tuple[str, str]:
    """`KEY=VALUE` -> (KEY, VALUE); validated later."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def parse_label_list(text: str) -> tuple[str, ...]:
    """`cluster,namespace` -> ("cluster", "namespace"); empty text is no labels. Validated later."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _flag(name: str) -> str:
    if name in FLAG_NAMES:
        return FLAG_NAMES[name][0]
    return "--" + name.replace("_", "-")


RETIRED_SERIES = "backend:llm_retired:bool"


def in_service(expr: str, on: str) -> str:
    """`<% filter in_service(s.labels("backend")) %>EXPR<% endfilter %>`: the alert's expression without the
    backends an operator retired (`llm-health ctl retire`; the recording rule backend:llm_retired:bool),
    indented as EXPR's first line is."""
    lines = expr.rstrip("\n").splitlines()
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())] if lines else ""
    body = "\n".join("  " + ln if ln.strip() else ln for ln in lines)
    return f"{indent}(\n{body}\n{indent})\n{indent}unless on ({on}) {RETIRED_SERIES}\n"


@functools.cache
def _environment() -> jinja2.Environment:
    """One environment per process: it compiles each template once (its cache keeps them; the loader gives
    no up-to-date check, so a shipped template is never re-read)."""
    root = resources.files(TEMPLATE_PACKAGE).joinpath(TEMPLATE_DIR)
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: root.joinpath(name).read_text()),
        variable_start_string="<<",
        variable_end_string=">>",
        block_start_string="<%",
        block_end_string="%>",
        comment_start_string="<#",
        comment_end_string="#>",
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["in_service"] = in_service
    env.filters["num"] = lambda value: f"{value:g}"   # 30.0 -> 30, 0.95 -> 0.95
    return env


def render(settings: RuleSettings | None = None) -> dict[str, str]:
    """File name -> rendered text. Raises ConfigError on bad settings."""
    s = (settings or RuleSettings()).validated()
    env = _environment()
    return {out: env.get_template(src).render(s=s) for src, out in OUTPUTS.items()}


# The Kubernetes renders (PrometheusRule, dashboard ConfigMaps) keep `namespace` in every aggregation
# unless --group-labels says otherwise: prometheus-operator's default AlertmanagerConfig matching
# (OnNamespace) routes only alerts whose `namespace` label is the object's namespace, and the
# PodMonitor's targets carry it (prometheus-operator adds namespace, pod, container).
KUBERNETES_GROUP_LABELS = ("namespace",)


def kubernetes_settings(settings: RuleSettings, given: bool) -> RuleSettings:
    """The settings of a Kubernetes render: `namespace` as the group label unless --group-labels was given
    (e.g. cluster,namespace for a Prometheus that sees several clusters)."""
    return settings if given else replace(settings, group_labels=KUBERNETES_GROUP_LABELS)


def kubernetes_warning(settings: RuleSettings) -> str | None:
    if "namespace" in settings.group_labels:
        return None
    return ("warning: --group-labels leaves out namespace: the alerts carry no namespace label, and an "
            "AlertmanagerConfig (prometheus-operator's default OnNamespace matching) routes none of them")


def runbook_warning(settings: RuleSettings) -> str | None:
    """What is wrong with the runbook links of a render with these settings, for the person rendering;
    None when they lead somewhere a person paged elsewhere can open."""
    url = settings.runbook_url
    if url == DEFAULT_RUNBOOK_BASE_URL:
        return (f"warning: --runbook-base-url is not set: every runbook link points at the placeholder {url}, "
                "which never resolves. Set it to the address people reach the remediator's /runbooks at, "
                "e.g. --runbook-base-url https://llm-health.example.com/runbooks")
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    if _LOOPBACK_HOST.match(host):
        return (f"warning: --runbook-base-url {url} is a loopback address: its links open only in a browser "
                "on that host, not for the person paged elsewhere")
    return None


def warn_runbook(settings: RuleSettings, *, kubernetes: bool = False) -> None:
    """Say on stderr what a render with these settings gets wrong for the people it pages."""
    for message in (runbook_warning(settings), kubernetes_warning(settings) if kubernetes else None):
        if message:
            print(f"llm-health: {message}", file=sys.stderr)


def write_rendered(out_dir: Path, settings: RuleSettings | None = None) -> list[Path]:
    """Render everything first, then write; a failure leaves `out_dir` untouched."""
    texts = render(settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        target = out_dir / name
        with tempfile.NamedTemporaryFile("w", dir=out_dir, delete=False, suffix=".tmp") as tmp:
            tmp.write(text)
        Path(tmp.name).replace(target)
        written.append(target)
    return written


def promtool_check(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        raise ConfigError("promtool not found on PATH (Debian: apt-get install prometheus)")
    return subprocess.run([promtool, "check", "rules", *map(str, paths)], capture_output=True, text=True, check=False)


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the --settings file and the flags give (a flag wins over the file)."""
    changes: dict[str, Any] = settingsfile.load(args.settings) if getattr(args, "settings", None) else {}
    for f in fields(RuleSettings):
        value = getattr(args, f.name, None)
        if value is not None:
            changes[f.name] = tuple(value) if isinstance(value, list) else value
    return changes


def settings_from_args(args: argparse.Namespace) -> RuleSettings:
    return replace(RuleSettings(), **_changes(args))


def group_labels_given(args: argparse.Namespace) -> bool:
    """--group-labels on the command line or in the --settings file."""
    return "group_labels" in _changes(args)


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per RuleSettings field: shared by `rules render` and `dashboards render`."""
    defaults = RuleSettings()
    parser.add_argument(
        "--settings", type=Path, default=None, metavar="FILE",
        help="a YAML file of these settings (keys: the flags' names without --, e.g. runbook-base-url), read "
             "by every render so rules, PrometheusRule, dashboards and mixin agree; flags win over it",
    )
    parser.add_argument(
        "--without-exporter", dest="exporter", action="store_false", default=None,
        help="rules over vLLM's own metrics only: no exporter-based alerts or verdict branches",
    )
    parser.add_argument(
        "--watchdog", dest="watchdog", action="store_true", default=None,
        help="add LLMHealthWatchdog, always firing, for a dead man's switch receiver (default: off)",
    )
    for f in fields(RuleSettings):
        default = getattr(defaults, f.name)
        kind = str if default is None else type(default)
        if kind is bool:
            continue
        if f.name == "group_labels":
            parser.add_argument(
                _flag(f.name), type=parse_label_list, default=None, metavar="LABEL,...",
                help=f"{FLAG_HELP[f.name]} (default: none)",
            )
            continue
        if kind is tuple:  # repeatable KEY=VALUE pairs
            parser.add_argument(
                _flag(f.name), dest=f.name, type=parse_pair, action="append", default=None,
                metavar="ALERT=LEVEL" if f.name == "severity" else "KEY=VALUE", help=FLAG_HELP[f.name],
            )
            continue
        if f.name in RATE_WINDOWS:
            shown = f"max({RATE_WINDOWS[f.name]}, {MIN_SCRAPES_PER_WINDOW} x --scrape-interval); shorter is refused"
        else:
            shown = str(default)
        shown = f"{FLAG_HELP[f.name]} (default: {shown})" if f.name in FLAG_HELP else f"default: {shown}"
        parser.add_argument(
            *FLAG_NAMES.get(f.name, (_flag(f.name),)),
            dest=f.name,
            type=kind,
            default=None,
            metavar=kind.__name__.upper() if kind is not str else "VALUE",
            help=shown,
        )


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="rules_command", metavar="ACTION")
    sub.required = True
    render_p = sub.add_parser("render", help="render the rule templates into DIR (default: the repo's rules/)")
    render_p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    render_p.add_argument("--check", action="store_true", help="run promtool check rules on the result")
    render_p.add_argument(
        "--format", choices=FORMATS, default="rules",
        help="rules: the rule files; prometheusrule: one PrometheusRule object for prometheus-operator, "
             f"written to DIR/{prometheusrule.FILE_NAME}, with --group-labels namespace unless given; "
             "jsonnet: DIR/mixin.libsonnet, the rules and dashboards as a monitoring mixin (default: %(default)s)",
    )
    render_p.add_argument("--k8s-name", default=prometheusrule.DEFAULT_NAME,
                          help="prometheusrule: metadata.name (default: %(default)s)")
    render_p.add_argument("--k8s-namespace", default=None,
                          help="prometheusrule: metadata.namespace (default: none; kustomize or kubectl -n sets it)")
    render_p.add_argument("--k8s-label", action="append", default=[], metavar="KEY=VALUE",
                          help="prometheusrule: a metadata label, e.g. release=kube-prometheus-stack to match "
                               "the operator's ruleSelector (repeatable)")
    add_setting_arguments(render_p)
    check_p = sub.add_parser("check", help="promtool check rules on rendered rules")
    check_p.add_argument("--dir", type=Path, default=DEFAULT_OUT, help="folder with rendered *.yml (default: %(default)s)")


def _report_check(paths: list[Path]) -> int:
    result = promtool_check(paths)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return 0 if result.returncode == 0 else 1


def run(args: argparse.Namespace) -> int:
    if args.rules_command == "render" and args.format == "prometheusrule":
        settings = kubernetes_settings(settings_from_args(args), group_labels_given(args))
        warn_runbook(settings, kubernetes=True)
        labels = prometheusrule.parse_labels(args.k8s_label)
        text = prometheusrule.build(render(settings), args.k8s_name, args.k8s_namespace, labels)
        target = prometheusrule.write(args.out, text)
        print(f"wrote {target}")
        if not args.check:
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            return _report_check([prometheusrule.groups_file(text, Path(tmp))])
    if args.rules_command == "render" and args.format == "jsonnet":
        from llm_health.render import mixin  # imports the dashboards, which import this module

        warn_runbook(settings_from_args(args))
        for path in mixin.write(args.out, settings_from_args(args)):
            print(f"wrote {path}")
        return 0
    if args.rules_command == "render":
        warn_runbook(settings_from_args(args))
        written = write_rendered(args.out, settings_from_args(args))
        for path in written:
            print(f"wrote {path}")
        return _report_check(written) if args.check else 0
    paths = sorted(Path(args.dir).glob("*.yml"))
    paths = [p for p in paths if p.stem in {Path(o).stem for o in OUTPUTS.values()}]
    if not paths:
        raise ConfigError(f"no rendered rules in {args.dir} (run `llm-health rules render --out {args.dir}`)")
    return _report_check(paths)
