"""Test support: every PromQL query of the checked-in Grafana dashboards, ready to run.

`dashboards_queries()` returns `[(dashboard, panel title, expr)]` with Grafana's variables replaced by
concrete values (a dashboard's own variables by their "All" value), so a test can hand each expr to
promtool or to a live Prometheus. `all_queries()` adds the annotations' and the variables' queries.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

ROOT = REPO
DASHBOARD_DIR = ROOT / "dashboards"

# Grafana's built-in variables -> a concrete value Prometheus accepts.
SUBSTITUTIONS: dict[str, str] = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
}
LEFTOVER_VARIABLE = re.compile(r"\$\{?[A-Za-z_]")
QUERY_RESULT = re.compile(r"^query_result\((.*)\)$", re.DOTALL)


def dashboard_files(directory: Path = DASHBOARD_DIR) -> list[Path]:
    return sorted(directory.glob("*.json"))


def load_dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def variable_values(dashboard: dict[str, Any]) -> dict[str, str]:
    """A dashboard's query variables -> the value Grafana puts in for "All" (`$name` and `${name}`)."""
    values: dict[str, str] = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            values[f"${{{variable['name']}}}"] = values[f"${variable['name']}"] = variable["allValue"]
    return values


def substitute(expr: str, variables: dict[str, str] | None = None) -> str:
    """Replace Grafana variables (longest names first); a variable left over is an error."""
    table = {**SUBSTITUTIONS, **(variables or {})}
    for name in sorted(table, key=len, reverse=True):
        expr = expr.replace(name, table[name])
    if LEFTOVER_VARIABLE.search(expr):
        raise ValueError(f"unknown Grafana variable in {expr!r}")
    return expr


def iter_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Panels, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every panel query as written."""
    return [(p["title"], t["expr"]) for p in iter_panels(dashboard) for t in p.get("targets", []) if "expr" in t]


def annotation_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(annotation name, expr) of every annotation query as written."""
    return [(a["name"], a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]


def raw_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) of every query as written: panels, annotations, variables (query_result's inside)."""
    out = panel_exprs(dashboard) + [(f"annotation {name}", expr) for name, expr in annotation_exprs(dashboard)]
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            match = QUERY_RESULT.match(variable["definition"])
            assert match, f"variable {variable['name']}: {variable['definition']!r} is not a query_result()"
            out.append((f"variable {variable['name']}", match.group(1)))
    return out


def substituted(pick: Callable[[dict[str, Any]], list[tuple[str, str]]],
                directory: Path = DASHBOARD_DIR) -> list[tuple[str, str, str]]:
    """`pick`'s (where, expr) of every dashboard, its variables substituted: (dashboard, where, expr)."""
    out: list[tuple[str, str, str]] = []
    for path in dashboard_files(directory):
        dashboard = load_dashboard(path)
        values = variable_values(dashboard)
        out += [(path.stem, where, substitute(expr, values)) for where, expr in pick(dashboard)]
    return out


def dashboards_queries(directory: Path = DASHBOARD_DIR) -> list[tuple[str, str, str]]:
    """Every panel query: (dashboard, panel title, expr)."""
    return substituted(panel_exprs, directory)


def annotation_queries(directory: Path = DASHBOARD_DIR) -> list[tuple[str, str, str]]:
    """Every annotation query, variables substituted: (dashboard, annotation name, expr)."""
    return substituted(annotation_exprs, directory)


def all_queries(directory: Path = DASHBOARD_DIR) -> list[tuple[str, str, str]]:
    """Panels', annotations' and variables' queries, variables substituted: (dashboard, where, expr)."""
    return substituted(raw_queries, directory)


def promtool_check_exprs(exprs: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    """promtool 2.42 has no parse-only command: wrap every expr in a recording rule and check the file."""
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = workdir / "dashboard-queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, sort_keys=False))
    return subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
