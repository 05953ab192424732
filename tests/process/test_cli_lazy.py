"""`llm-health --version`, `--help` and the light subcommands do not import the web stack.

Each command runs in a fresh interpreter with `-X importtime`, which lists every module imported;
the heavy dependencies (flask, gunicorn, requests, prometheus_client and the markdown renderer) must
not be among them. The subcommands that need them still get them (the check is not vacuous).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("flask", "gunicorn", "requests", "prometheus_client", "markdown", "werkzeug")


def imported_modules(*args: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "llm_health.cli", *args],
                            capture_output=True, text=True, timeout=60)
    modules = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            modules.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return modules, result


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("rules", "--help"), ("dashboards", "--help"),
                                  ("check", "--help"), ("healthcheck", "--help"), ("readiness", "--help")])
def test_light_commands_do_not_import_the_web_stack(args: tuple[str, ...]) -> None:
    modules, result = imported_modules(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "llm_health" in modules  # importtime saw our imports at all
    assert not modules & set(HEAVY), f"{' '.join(args)} imported {sorted(modules & set(HEAVY))}"


def test_help_still_lists_every_subcommand() -> None:
    from llm_health.cli import COMMANDS

    _, result = imported_modules("--help")
    for name in COMMANDS:
        assert name in result.stdout


def test_the_remediator_subcommand_imports_its_stack() -> None:
    modules, result = imported_modules("remediator", "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert {"flask", "gunicorn"} <= modules
