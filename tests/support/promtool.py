"""Helpers shared by the rules tests: build promtool unit-test files from scenarios, run promtool.

(No tests here; the name keeps the file in the rules tests' family.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

RULES_DIR = REPO / "rules"
RULE_FILES = [RULES_DIR / "llm_health_records.yml", RULES_DIR / "llm_health_alerts.yml"]
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")

VLLM_JOB = 'job="vllm"'
EXPORTER = {"job": "llm-health-exporter", "instance": "127.0.0.1:9410"}


def alert_rule_list(rule_files: list[Path] | None = None) -> list[dict[str, Any]]:
    """Every alerting rule, in file order (a two-level alert such as LLMKVCachePressure is two rules)."""
    return [rule for path in rule_files or RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule]


def alert_levels(rule_files: list[Path] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Alert name -> its rules (one per level; most alerts have one)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for rule in alert_rule_list(rule_files):
        out.setdefault(rule["alert"], []).append(rule)
    return out


def alert_rules(rule_files: list[Path] | None = None) -> dict[str, dict[str, Any]]:
    """Alert name -> its rule (a two-level alert: its first level, the warning)."""
    return {name: rules[0] for name, rules in alert_levels(rule_files).items()}


def all_exprs(rule_files: list[Path] | None = None) -> list[str]:
    exprs = []
    for path in rule_files or RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs.extend(rule["expr"] for rule in group["rules"])
    return exprs


_LABEL_REF = re.compile(r"\{\{\s*\$labels\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_VALUE_REF = re.compile(r"\{\{\s*\$value\s*(?:\|\s*(humanizePercentage|printf `([^`]+)`)\s*)?\}\}")
VALUE = "$value"  # key of an expected label set that holds the alert's value (for annotations using it)


def format_value(value: float, function: str | None, fmt: str | None) -> str:
    """Prometheus' rendering of {{ $value }}, {{ $value | humanizePercentage }}, {{ $value | printf `%.3g` }}."""
    if function == "humanizePercentage":
        return "%.4g%%" % (value * 100)
    if fmt is not None:
        return fmt % value
    return str(int(value)) if value == int(value) else repr(value)


def expand_annotations(rule: dict[str, Any], labels: dict[str, str], value: float | None = None) -> dict[str, str]:
    """What Prometheus makes of the rule's annotations for an alert with these labels (and value)."""
    out = {}
    for key, text in (rule.get("annotations") or {}).items():
        expanded = _LABEL_REF.sub(lambda m: labels.get(m.group(1), ""), text)
        if _VALUE_REF.search(expanded):
            assert value is not None, f"annotation {key} shows $value: give the expected label set a {VALUE!r}"
            expanded = _VALUE_REF.sub(lambda m: format_value(value, m.group(1), m.group(2)), expanded)
        assert "{{" not in expanded, f"annotation {key} uses a template this helper cannot expand: {text}"
        out[key] = expanded
    return out


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def vllm_labels(backend: str, *, v1: bool = True, instance: str | None = None, engine: str = "0") -> dict[str, str]:
    labels = {"job": "vllm", "backend": backend, "instance": instance or f"{backend}.example:8000", "model_name": "m"}
    if v1:
        labels["engine"] = engine
    return labels


def target_labels(backend: str, instance: str | None = None) -> dict[str, str]:
    return {"job": "vllm", "backend": backend, "instance": instance or f"{backend}.example:8000"}


def vllm_backend(
    backend: str,
    *,
    running: str,
    waiting: str,
    progress: str,
    up: str,
    kv: str = "0.3+0x400",
    start_time: str | None = "1000+0x400",
    v1: bool = True,
    iteration_count: str | None = None,
    instance: str | None = None,
    engine: str = "0",
    target: bool = True,
    groups: dict[str, str] | None = None,
) -> list[dict[str, str]]:
    """The series of one vLLM target. `progress` drives every token counter; `iteration_count`
    defaults to `progress` (V1 semantics). `target=False`: only the engine's series (a second DP engine).
    `groups`: target labels such as cluster/namespace, on every series of the target."""
    vl = {**vllm_labels(backend, v1=v1, instance=instance, engine=engine), **(groups or {})}
    tl = {**target_labels(backend, instance), **(groups or {})}
    out = [series("up", tl, up)] if target else []
    out += [
        series("vllm:num_requests_running", vl, running),
        series("vllm:num_requests_waiting", vl, waiting),
        series("vllm:generation_tokens_total", vl, progress),
        series("vllm:prompt_tokens_total", vl, progress),
        series("vllm:iteration_tokens_total_sum", vl, progress),
        series("vllm:iteration_tokens_total_count", vl, iteration_count or progress),
        series("vllm:request_success_total", {**vl, "finished_reason": "stop"}, progress),
        series("vllm:kv_cache_usage_perc" if v1 else "vllm:gpu_cache_usage_perc", vl, kv),
    ]
    if start_time is not None and target:
        out.append(series("process_start_time_seconds", tl, start_time))
    return out


