"""The remediator's /metrics follows Prometheus' naming conventions: a Unix time ends in
`_timestamp_seconds` (so nobody graphs it as a duration), and `promtool check metrics` finds nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from llm_health.config import parse_config
from llm_health.remediator.metrics import registry_for
from llm_health.remediator.store import SqliteStore

PROMTOOL = shutil.which("promtool")


def exposition(tmp_path: Path) -> str:
    store = SqliteStore(tmp_path / "state.db")
    store.init()
    try:
        config = parse_config({"backends": [{"name": "gpu-a", "url": "http://127.0.0.1:9", "restart": ["r"]}]})
        return generate_latest(registry_for(config, store, lambda: {"ok": True})).decode()
    finally:
        store.close()


def helps(text: str) -> dict[str, str]:
    return {line.split(" ", 3)[2]: line.split(" ", 3)[3] for line in text.splitlines() if line.startswith("# HELP ")}


def test_unix_times_end_in_timestamp_seconds(tmp_path: Path) -> None:
    found = helps(exposition(tmp_path))
    assert "llm_health_remediator_lifecycle_since_timestamp_seconds" in found
    assert "llm_health_remediator_lifecycle_since_seconds" not in found
    times = {name for name, text in found.items() if name.startswith("llm_health_") and "Unix time" in text}
    assert times and all(name.endswith("_timestamp_seconds") for name in times), times


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_promtool_check_metrics_is_clean(tmp_path: Path) -> None:
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition(tmp_path), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr)
