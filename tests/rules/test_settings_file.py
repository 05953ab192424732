"""`--settings FILE`: the settings written once give every render (rules, PrometheusRule, dashboards,
ConfigMaps, mixin) what the same flags give; a flag wins over the file; bad files are refused and
write nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_health.cli import main

SETTINGS = """\
runbook-base-url: https://llm-health.example.com/runbooks
group-labels: [cluster, namespace]
vllm-selector: 'job="vllm-prod"'
min-backends-up: 2
kv-threshold: 0.8
queue-depth-threshold: 80
degraded-factor: 2
ttft-slo-window: 2h
watchdog: true
severity: {LLMTooFewBackendsUp: page, LLMKVCachePressure:critical: page}
extra-label: {team: ml-platform}
"""
FLAGS = ["--runbook-base-url", "https://llm-health.example.com/runbooks", "--group-labels", "cluster,namespace",
         "--vllm-selector", 'job="vllm-prod"', "--min-backends-up", "2", "--kv-threshold", "0.8", "--queue-depth-threshold", "80",
         "--degraded-factor", "2", "--ttft-slo-window", "2h", "--watchdog",
         "--severity", "LLMTooFewBackendsUp=page", "--severity", "LLMKVCachePressure:critical=page",
         "--extra-label", "team=ml-platform"]
RENDERS = [["rules", "render"], ["rules", "render", "--format", "prometheusrule"],
           ["dashboards", "render"], ["dashboards", "render", "--format", "configmap"]]


def files(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("command", RENDERS, ids=lambda c: "-".join(c))
def test_the_file_gives_what_the_flags_give(command: list[str], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "render.yml").write_text(SETTINGS)
    assert main([*command, "--out", str(tmp_path / "flags"), *FLAGS]) == 0
    assert main([*command, "--out", str(tmp_path / "file"), "--settings", str(tmp_path / "render.yml")]) == 0
    assert main([*command, "--out", str(tmp_path / "default")]) == 0
    assert files(tmp_path / "file") == files(tmp_path / "flags") != files(tmp_path / "default")
    err = capsys.readouterr().err
    assert err.count("--runbook-base-url is not set") == 1  # only the default render warns


def test_a_flag_wins_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "render.yml").write_text(SETTINGS)
    assert main(["rules", "render", "--out", str(tmp_path / "a"), "--settings", str(tmp_path / "render.yml"),
                 "--runbook-base-url", "https://other.example.com/rb"]) == 0
    text = (tmp_path / "a" / "llm_health_alerts.yml").read_text()
    assert "https://other.example.com/rb#llmbackendstalled" in text and "llm-health.example.com" not in text
    assert 'job="vllm-prod"' in text  # the rest still from the file


def test_group_labels_in_the_file_count_as_given_for_kubernetes(tmp_path: Path) -> None:
    (tmp_path / "render.yml").write_text("group-labels: cluster\n")
    assert main(["rules", "render", "--format", "prometheusrule", "--out", str(tmp_path / "k"),
                 "--settings", str(tmp_path / "render.yml")]) == 0
    text = (tmp_path / "k" / "prometheusrule.yaml").read_text()
    assert "by (cluster, backend)" in text and "namespace" not in text.split("spec:", 1)[1]


@pytest.mark.parametrize(("content", "error"), [
    ("runbook-base: https://x.example.com/rb\n", "unknown setting 'runbook-base'"),
    ("min-backends-up: two\n", "min-backends-up: must be an integer"),
    ("watchdog: yes please\n", "watchdog: must be true or false"),
    ("group-labels: {a: b}\n", "group-labels: must be a list"),
    ("down-for: 120\n", "down-for: must be a string"),
    ("- a\n- b\n", "must be a mapping of settings"),
    ("runbook-base-url: javascript:alert(1)\n", "--runbook-base-url"),   # validated as the flag is
    ("a: [\n", "cannot be read"),
])
def test_a_bad_file_is_refused_and_writes_nothing(content: str, error: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "render.yml").write_text(content)
    assert main(["rules", "render", "--out", str(tmp_path / "out"), "--settings", str(tmp_path / "render.yml")]) == 2
    assert error in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