def sglang_labels(backend: str, *, dp_rank: str | None = None, tp_rank: str = "0",
                  instance: str | None = None) -> dict[str, str]:
    """SGLang 0.5.x scheduler labels (dp_rank only with several DP ranks)."""
    labels = {"job": "sglang", "backend": backend, "instance": instance or f"{backend}.example:30000",
              "model_name": "m", "engine_type": "unified", "tp_rank": tp_rank, "pp_rank": "0", "moe_ep_rank": "0"}
    if dp_rank is not None:
        labels["dp_rank"] = dp_rank
    return labels


def sglang_backend(
    backend: str,
    *,
    running: str,
    queue: str,
    up: str,
    passes: str | None,
    tokens: str | None = None,
    usage: str = "0.3+0x400",
    dp_rank: str | None = None,
    tp_size: int = 1,
    target: bool = True,
    instance: str | None = None,
) -> list[dict[str, str]]:
    """One SGLang target (or, `target=False`, one more DP rank of it). Scheduler series for every TP rank
    (the same values: every rank exports them); `passes` drives the per-rank forward-pass counter (None:
    none on the page); `tokens` the tokenizer-side counters (model_name only, once per target)."""
    tl = {"job": "sglang", "backend": backend, "instance": instance or f"{backend}.example:30000"}
    out = [series("up", tl, up)] if target else []
    for tp in range(tp_size):
        sl = sglang_labels(backend, dp_rank=dp_rank, tp_rank=str(tp), instance=instance)
        out += [
            series("sglang:num_running_reqs", sl, running),
            series("sglang:num_queue_reqs", sl, queue),
            series("sglang:token_usage", sl, usage),
        ]
        if passes is not None:
            out.append(series("sglang:cuda_graph_passes_total", {**sl, "mode": "decode_cuda_graph"}, passes))
    if tokens is not None and target:
        tok = {**tl, "model_name": "m"}
        out += [series("sglang:generation_tokens_total", tok, tokens), series("sglang:prompt_tokens_total", tok, tokens)]
    return out


def llamacpp_backend(
    backend: str,
    *,
    processing: str,
    deferred: str,
    up: str,
    decodes: str,
    predicted: str,
    prompt: str | None = None,
    instance: str | None = None,
) -> list[dict[str, str]]:
    """One llama-server target: unlabelled series (target labels only), no start time, no KV series."""
    tl = {"job": "llamacpp", "backend": backend, "instance": instance or f"{backend}.example:8080"}
    return [
        series("up", tl, up),
        series("llamacpp:requests_processing", tl, processing),
        series("llamacpp:requests_deferred", tl, deferred),
        series("llamacpp:n_decode_total", tl, decodes),
        series("llamacpp:tokens_predicted_total", tl, predicted),
        series("llamacpp:prompt_tokens_total", tl, prompt if prompt is not None else predicted),
    ]


