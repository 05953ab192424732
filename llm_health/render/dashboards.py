"""`llm-health dashboards render`: the Grafana dashboards (dashboards/*.json) from one description.

    llm-health dashboards render [--out dashboards] [--format json|configmap] [--vllm-selector 'job="vllm"']
                                 [--group-labels cluster,namespace] ...

--format json (default) writes one JSON file per dashboard; --format configmap writes DIR/dashboards.yaml,
one ConfigMap per dashboard labelled `grafana_dashboard: "1"` for the Grafana sidecar (kube-prometheus-stack,
grafana chart) plus any --k8s-label, annotated with the Grafana folder (--k8s-folder), and rendered with
--group-labels namespace unless given (as the PrometheusRule: rules and dashboards agree).

The dashboards take the rule settings (llm_health/render/rules.py RuleSettings, the same flags as `llm-health
rules render`): the engines' selectors, the exporter's selector and the group labels go into every
query, so one set of flags renders rules and dashboards that agree. The repository's dashboards/*.json
are the default rendering (a test fails when they differ from a fresh one).

The JSON is file-provisionable: `"id": null`, a stable uid, and every panel reads from the
`${datasource}` template variable (no `__inputs`, which only the UI import understands). Every range
is `$__rate_interval` or `$__range` (a literal window is empty when the scrape interval is longer than
a quarter of it). Variables: job, backend (from the engines' own `up` series: no exporter needed),
model and one per group label. Annotations: engine restarts, remediator restarts, firing LLM alerts.
Panels read the engines' own series (vLLM, SGLang, llama.cpp), the recording rules and the
exporter's and remediator's series (docs/design.md); exporter panels are left out with
--without-exporter.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_health.config import ConfigError
from llm_health.render import prometheusrule
from llm_health.render.rules import (
    ALERT_NAMES,
    RuleSettings,
    add_setting_arguments,
    group_labels_given,
    kubernetes_settings,
    settings_from_args,
    warn_runbook,
)

DEFAULT_OUT = Path("dashboards")  # relative to the working directory (the repo root in a checkout)
CONFIGMAP_FILE = "dashboards.yaml"
SIDECAR_LABEL = {"grafana_dashboard": "1"}
# The Grafana folder of the ConfigMaps' dashboards, under both names the dashboard sidecar (kiwigrid
# k8s-sidecar) is found reading it: its own default FOLDER_ANNOTATION, and `grafana_folder`, the name
# commonly set as the grafana chart's sidecar.dashboards.folderAnnotation. Either becomes a Grafana folder
# only with the chart's sidecar.dashboards.provider.foldersFromFilesStructure: true (docs/kubernetes.md).
FOLDER_ANNOTATIONS = ("grafana_folder", "k8s-sidecar-target-directory")
DEFAULT_FOLDER = "llm-health"
FOLDER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,62}$")
SCHEMA_VERSION = 39
# Grafana has no tokens/s unit (an unknown id such as `tps` is shown as a literal suffix, unscaled):
# a custom count unit scales like `short` (1.2 K) and names what is counted.
TOKENS_PER_SECOND = "count:tokens/s"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Verdict codes shared with exporter.verdict and the rules (docs/design.md).
VERDICTS: list[tuple[int, str, str]] = [
    (0, "unknown", "text"),
    (1, "idle", "blue"),
    (2, "busy", "green"),
    (3, "restarted", "purple"),
    (4, "no_metrics", "yellow"),
    (5, "stalled", "orange"),
    (6, "down", "red"),
    (7, "sleeping", "#8AB8FF"),
]


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str                        # timeseries | state-timeline | stat
    targets: tuple[Target, ...]
    w: int = 12
    h: int = 8
    unit: str = ""
    description: str = ""
    mappings: tuple[dict[str, Any], ...] = ()
    thresholds: tuple[tuple[float | None, str], ...] = ()
    threshold_line: bool = False
    bars: bool = False
    stacked: bool = False
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    links: tuple[tuple[str, str], ...] = ()   # (title, url)
    exporter: bool = False           # reads the exporter's series: left out with --without-exporter


@dataclass(frozen=True)
class Annotation:
    name: str
    expr: str
    title: str
    text: str
    tags: str                        # comma-separated label names
    color: str


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = ("llm-health",)
    variables: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    annotations: tuple[Annotation, ...] = ()
    runbook_url: str = ""


def value_mappings(states: list[tuple[int, str, str]]) -> tuple[dict[str, Any], ...]:
    options = {str(code): {"text": text, "color": color, "index": i} for i, (code, text, color) in enumerate(states)}
    return (
        {"type": "value", "options": options},
        {"type": "special", "options": {"match": "null", "result": {"text": "no data", "color": "text", "index": len(states)}}},
    )


VERDICT_MAPPINGS = value_mappings(VERDICTS)


def datasource_variable() -> dict[str, Any]:
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": "prometheus",
        "hide": 0,
        "current": {},
        "options": [],
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }


def query_variable(name: str, label: str, promql: str, all_value: str) -> dict[str, Any]:
    """A multi-value variable from the label `name` of the series `promql` returns (query_result, so
    a union over several engines' series works, which label_values cannot)."""
    query = f"query_result({promql})"
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "allValue": all_value,
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": f'/{name}="([^"]*)"/',
        "sort": 1,
        "hide": 0,
        "skipUrlSync": False,
    }


def render_annotation(a: Annotation) -> dict[str, Any]:
    return {
        "name": a.name,
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": a.color,
        "expr": a.expr,
        "titleFormat": a.title,
        "textFormat": a.text,
        "tagKeys": a.tags,
        "useValueForTime": False,
    }


def render_panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    if panel.unit:
        defaults["unit"] = panel.unit
    if panel.mappings:
        defaults["mappings"] = list(panel.mappings)
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.decimals is not None:
        defaults["decimals"] = panel.decimals
    steps = panel.thresholds or ((None, "green"),)
    defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}
    if panel.kind == "state-timeline":
        defaults["color"] = {"mode": "thresholds"}
        defaults["custom"] = {"fillOpacity": 80, "lineWidth": 0}
        options: dict[str, Any] = {
            "showValue": "auto",
            "mergeValues": True,
            "alignValue": "left",
            "rowHeight": 0.9,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "single", "sort": "none"},
        }
    elif panel.kind == "stat":
        defaults["color"] = {"mode": "thresholds"}
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "value_and_name",
        }
    else:
        defaults["color"] = {"mode": "palette-classic"}
        defaults["custom"] = {
            "drawStyle": "bars" if panel.bars else "line",
            "lineWidth": 1,
            "fillOpacity": 60 if panel.bars else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
            "thresholdsStyle": {"mode": "line" if panel.threshold_line else "off"},
        }
        options = {
            "legend": {"displayMode": "table", "placement": "right", "showLegend": True, "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    targets = []
    for i, t in enumerate(panel.targets):
        target: dict[str, Any] = {
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": t.expr,
            "legendFormat": t.legend or "__auto",
            "range": not t.instant,
            "instant": t.instant,
        }
        targets.append(target)
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.h, "w": panel.w, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
    }
    if panel.links:
        out["links"] = [{"title": title, "url": url, "targetBlank": True} for title, url in panel.links]
    return out


def layout(panels: tuple[Panel, ...]) -> list[dict[str, Any]]:
    """Left-to-right, top-to-bottom on Grafana's 24-column grid."""
    out: list[dict[str, Any]] = []
    x = y = row_h = 0
    for i, panel in enumerate(panels, start=1):
        if x + panel.w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(render_panel(panel, i, x, y))
        x += panel.w
        row_h = max(row_h, panel.h)
    return out


def render_dashboard(d: Dashboard) -> dict[str, Any]:
    return {
        "id": None,
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": list(d.tags),
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "refresh": "10s",
        "liveNow": False,
        "fiscalYearStartMonth": 0,
        "links": [
            {"type": "dashboards", "tags": ["llm-health"], "asDropdown": True, "title": "llm-health",
             "includeVars": True, "keepTime": True, "icon": "external link", "tooltip": "", "url": "",
             "targetBlank": False},
            {"type": "link", "title": "Runbooks", "url": d.runbook_url, "asDropdown": False,
             "includeVars": False, "keepTime": False, "icon": "doc", "tooltip": "One section per alert",
             "tags": [], "targetBlank": True},
        ],
        "annotations": {"list": [{
            "builtIn": 1, "type": "dashboard", "name": "Annotations & Alerts", "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        }] + [render_annotation(a) for a in d.annotations]},
        "templating": {"list": list(d.variables)},
        "panels": layout(d.panels),
    }


# Our alerts by name, for the "LLM alerts firing" annotation: a prefix like LLM.* would also catch
# other bundles' alerts (llm-d's LLMD*). The always-firing watchdog is left out (it would mark every moment).
ANNOTATED_ALERTS = "|".join(a for a in ALERT_NAMES if a != "LLMHealthWatchdog")


# --- queries from the rule settings -------------------------------------------------------------------

# Engines whose own series the dashboards read. The selector is the rule setting `<engine>_selector`.
ENGINES: dict[str, str] = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}
# Engines whose series carry the model (`model_name`); llama.cpp's carry no labels at all.
MODEL_LABELLED = {"vllm", "sglang"}
RI = "$__rate_interval"


class Q:
    """PromQL fragments for one rendering: selectors, group labels and the dashboard variables."""

    def __init__(self, s: RuleSettings) -> None:
        self.s = s
        self.groups = s.group_labels

    def selector(self, engine: str) -> str:
        return str(getattr(self.s, f"{engine}_selector"))

    def by(self, *names: str) -> str:
        return f"by ({self.s.labels(*names)})"

    def agg(self, op: str, expr: str, *names: str) -> str:
        """`op by (groups, names) (expr)`, or plain `op(expr)` when there is nothing to keep."""
        return f"{op} {self.by(*names)} ({expr})" if self.groups or names else f"{op}({expr})"

    def growth(self, counter: str, window: str, *names: str) -> str:
        """How much `counter` grew over `window`, per (groups, names), counting series born inside the
        window with their whole value. `increase()` misses those (it needs two samples), and the
        remediator's counters are born at 1 (one restart of a backend, one decision of a new kind), so a
        backend's first restart would show as nothing. Sums over the names kept, then compares with the
        same sum `window` ago (0 where there was none)."""
        now = self.agg("sum", counter, *names)
        before = self.agg("sum", f"{counter} offset {window}", *names)
        return f"({now} - ({before} or {now} * 0))"

    def group_matchers(self) -> list[str]:
        return [f'{g}=~"${g}"' for g in self.groups]

    def engine(self, engine: str, metric: str, *, model: bool = True) -> str:
        """`metric{selector, job, groups, backend[, model]}` for an engine's own series."""
        matchers = [self.selector(engine), 'job=~"$job"', *self.group_matchers(), 'backend=~"$backend"']
        if model and engine in MODEL_LABELLED:
            matchers.append('model_name=~"$model"')
        return f"{metric}{{{', '.join(matchers)}}}"

    def exporter(self, metric: str, *, backend: bool = True) -> str:
        matchers = [self.s.exporter_selector, *self.group_matchers()]
        if backend:
            matchers.append('backend=~"$backend"')
        return f"{metric}{{{', '.join(matchers)}}}"

    def remediator(self, metric: str, *extra: str, backend: bool = True) -> str:
        """A remediator series: the rules' remediator selector, group labels, backend."""
        return self.ours(metric, self.s.remediator_selector, *extra, backend=backend)

    def ours(self, metric: str, *extra: str, backend: bool = True) -> str:
        """A recording rule's or the remediator's series: group labels and backend only."""
        matchers = [*extra, *self.group_matchers(), *(['backend=~"$backend"'] if backend else [])]
        return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric

    def legend(self, text: str = "") -> str:
        """`{{cluster}}/{{namespace}}/{{backend}}` + text."""
        who = "/".join(f"{{{{{n}}}}}" for n in (*self.groups, "backend"))
        return f"{who} {text}".rstrip()

    @staticmethod
    def per_engine(parts: dict[str, str]) -> str:
        """One series set per engine, told apart by an `engine_name` label, in one query (so a panel
        has data whichever engines a fleet runs)."""
        return "\nor\n".join(
            f'label_replace({expr}, "engine_name", "{ENGINES[engine]}", "", "")' for engine, expr in parts.items()
        )

    def up_union(self, *, job: bool, backend: bool, groups: int | None = None) -> str:
        """Every engine's scrape targets (`up`), narrowed by the variables chosen before (the first
        `groups` group labels; all by default)."""
        parts = []
        for engine in ENGINES:
            matchers = [self.selector(engine), *self.group_matchers()[:groups]]
            if job:
                matchers.append('job=~"$job"')
            if backend:
                matchers.append('backend=~"$backend"')
            parts.append(f"up{{{', '.join(matchers)}}}")
        return " or ".join(parts)

    def variables(self) -> tuple[dict[str, Any], ...]:
        out = [datasource_variable()]
        for i, g in enumerate(self.groups):
            # each group label narrowed by the ones before it, never by itself
            promql = f"count by ({g}) ({self.up_union(job=False, backend=False, groups=i)})"
            out.append(query_variable(g, g.capitalize(), promql, ".*"))
        out.append(query_variable("job", "Job", f"count by (job) ({self.up_union(job=False, backend=False)})", ".+"))
        backends = self.up_union(job=True, backend=False)
        if self.s.exporter:
            backends += " or " + self.exporter("llm_health_verdict_code", backend=False)
        out.append(query_variable("backend", "Backend", f"count by (backend) ({backends})", ".+"))
        models = " or ".join(self.engine(e, m, model=False) for e, m in
                             (("vllm", "vllm:num_requests_running"), ("sglang", "sglang:num_running_reqs")))
        out.append(query_variable("model", "Model", f"count by (model_name) ({models})", ".*"))
        return tuple(out)

    def runbook(self, alert: str) -> tuple[str, str]:
        return (f"Runbook: {alert}", f"{self.s.runbook_url}#{alert.lower()}")

    def annotations(self) -> tuple[Annotation, ...]:
        start = self.engine("vllm", "process_start_time_seconds", model=False)
        created = self.engine("vllm", "vllm:prompt_tokens_created")
        engine_restarts = self.per_engine({
            "vllm": f"{self.agg('max', f'changes({start}[{RI}])', 'backend')} > 0"
                    f" or {self.agg('max', f'changes({created}[{RI}])', 'backend')} > 0",
            "sglang": self.agg("max", f"resets({self.engine('sglang', 'sglang:num_requests_total')}[{RI}])",
                               "backend") + " > 0",
            "llamacpp": self.agg("max", f"resets({self.engine('llamacpp', 'llamacpp:n_decode_total')}[{RI}])",
                                 "backend") + " > 0",
        })
        restarts = self.remediator("llm_health_remediator_restarts_total")
        rollout_state = self.remediator("llm_health_remediator_rollout_state", backend=False)
        rollout_states = self.agg("max", rollout_state, "rollout", "state")
        soaking = self.remediator("llm_health_remediator_rollout_canary_soaking")
        alert_matchers = [f'alertname=~"{ANNOTATED_ALERTS}"', 'alertstate="firing"', *self.group_matchers(),
                          'backend=~"$backend|"']
        return (
            Annotation(
                "Engine restarts", engine_restarts, "{{engine_name}} restarted: " + self.legend(),
                "New process start time or *_created (vLLM), counters reset (SGLang, llama.cpp)",
                "backend,engine_name", "purple",
            ),
            Annotation(
                "Remediator restarts", f"{self.growth(restarts, RI, 'backend')} > 0",
                "llm-health restart: " + self.legend(), "The remediator restarted this backend",
                "backend", "orange",
            ),
            Annotation(
                "Rollouts", f"{rollout_states} == 1 and "
                f"{self.agg('max', f'changes({rollout_state}[{RI}])', 'rollout', 'state')} > 0",
                "rollout {{rollout}} {{state}}", "A rollout changed state (llm-health ctl rollout status)",
                "rollout,state", "blue",
            ),
            Annotation(
                "Canary soaking", f"{self.agg('max', soaking, 'backend')} == 1",
                "canary {{backend}} soaking", "The rollout's gate watches this canary (reduced HAProxy weight)",
                "backend", "yellow",
            ),
            Annotation(
                "LLM alerts firing", f"ALERTS{{{', '.join(alert_matchers)}}}",
                "{{alertname}} {{backend}}", "severity {{severity}}; runbook: "
                + self.s.runbook_url + " (section {{alertname}})",
                "alertname,backend,severity", "red",
            ),
        )


# --- the dashboards ------------------------------------------------------------------------------------

BREAKER_MAPPINGS = value_mappings([(0, "closed", "green"), (1, "open", "red")])
UP_MAPPINGS = value_mappings([(0, "down", "red"), (1, "up", "green")])


def fleet(s: RuleSettings) -> Dashboard:
    q = Q(s)
    verdict = q.exporter("llm_health_verdict_code")
    running = q.per_engine({
        "vllm": q.agg("sum", q.engine("vllm", "vllm:num_requests_running"), "backend"),
        # every TP/PP rank of an SGLang DP rank reports the same scheduler: max over them, sum over DP ranks
        "sglang": q.agg("sum", q.agg("max", q.engine("sglang", "sglang:num_running_reqs"),
                                     "backend", "instance", "dp_rank"), "backend"),
        "llamacpp": q.agg("sum", q.engine("llamacpp", "llamacpp:requests_processing"), "backend"),
    })
    waiting = q.per_engine({
        "vllm": q.agg("sum", q.engine("vllm", "vllm:num_requests_waiting"), "backend"),
        "sglang": q.agg("sum", q.agg("max", q.engine("sglang", "sglang:num_queue_reqs"),
                                     "backend", "instance", "dp_rank"), "backend"),
        "llamacpp": q.agg("sum", q.engine("llamacpp", "llamacpp:requests_deferred"), "backend"),
    })

    def rate(engine: str, metric: str, fn: str = "rate") -> str:
        return q.agg("sum", f"{fn}({q.engine(engine, metric)}[{RI}])", "backend")

    def model_record(metric: str) -> str:
        """A backend_model: record, narrowed by the model variable (llama.cpp's carry no model_name: `All`)."""
        return q.ours(metric, 'model_name=~"$model"')

    generation = q.per_engine({
        "vllm": rate("vllm", "vllm:generation_tokens_total"),
        "sglang": rate("sglang", "sglang:generation_tokens_total"),
        "llamacpp": rate("llamacpp", "llamacpp:tokens_predicted_total"),
    })
    prompt = q.per_engine({
        "vllm": rate("vllm", "vllm:prompt_tokens_total"),
        "sglang": rate("sglang", "sglang:prompt_tokens_total"),
        "llamacpp": rate("llamacpp", "llamacpp:prompt_tokens_total"),
    })
    steps = q.per_engine({
        "vllm": rate("vllm", "vllm:iteration_tokens_total_count"),
        # forward passes per DP rank (every TP rank of it counts the same passes: max over them)
        "sglang": q.agg("sum", q.agg("max", f"rate({q.engine('sglang', 'sglang:cuda_graph_passes_total')}[{RI}])",
                                     "backend", "instance", "dp_rank"), "backend"),
        "llamacpp": rate("llamacpp", "llamacpp:n_decode_total"),
    })
    kv = q.per_engine({
        "vllm": f"{q.agg('max', q.engine('vllm', 'vllm:kv_cache_usage_perc'), 'backend')}"
                f" or {q.agg('max', q.engine('vllm', 'vllm:gpu_cache_usage_perc'), 'backend')}",
        "sglang": q.agg("max", q.engine("sglang", "sglang:token_usage"), "backend"),
    })
    start = q.engine("vllm", "process_start_time_seconds", model=False)
    resets = q.per_engine({
        "vllm": rate("vllm", "vllm:generation_tokens_total", "resets"),
        "sglang": rate("sglang", "sglang:num_requests_total", "resets"),
        "llamacpp": rate("llamacpp", "llamacpp:n_decode_total", "resets"),
    })
    targets_up = " or ".join(q.engine(e, "up", model=False) for e in ENGINES)
    panels = (
        Panel(
            "Verdict per backend", "state-timeline",
            (Target(verdict, q.legend()),),
            w=24, h=7, mappings=VERDICT_MAPPINGS, exporter=True,
            links=(q.runbook("LLMBackendStalled"), q.runbook("LLMBackendDown"),
                   q.runbook("LLMBackendVerdictUnknown")),
            description="The exporter's verdict (llm_health_verdict_code). Unknown = missing or stale data, "
                        "never healthy. Stalled/down need more than one reading.",
        ),
        Panel(
            "State per backend from the rules", "state-timeline",
            (Target(q.ours("backend:llm_health_state:code"), q.legend()),),
            w=24, h=7, mappings=VERDICT_MAPPINGS,
            links=(q.runbook("LLMBackendStalled"), q.runbook("LLMBackendDown")),
            description="The same verdict codes computed by the recording rules from the engines' own "
                        "series (backend:llm_health_state:code): works without the exporter.",
        ),
        Panel(
            "Current verdict", "stat",
            (Target(verdict, q.legend(), instant=True),),
            w=12, h=5, mappings=VERDICT_MAPPINGS, exporter=True,
        ),
        Panel(
            "Seconds since last engine progress", "stat",
            (Target(f"time() - {q.exporter('llm_health_last_progress_timestamp_seconds')}", q.legend(),
                    instant=True),),
            w=12, h=5, unit="s", decimals=0, exporter=True,
            thresholds=((None, "green"), (60, "orange"), (120, "red")),
            description="Age of the last counter movement the exporter saw. Large while idle is normal.",
        ),
        Panel(
            "Requests running and waiting", "timeseries",
            (Target(running, q.legend("running ({{engine_name}})")),
             Target(waiting, q.legend("waiting ({{engine_name}})"))),
            unit="short", min=0,
            description="Each engine's own gauges: vLLM num_requests_running/waiting, SGLang "
                        "num_running_reqs/num_queue_reqs (one TP rank per DP rank), llama.cpp "
                        "requests_processing/requests_deferred.",
        ),
        Panel(
            "Work in flight and engine progress (what the stall alert reads)", "timeseries",
            (Target(q.ours("backend:llm_requests_in_flight:sum"), q.legend("in flight")),
             Target(q.ours("backend:llm_engine_progress:rate_stall_window"),
                    q.legend(f"progress signals/s over {s.stall_window or 'the stall window'}"))),
            unit="short", min=0, links=(q.runbook("LLMBackendStalled"),),
            description="The recording rules behind LLMBackendStalled, over all three engines "
                        "(backend:llm_requests_in_flight:sum, backend:llm_engine_progress:rate_stall_window): "
                        "work in flight with zero progress over the stall window is a stall.",
        ),
        Panel(
            "In-flight requests (exporter)", "timeseries",
            (Target(q.exporter("llm_health_in_flight_requests"), q.legend()),),
            unit="short", min=0, exporter=True,
            description="running + waiting as the exporter read it; a probe is only sent when this is 0.",
        ),
        Panel(
            "Generation tokens per second", "timeseries",
            (Target(generation, q.legend("({{engine_name}})")),)
            + ((Target(q.exporter("llm_health_generation_tokens_per_second"), q.legend("(exporter)")),)
               if s.exporter else ()),
            unit=TOKENS_PER_SECOND, min=0,
            description="Engine progress from the engines' counters, never from a probe's latency. "
                        "llama.cpp's tokens_predicted_total moves only when a request finishes: see "
                        "engine steps for its progress.",
        ),
        Panel(
            "Engine steps per second", "timeseries",
            (Target(steps, q.legend("({{engine_name}})")),)
            + ((Target(q.exporter("llm_health_engine_steps_per_second"), q.legend("(exporter)")),)
               if s.exporter else ()),
            unit="short", min=0,
            description="vLLM: iteration_tokens_total_count (V1 counts batches with output; V0 also ticks "
                        "while idle). SGLang: cuda_graph_passes_total (0.5+, forward passes per DP rank). "
                        "llama.cpp: n_decode_total, one llama_decode() call per step.",
        ),
        Panel(
            "Prompt tokens per second", "timeseries",
            (Target(prompt, q.legend("({{engine_name}})")),),
            unit=TOKENS_PER_SECOND, min=0,
        ),
        Panel(
            "KV cache usage", "timeseries",
            (Target(kv, q.legend("({{engine_name}})")),),
            unit="percentunit", min=0, max=1,
            thresholds=((None, "green"), (s.kv_threshold, "orange"), (s.kv_critical_threshold, "red")),
            threshold_line=True, links=(q.runbook("LLMKVCachePressure"),),
            description="vLLM kv_cache_usage_perc (gpu_cache_usage_perc before 0.9), SGLang token_usage "
                        f"(KV pool). Lines at the alert's two levels (warning {s.kv_percent}%, critical "
                        f"{s.kv_critical_percent}%).",
        ),
        Panel(
            "Preemptions per second (vLLM)", "timeseries",
            (Target(rate("vllm", "vllm:num_preemptions_total"), q.legend()),),
            unit="short", min=0, links=(q.runbook("LLMPreemptions"),),
        ),
        # saturation and latency (the recording rules; signals for people, never restarts)
        Panel(
            "Queue depth (requests waiting)", "timeseries",
            (Target(model_record("backend_model:llm_requests_waiting:sum"), q.legend("{{model_name}}")),),
            unit="short", min=0, thresholds=((None, "green"), (s.queue_depth_threshold, "red")), threshold_line=True,
            links=(q.runbook("LLMQueueDepthHigh"),),
            description="backend_model:llm_requests_waiting:sum: vLLM num_requests_waiting, SGLang num_queue_reqs, "
                        f"llama.cpp requests_deferred. Line at LLMQueueDepthHigh's threshold ({s.queue_depth_threshold}).",
        ),
        Panel(
            f"Mean queue time over {s.queue_time_window}", "timeseries",
            (Target(model_record("backend_model:llm_queue_time_seconds:mean_queue_time_window"),
                    q.legend("{{model_name}}")),),
            unit="s", min=0, thresholds=((None, "green"), (s.queue_time_threshold, "red")), threshold_line=True,
            links=(q.runbook("LLMQueueTimeHigh"),),
            description="vLLM request_queue_time_seconds (observed when a request finishes), SGLang queue_time_seconds. "
                        "Empty when no queued request finished: see the queue depth next to it.",
        ),
        Panel(
            "Prefix-cache hit rate (affinity payoff)", "timeseries",
            (Target(q.ours("backend:llm_prefix_cache_hits:ratio_latency_window"), q.legend()),),
            unit="percentunit", min=0, max=1,
            description="Share of prompt tokens served from the prefix cache over the latency window (vLLM hits / "
                        "queries, SGLang cached / prompt tokens): what session affinity buys. Read it with the "
                        "time to first token next to it: a falling hit rate raises TTFT.",
        ),
        Panel(
            "Time to first token (p95 per model, p99)", "timeseries",
            (Target(model_record("backend_model:llm_time_to_first_token_seconds:p95"), q.legend("{{model_name}} p95")),
             Target(q.ours("backend:llm_time_to_first_token_seconds:p99"), q.legend("p99"))),
            unit="s", min=0, threshold_line=True,
            thresholds=((None, "green"), (s.ttft_threshold, "orange"), (s.ttft_critical_threshold, "red")),
            links=(q.runbook("LLMTimeToFirstTokenHigh"),),
            description="Over the latency window. Lines at LLMTimeToFirstTokenHigh's levels (p99 above "
                        f"{s.ttft_threshold:g} s warning, {s.ttft_critical_threshold:g} s critical).",
        ),
        Panel(
            f"TTFT p95 over {s.ttft_slo_window} (objective)", "timeseries",
            (Target(q.ours("backend:llm_time_to_first_token_seconds:p95_ttft_slo_window"), q.legend()),),
            unit="s", min=0, thresholds=((None, "green"), (s.ttft_slo_threshold, "red")), threshold_line=True,
            links=(q.runbook("LLMTimeToFirstTokenSLOBreach"),),
            description=f"LLMTimeToFirstTokenSLOBreach: above {s.ttft_slo_threshold:g} s for {s.ttft_slo_for}.",
        ),
        Panel(
            "Requests waiting with none running (admission)", "timeseries",
            (Target(f"{q.ours('backend:llm_requests_waiting:sum')} > 0 and on ({s.labels('backend')}) "
                    f"({q.ours('backend:llm_requests_in_flight:sum')} - {q.ours('backend:llm_requests_waiting:sum')})"
                    " == 0", q.legend("waiting, none running")),),
            unit="short", min=0, bars=True, links=(q.runbook("LLMBackendAdmissionStalled"),),
            description="Backends whose requests all wait: the scheduler admits nothing. LLMBackendAdmissionStalled "
                        f"fires per engine after {s.admission_stalled_for}.",
        ),
        Panel(
            "End-to-end request latency p95", "timeseries",
            (Target(model_record("backend_model:llm_e2e_request_latency_seconds:p95"), q.legend("{{model_name}}")),),
            unit="s", min=0,
        ),
        Panel(
            "Inter-token latency against its baseline", "timeseries",
            (Target(q.ours("backend:llm_inter_token_latency_seconds:mean_degraded_window"),
                    q.legend(f"mean over {s.degraded_window}")),
             Target(q.ours("backend:llm_inter_token_latency_seconds:baseline"), q.legend("baseline")),
             Target(f"{q.ours('backend:llm_inter_token_latency_seconds:baseline')} * {s.degraded_factor:g}",
                    q.legend(f"degraded above ({s.degraded_factor:g} x baseline)")),
             Target(model_record("backend_model:llm_inter_token_latency_seconds:p95"), q.legend("{{model_name}} p95"))),
            w=24, unit="s", min=0, links=(q.runbook("LLMBackendDegraded"),),
            description="The backend against its own history: LLMBackendDegraded fires when the mean stays above "
                        f"{s.degraded_factor:g} x the baseline (median over the {s.degraded_baseline} before) for "
                        f"{s.degraded_for}. llama.cpp: predict time per predicted token.",
        ),
        Panel(
            "Restarts", "timeseries",
            (
                Target(q.agg("max", f"changes({start}[{RI}])", "backend"), q.legend("start time changed")),
                Target(resets, q.legend("counter resets ({{engine_name}})")),
                Target(q.growth(q.remediator("llm_health_remediator_restarts_total"), RI, "backend"),
                       q.legend("remediator restarts")),
            ),
            w=24, unit="short", min=0, bars=True,
            links=(q.runbook("LLMBackendRestarted"), q.runbook("LLMBackendRestartLoop")),
            description="Process restarts seen in the metrics (start time, counter resets), next to the "
                        "restarts the remediator ran. A restart without a remediator bar came from elsewhere.",
        ),
        Panel(
            "Engine targets up", "stat",
            (Target(targets_up, q.legend("{{instance}} ({{job}})"), instant=True),),
            w=24, h=5, mappings=UP_MAPPINGS,
            links=(q.runbook("LLMBackendDown"), q.runbook("LLMTooFewBackendsUp")),
            description="Prometheus' own scrape of every engine target (the rules' selectors).",
        ),
        Panel(
            "Probes sent", "timeseries",
            (
                Target(q.agg("sum", f"increase({q.exporter('llm_health_probes_sent_total')}[{RI}])", "backend"),
                       q.legend("sent")),
                Target(q.growth(q.exporter("llm_health_probes_total"), RI, "backend", "result"),
                       q.legend("answered: {{result}}")),
            ),
            unit="short", min=0, bars=True, exporter=True,
            links=(q.runbook("LLMHealthProbeSentToBusyBackend"),),
            description="Must stay flat while a backend is busy: probes only go to idle servers. "
                        "Sent is counted when a probe leaves, answered when its result is in.",
        ),
        Panel(
            "Readings by result", "timeseries",
            (Target(q.agg("sum", f"increase({q.exporter('llm_health_readings_total')}[{RI}])",
                          "backend", "result"), q.legend("{{result}}")),),
            unit="short", min=0, bars=True, stacked=True, exporter=True,
        ),
        Panel(
            "Exporter schedule lag", "timeseries",
            (Target(q.agg("max", q.exporter("llm_health_schedule_lag_seconds", backend=False), "instance"),
                    "/".join(f"{{{{{n}}}}}" for n in (*q.groups, "instance"))),),
            unit="s", min=0, exporter=True, links=(q.runbook("LLMHealthExporterDown"),),
            description="How late the exporter starts backends' reads after their scheduled time (every backend "
                        "is read on its own schedule). Near the interval: the exporter is short of workers or CPU.",
        ),
        Panel(
            "Proxies up", "stat",
            (Target(q.exporter("llm_health_proxy_up", backend=False), "{{proxy}}", instant=True),),
            mappings=UP_MAPPINGS, exporter=True, links=(q.runbook("LLMProxyDown"),),
            description="Proxies are checked through GET /v1/models only.",
        ),
    )
    return Dashboard(
        uid="llm-health-fleet",
        title="llm-health: fleet",
        description="Verdicts, engine progress and probes for every vLLM, SGLang and llama.cpp backend "
                    "(the engines' own counters, the rules and the exporter).",
        tags=("llm-health", "vllm", "sglang", "llamacpp"),
        variables=q.variables(),
        panels=tuple(p for p in panels if s.exporter or not p.exporter),
        annotations=q.annotations(),
        runbook_url=s.runbook_url,
    )


def remediator(s: RuleSettings) -> Dashboard:
    q = Q(s)
    restarts = q.remediator("llm_health_remediator_restarts_total")
    alerts = q.remediator("llm_health_remediator_alerts_received_total", backend=False)
    decisions = q.remediator("llm_health_remediator_decisions_total", backend=False)
    deferred = q.remediator("llm_health_remediator_decisions_total", 'decision=~"deferred.*"', backend=False)
    breaker = q.agg("max", q.remediator("llm_health_remediator_breaker_open", backend=False))
    rollout_state = q.remediator("llm_health_remediator_rollout_state", backend=False)
    rollout_members = q.remediator("llm_health_remediator_rollout_members", backend=False)
    panels = (
        Panel(
            "Restarts in range", "stat",
            (Target(q.growth(restarts, "$__range", "result"), "{{result}}", instant=True),),
            w=8, h=5, decimals=0,
        ),
        Panel(
            "Circuit breaker", "stat",
            (Target(breaker, "breaker", instant=True),),
            w=8, h=5, mappings=BREAKER_MAPPINGS,
            description="Open = too many restarts in the window; the remediator stops acting until it closes.",
        ),
        Panel(
            "Alerts received in range", "stat",
            (Target(q.agg("sum", f"increase({alerts}[$__range])", "status"), "{{status}}", instant=True),),
            w=8, h=5, decimals=0,
        ),
        Panel(
            "Alerts received", "timeseries",
            (Target(q.agg("sum", f"increase({alerts}[{RI}])", "status"), "{{status}}"),),
            unit="short", min=0, bars=True, stacked=True,
        ),
        Panel(
            "Decisions by kind", "timeseries",
            (Target(q.growth(decisions, RI, "decision"), "{{decision}}"),),
            unit="short", min=0, bars=True, stacked=True,
            description="Every decision is also in the audit log with its reason.",
        ),
        Panel(
            "Restarts by result", "timeseries",
            (Target(q.growth(restarts, RI, "backend", "result"), q.legend("{{result}}")),),
            unit="short", min=0, bars=True, stacked=True,
            links=(q.runbook("LLMBackendRestartLoop"),),
        ),
        Panel(
            "Deferrals", "timeseries",
            (Target(q.growth(deferred, RI, "decision"), "{{decision}}"),),
            unit="short", min=0, bars=True, stacked=True,
            description="Restarts held back: busy markers, backoff, budget, verification showed progress...",
        ),
        Panel(
            "Circuit breaker over time", "state-timeline",
            (Target(breaker, "breaker"),),
            w=24, h=4, mappings=BREAKER_MAPPINGS,
        ),
        Panel(
            "Lifecycle state per backend", "state-timeline",
            (Target(f"{q.agg('max', q.remediator('llm_health_remediator_lifecycle_state'), 'backend', 'state')} == 1",
                    q.legend("{{state}}")),),
            w=24, h=8,
            mappings=value_mappings([(1, "active", "green")]),
            description="Which lifecycle state each backend is in (one 0/1 series per state).",
        ),
        Panel(
            "Rollout state", "state-timeline",
            (Target(f"{q.agg('max', rollout_state, 'rollout', 'state')} == 1", "rollout {{rollout}}: {{state}}"),),
            w=12, h=6, mappings=value_mappings([(1, "active", "blue")]),
            description="The latest rollout's state (running, paused, rolling_back, succeeded, rolled_back, failed): "
            "llm-health ctl rollout status. failed = a rollback did not complete: a person is needed.",
        ),
        Panel(
            "Rollout members by step", "timeseries",
            (Target(q.agg("max", rollout_members, "step"), "{{step}}"),),
            w=12, h=6, unit="short", min=0, stacked=True,
            description="The latest rollout's members: pending, restarting, soaking (the canary under its gate), "
            "done, rolling_back, rolled_back, failed, rollback_failed.",
        ),
        Panel(
            "Remediator scrape up", "stat",
            (Target(q.remediator("up", backend=False), "{{instance}}", instant=True),),
            w=24, h=4, mappings=UP_MAPPINGS,
        ),
    )
    return Dashboard(
        uid="llm-health-remediator",
        title="llm-health: remediator",
        description="The one restart authority: alerts in, decisions, restarts, deferrals, breaker, lifecycle.",
        tags=("llm-health", "remediator"),
        variables=q.variables(),
        panels=panels,
        annotations=q.annotations(),
        runbook_url=s.runbook_url,
    )


DASHBOARDS = {
    "llm-health-fleet.json": fleet,
    "llm-health-remediator.json": remediator,
}


def render(settings: RuleSettings | None = None) -> dict[str, str]:
    """File name -> dashboard JSON. Raises ConfigError on bad settings (the rules' validation)."""
    s = (settings or RuleSettings()).validated()
    return {name: json.dumps(render_dashboard(build(s)), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def _write(out_dir: Path, texts: dict[str, str]) -> list[Path]:
    """Everything is rendered before this; each file is replaced atomically."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out: {out_dir} exists and is not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        with tempfile.NamedTemporaryFile("w", dir=out_dir, delete=False, suffix=".tmp", encoding="utf-8") as tmp:
            tmp.write(text)
        target = out_dir / name
        Path(tmp.name).replace(target)
        written.append(target)
    return written


def write_rendered(out_dir: Path, settings: RuleSettings | None = None) -> list[Path]:
    """Render everything first, then write; a failure leaves `out_dir` untouched."""
    return _write(out_dir, render(settings))


def check_folder(folder: str) -> str:
    if not FOLDER_RE.match(folder):
        raise ConfigError(f"--k8s-folder: {folder!r} must be a folder name (letters, digits, space, _ . -; "
                          "no slash), at most 63 characters")
    return folder


def configmaps(texts: dict[str, str], labels: dict[str, str] | None = None, folder: str = DEFAULT_FOLDER) -> str:
    """One ConfigMap per dashboard (name llm-health-dashboard-<file stem>), as a multi-document YAML, labelled
    for the Grafana sidecar and annotated with the Grafana folder."""
    check_folder(folder)
    docs = []
    for file_name, text in sorted(texts.items()):
        stem = file_name.removesuffix(".json")
        name = prometheusrule.check_name(f"llm-health-dashboard-{stem}"[:253])
        docs.append({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/name": "llm-health", "app.kubernetes.io/component": "dashboards",
                **SIDECAR_LABEL, **(labels or {})},
                "annotations": {key: folder for key in FOLDER_ANNOTATIONS}},
            "data": {file_name: text},
        })
    header = ("# Generated by `llm-health dashboards render --format configmap`; regenerate, do not edit.\n")
    return header + "---\n".join(prometheusrule.dump(doc) for doc in docs)


def write_configmaps(out_dir: Path, labels: dict[str, str], settings: RuleSettings | None = None,
                     folder: str = DEFAULT_FOLDER) -> Path:
    return _write(out_dir, {CONFIGMAP_FILE: configmaps(render(settings), labels, folder)})[0]


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dashboards_command", metavar="ACTION")
    sub.required = True
    render_p = sub.add_parser(
        "render", help="render the Grafana dashboards into DIR with the rule settings (default: dashboards/)",
    )
    render_p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    render_p.add_argument("--format", choices=("json", "configmap"), default="json",
                          help=f"json: one file per dashboard; configmap: DIR/{CONFIGMAP_FILE} with ConfigMaps "
                               "for the Grafana sidecar (default: %(default)s)")
    render_p.add_argument("--k8s-label", action="append", default=[], metavar="KEY=VALUE",
                          help="configmap: an extra metadata label (repeatable)")
    render_p.add_argument("--k8s-folder", default=DEFAULT_FOLDER,
                          help="configmap: the Grafana folder (annotations " + ", ".join(FOLDER_ANNOTATIONS)
                               + "; default: %(default)s)")
    add_setting_arguments(render_p)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.format == "configmap":
        settings = kubernetes_settings(settings, group_labels_given(args))
        warn_runbook(settings, kubernetes=True)
        labels = prometheusrule.parse_labels(args.k8s_label)
        print(f"wrote {write_configmaps(args.out, labels, settings, args.k8s_folder)}")
        return 0
    warn_runbook(settings)
    for path in write_rendered(args.out, settings):
        print(f"wrote {path}")
    return 0
