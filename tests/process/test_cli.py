"""The `llm-health` command: every subcommand answers --help, bad input gets a clear error."""

from __future__ import annotations

import subprocess

import pytest

from llm_health.cli import COMMANDS
from llm_health.drill.procs import llm_health


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help(command: str) -> None:
    done = subprocess.run(llm_health(command, "--help"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: llm-health {command}")
    assert COMMANDS[command][1] in " ".join(done.stdout.split())


def test_top_level_help_lists_every_subcommand() -> None:
    done = subprocess.run(llm_health("--help"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for command in COMMANDS:
        assert command in done.stdout


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("backends:\n  - name: a\n    url: not-a-url\n")
    done = subprocess.run(llm_health("exporter", "--config", bad), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "url" in done.stderr and "Traceback" not in done.stderr