@dataclass
class Scenario:
    """One promtool `tests:` entry."""

    name: str
    interval: str = "15s"
    input_series: list[dict[str, str]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    exprs: list[dict[str, Any]] = field(default_factory=list)

    def add(self, items: list[dict[str, str]] | dict[str, str]) -> Scenario:
        self.input_series.extend(items if isinstance(items, list) else [items])
        return self

    def expect(self, at: str, alertname: str, *label_sets: dict[str, str]) -> Scenario:
        """`alertname` fires at `at` exactly for these label sets (expr labels; the rule's own labels and
        annotations are added when the document is built, from the rule files it runs against)."""
        self.alerts.append({"eval_time": at, "alertname": alertname, "exp_alerts": [dict(ls) for ls in label_sets]})
        return self

    def silent(self, at: str, alertname: str) -> Scenario:
        return self.expect(at, alertname)

    def value(self, at: str, expr: str, samples: list[tuple[str, float]]) -> Scenario:
        self.exprs.append(
            {
                "expr": expr,
                "eval_time": at,
                "exp_samples": [{"labels": labels, "value": value} for labels, value in samples],
            }
        )
        return self

    def state(self, at: str, backend: str, code: int) -> Scenario:
        return self.value(
            at,
            f'backend:llm_health_state:code{{backend="{backend}"}}',
            [(f'backend:llm_health_state:code{{backend="{backend}"}}', code)],
        )

    def as_dict(self, rules: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "interval": self.interval, "input_series": self.input_series}
        if self.alerts:
            out["alert_rule_test"] = [
                {**case, "exp_alerts": [_expected(rules[case["alertname"]], labels) for labels in case["exp_alerts"]]}
                for case in self.alerts
            ]
        if self.exprs:
            out["promql_expr_test"] = self.exprs
        return out


def _expected(levels: list[dict[str, Any]], labels: dict[str, Any]) -> dict[str, Any]:
    """The expected alert: the rule of the level whose severity the label set names (a one-level alert: its
    only rule; a two-level one must say which, e.g. {"severity": "critical"})."""
    if len(levels) == 1:
        rule = levels[0]
    else:
        assert "severity" in labels, f"{levels[0]['alert']} has {len(levels)} levels: name the severity expected"
        (rule,) = [r for r in levels if r["labels"]["severity"] == labels["severity"]]
    own = {k: v for k, v in labels.items() if k != VALUE}
    full = {**own, **(rule.get("labels") or {})}
    return {"exp_labels": full, "exp_annotations": expand_annotations(rule, full, labels.get(VALUE))}


def promtool_document(
    scenarios: list[Scenario], rule_files: list[Path] | None = None, *, written_as: list[str] | None = None
) -> dict[str, Any]:
    """The promtool test file for `rule_files` (default: the checked-in rules); `written_as` replaces
    the paths written into the file (e.g. relative ones for the checked-in test file)."""
    files = rule_files or RULE_FILES
    rules = alert_levels(files)
    return {
        "rule_files": written_as or [str(p) for p in files],
        "evaluation_interval": "15s",
        "group_eval_order": ["llm-health.records", "llm-health.restart", "llm-health.alerts"],
        "tests": [s.as_dict(rules) for s in scenarios],
    }


def run_promtool_tests(document: dict[str, Any], path: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool not installed (make debs)"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=200))
    # the whole scenario file costs promtool about 50 s of CPU (55 s user in 46 s on a quiet 2-core machine);
    # beside three busy test workers it took over 120 s once: the bound catches a hang, it is no speed check
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, check=False,
                          timeout=600)


N = 300  # samples per series: 75 minutes at 15s


def exporter_series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    return series(name, {**EXPORTER, **labels}, values)


def seq(*parts: str) -> str:
    return " ".join(parts)


def error_rate_quiet(keep_firing: bool = True) -> Scenario:
    """The condition clears at ~11m (no traffic: 0/0); keep_firing_for (5m by default) holds the alert
    until ~16m against flapping, with its last value; with --keep-firing-for 0s it resolves at once."""
    s = Scenario("no generation traffic at all, before and after errors: LLMBackendErrorRate stays silent")
    s.add(http_series("idle", "2xx", f"0+15x40 600x{N}"))
    s.add(http_series("idle", "5xx", f"0+15x40 600x{N}"))  # 50% errors until 10m, then no traffic
    s.expect("9m", "LLMBackendErrorRate", {"backend": "idle", VALUE: 0.5})
    if keep_firing:
        s.expect("12m", "LLMBackendErrorRate", {"backend": "idle", VALUE: 0.5})
        s.expect("15m30s", "LLMBackendErrorRate", {"backend": "idle", VALUE: 0.5})
        s.silent("17m", "LLMBackendErrorRate")
    else:
        s.silent("12m", "LLMBackendErrorRate")
    s.silent("40m", "LLMBackendErrorRate")
    return s


def http_series(backend: str, status: str, values: str, handler: str = "/v1/chat/completions") -> dict[str, str]:
    """vLLM's http_requests_total (prometheus-fastapi-instrumentator, grouped status codes like "5xx")."""
    labels = {**target_labels(backend), "handler": handler, "method": "POST", "status": status}
    return series("http_requests_total", labels, values)


def _num(x: float) -> str:
    return f"{x:.12g}"


def counter_values(segments: list[tuple[int, float]], start: int = 0) -> str:
    """promtool values of a counter: `start` missing samples (`_`), then per segment (samples, increase per
    sample) from 0; `(k, 0)` holds it still."""
    parts = [f"_x{start}"] if start else []
    value: float | None = None
    for samples, inc in segments:
        first = 0.0 if value is None else value + inc
        parts.append(f"{_num(first)}+{_num(inc)}x{samples - 1}")
        value = first + inc * (samples - 1)
    return " ".join(parts)


LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


def histogram_series(name: str, labels: dict[str, str], segments: list[tuple[int, float, float]], *,
                     start: int = 0, buckets: tuple[float, ...] | None = LATENCY_BUCKETS) -> list[dict[str, str]]:
    """One histogram's wire series (`name` without suffix) from segments of (samples, observations per
    sample, the value observed): every observation of a segment has the same value. `buckets=None`: only
    _sum and _count (as the means read them)."""
    out = [series(f"{name}_count", labels, counter_values([(k, n) for k, n, _ in segments], start)),
           series(f"{name}_sum", labels, counter_values([(k, n * v) for k, n, v in segments], start))]
    for le in (*(buckets or ()), *(("+Inf",) if buckets else ())):
        inc = [(k, n if le == "+Inf" or v <= le else 0.0) for k, n, v in segments]
        out.append(series(f"{name}_bucket", {**labels, "le": le if le == "+Inf" else _num(le)},
                          counter_values(inc, start)))
    return out
