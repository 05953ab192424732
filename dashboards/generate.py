"""Generate the Grafana dashboards (dashboards/*.json) from one description, so panels stay consistent.

Run `python dashboards/generate.py` after editing; a test fails when the checked-in JSON differs from a
fresh generation. The JSON is file-provisionable: `"id": null`, a stable uid, and every panel reads
from the `${datasource}` template variable (no `__inputs`, which only the UI import understands).

Queries use vLLM's raw series (scraped with a `backend` label equal to the llm-health backend name)
and the exporter/remediator series from docs/design.md, not recording rules, so the dashboards work
without our rules loaded.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = '{backend=~"$backend"}'

# Verdict codes shared with exporter.verdict and the rules (docs/design.md).
VERDICTS: list[tuple[int, str, str]] = [
    (0, "unknown", "text"),
    (1, "idle", "blue"),
    (2, "busy", "green"),
    (3, "restarted", "purple"),
    (4, "no_metrics", "yellow"),
    (5, "stalled", "orange"),
    (6, "down", "red"),
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


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = ("llm-health",)
    variables: tuple[dict[str, Any], ...] = field(default_factory=tuple)


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


def backend_variable() -> dict[str, Any]:
    query = "label_values(llm_health_verdict_code, backend)"
    return {
        "type": "query",
        "name": "backend",
        "label": "Backend",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".+",        # `.*` would also match series without a backend label
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
        "skipUrlSync": False,
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
    return {
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


def render(d: Dashboard) -> dict[str, Any]:
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
             "targetBlank": False}
        ],
        "annotations": {"list": [{
            "builtIn": 1, "type": "dashboard", "name": "Annotations & Alerts", "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        }]},
        "templating": {"list": list(d.variables)},
        "panels": layout(d.panels),
    }


FLEET = Dashboard(
    uid="llm-health-fleet",
    title="llm-health: fleet",
    description="Verdicts, engine progress and probes for every vLLM backend (exporter + vLLM's own counters).",
    tags=("llm-health", "vllm"),
    variables=(datasource_variable(), backend_variable()),
    panels=(
        Panel(
            "Verdict per backend", "state-timeline",
            (Target(f"llm_health_verdict_code{SEL}", "{{backend}}"),),
            w=24, h=7, mappings=VERDICT_MAPPINGS,
            description="The exporter's verdict (llm_health_verdict_code). Unknown = missing or stale data, "
                        "never healthy. Stalled/down need more than one reading.",
        ),
        Panel(
            "Current verdict", "stat",
            (Target(f"llm_health_verdict_code{SEL}", "{{backend}}", instant=True),),
            w=12, h=5, mappings=VERDICT_MAPPINGS,
        ),
        Panel(
            "Seconds since last engine progress", "stat",
            (Target(f"time() - llm_health_last_progress_timestamp_seconds{SEL}", "{{backend}}", instant=True),),
            w=12, h=5, unit="s", decimals=0,
            thresholds=((None, "green"), (60, "orange"), (120, "red")),
            description="Age of the last counter movement the exporter saw. Large while idle is normal.",
        ),
        Panel(
            "Requests running and waiting (vLLM)", "timeseries",
            (
                Target(f"sum by (backend) (vllm:num_requests_running{SEL})", "{{backend}} running"),
                Target(f"sum by (backend) (vllm:num_requests_waiting{SEL})", "{{backend}} waiting"),
            ),
            unit="short", min=0,
        ),
        Panel(
            "In-flight requests (exporter)", "timeseries",
            (Target(f"llm_health_in_flight_requests{SEL}", "{{backend}}"),),
            unit="short", min=0,
            description="running + waiting as the exporter read it; a probe is only sent when this is 0.",
        ),
        Panel(
            "Generation tokens per second", "timeseries",
            (
                Target(f"llm_health_generation_tokens_per_second{SEL}", "{{backend}} (exporter)"),
                Target(f"sum by (backend) (rate(vllm:generation_tokens_total{SEL}[1m]))", "{{backend}} (vLLM rate 1m)"),
            ),
            unit="tps", min=0,
            description="Engine progress from vLLM's counters, never from a probe's latency.",
        ),
        Panel(
            "Engine steps and prompt tokens per second", "timeseries",
            (
                Target(f"sum by (backend) (rate(vllm:iteration_tokens_total_count{SEL}[1m]))", "{{backend}} steps/s"),
                Target(f"sum by (backend) (rate(vllm:prompt_tokens_total{SEL}[1m]))", "{{backend}} prompt tok/s"),
            ),
            unit="short", min=0,
            description="iteration_tokens_total_count: V1 counts batches with output; V0 also ticks while idle.",
        ),
        Panel(
            "KV cache usage", "timeseries",
            (Target(
                f"max by (backend) (vllm:kv_cache_usage_perc{SEL} or vllm:gpu_cache_usage_perc{SEL})",
                "{{backend}}",
            ),),
            unit="percentunit", min=0, max=1,
            thresholds=((None, "green"), (0.85, "red")), threshold_line=True,
            description="vllm:kv_cache_usage_perc (gpu_cache_usage_perc before vLLM 0.9). Line at 85%.",
        ),
        Panel(
            "Preemptions per second", "timeseries",
            (Target(f"sum by (backend) (rate(vllm:num_preemptions_total{SEL}[1m]))", "{{backend}}"),),
            unit="short", min=0,
        ),
        Panel(
            "Restarts", "timeseries",
            (
                Target(f"changes(process_start_time_seconds{SEL}[5m])", "{{backend}} start time changed"),
                Target(f"sum by (backend) (resets(vllm:generation_tokens_total{SEL}[5m]))",
                       "{{backend}} counter resets"),
                Target(f"sum by (backend) (increase(llm_health_remediator_restarts_total{SEL}[5m]))",
                       "{{backend}} remediator restarts"),
            ),
            w=24, unit="short", min=0, bars=True,
            description="Process restarts seen in the metrics (start time, counter resets), next to the "
                        "restarts the remediator ran. A restart without a remediator bar came from elsewhere.",
        ),
        Panel(
            "Probes sent", "timeseries",
            (
                Target(f"sum by (backend) (increase(llm_health_probes_sent_total{SEL}[$__rate_interval]))",
                       "{{backend}} sent"),
                Target(f"sum by (backend, result) (increase(llm_health_probes_total{SEL}[$__rate_interval]))",
                       "{{backend}} answered: {{result}}"),
            ),
            unit="short", min=0, bars=True,
            description="Must stay flat while a backend is busy: probes only go to idle servers. "
                        "Sent is counted when a probe leaves, answered when its result is in.",
        ),
        Panel(
            "Readings by result", "timeseries",
            (Target(
                f"sum by (backend, result) (increase(llm_health_readings_total{SEL}[$__rate_interval]))",
                "{{backend}} {{result}}",
            ),),
            unit="short", min=0, bars=True, stacked=True,
        ),
        Panel(
            "Exporter schedule lag", "timeseries",
            (Target("max by (instance) (llm_health_schedule_lag_seconds)", "{{instance}}"),),
            unit="s", min=0,
            description="How late the exporter starts backends' reads after their scheduled time (every backend "
                        "is read on its own schedule). Near the interval: the exporter is short of workers or CPU.",
        ),
        Panel(
            "Proxies up", "stat",
            (Target("llm_health_proxy_up", "{{proxy}}", instant=True),),
            mappings=value_mappings([(0, "down", "red"), (1, "up", "green")]),
            description="Proxies are checked through GET /v1/models only.",
        ),
    ),
)

BREAKER_MAPPINGS = value_mappings([(0, "closed", "green"), (1, "open", "red")])

REMEDIATOR = Dashboard(
    uid="llm-health-remediator",
    title="llm-health: remediator",
    description="The one restart authority: alerts in, decisions, restarts, deferrals, breaker, lifecycle.",
    tags=("llm-health", "remediator"),
    variables=(datasource_variable(), backend_variable()),
    panels=(
        Panel(
            "Restarts in range", "stat",
            (Target(
                "sum by (result) (increase(llm_health_remediator_restarts_total{backend=~\"$backend\"}[$__range]))",
                "{{result}}", instant=True,
            ),),
            w=8, h=5, decimals=0,
        ),
        Panel(
            "Circuit breaker", "stat",
            (Target("max(llm_health_remediator_breaker_open)", "breaker", instant=True),),
            w=8, h=5, mappings=BREAKER_MAPPINGS,
            description="Open = too many restarts in the window; the remediator stops acting until it closes.",
        ),
        Panel(
            "Alerts received in range", "stat",
            (Target(
                "sum by (status) (increase(llm_health_remediator_alerts_received_total[$__range]))",
                "{{status}}", instant=True,
            ),),
            w=8, h=5, decimals=0,
        ),
        Panel(
            "Alerts received", "timeseries",
            (Target(
                "sum by (status) (increase(llm_health_remediator_alerts_received_total[$__rate_interval]))",
                "{{status}}",
            ),),
            unit="short", min=0, bars=True, stacked=True,
        ),
        Panel(
            "Decisions by kind", "timeseries",
            (Target(
                "sum by (decision) (increase(llm_health_remediator_decisions_total[$__rate_interval]))",
                "{{decision}}",
            ),),
            unit="short", min=0, bars=True, stacked=True,
            description="Every decision is also in the audit log with its reason.",
        ),
        Panel(
            "Restarts by result", "timeseries",
            (Target(
                "sum by (backend, result) "
                "(increase(llm_health_remediator_restarts_total{backend=~\"$backend\"}[$__rate_interval]))",
                "{{backend}} {{result}}",
            ),),
            unit="short", min=0, bars=True, stacked=True,
        ),
        Panel(
            "Deferrals", "timeseries",
            (Target(
                "sum by (decision) "
                "(increase(llm_health_remediator_decisions_total{decision=~\"deferred.*\"}[$__rate_interval]))",
                "{{decision}}",
            ),),
            unit="short", min=0, bars=True, stacked=True,
            description="Restarts held back: busy markers, backoff, budget, verification showed progress...",
        ),
        Panel(
            "Circuit breaker over time", "state-timeline",
            (Target("max(llm_health_remediator_breaker_open)", "breaker"),),
            w=24, h=4, mappings=BREAKER_MAPPINGS,
        ),
        Panel(
            "Lifecycle state per backend", "state-timeline",
            (Target(
                "max by (backend, state) (llm_health_remediator_lifecycle_state{backend=~\"$backend\"}) == 1",
                "{{backend}} {{state}}",
            ),),
            w=24, h=8,
            mappings=value_mappings([(1, "active", "green")]),
            description="Which lifecycle state each backend is in (one 0/1 series per state).",
        ),
        Panel(
            "Remediator scrape up", "stat",
            (Target("up{job=~\".*remediator.*\"}", "{{instance}}", instant=True),),
            w=24, h=4, mappings=value_mappings([(0, "down", "red"), (1, "up", "green")]),
        ),
    ),
)

DASHBOARDS: dict[str, Dashboard] = {
    "llm-health-fleet.json": FLEET,
    "llm-health-remediator.json": REMEDIATOR,
}


def dumps(d: Dashboard) -> str:
    return json.dumps(render(d), indent=2, sort_keys=False) + "\n"


def generate(out_dir: Path = HERE) -> list[Path]:
    written = []
    for name, d in DASHBOARDS.items():
        path = out_dir / name
        path.write_text(dumps(d))
        written.append(path)
    return written


def main() -> int:
    for path in generate():
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
