"""Test support: every PromQL query of the checked-in Grafana dashboards, ready to run.

`dashboards_queries()` returns `[(dashboard, panel title, expr)]` with Grafana's variables replaced by
concrete values, so a test can hand each expr to promtool or to a live Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = ROOT / "dashboards"

# Grafana variable -> a concrete value Prometheus accepts. `$backend` sits inside a regex matcher.
SUBSTITUTIONS: dict[str, str] = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "${backend}": ".+",
    "$backend": ".+",
}
LEFTOVER_VARIABLE = re.compile(r"\$\{?[A-Za-z_]")


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARD_DIR.glob("*.json"))


def load_dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def substitute(expr: str) -> str:
    """Replace Grafana variables (longest names first); a variable left over is an error."""
    for name in sorted(SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(name, SUBSTITUTIONS[name])
    if LEFTOVER_VARIABLE.search(expr):
        raise ValueError(f"unknown Grafana variable in {expr!r}")
    return expr


def iter_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Panels, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboards_queries() -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for path in dashboard_files():
        dashboard = load_dashboard(path)
        for panel in iter_panels(dashboard):
            for target in panel.get("targets", []):
                if "expr" in target:
                    out.append((path.stem, panel["title"], substitute(target["expr"])))
    return out


def promtool_check_exprs(exprs: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    """promtool 2.42 has no parse-only command: wrap every expr in a recording rule and check the file."""
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = workdir / "dashboard-queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, sort_keys=False))
    return subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
