"""Regexes mean what they mean in Prometheus: RE2, anchored ^(?s:...)$. Each case below is one where
Python's `re` means something else (it accepts the pattern, or matches differently); the agreement with
the real Prometheus engine is checked with promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llm_health import promregex
from llm_health.config import ConfigError
from llm_health.render.rules import RuleSettings, render

PROMTOOL = shutil.which("promtool")

# RE2 refuses them, Python's re accepts them
REFUSED = [r"(vllm)-\1", r"vllm(?=-0)", r"vllm(?!-0)", r"(?<=llm-)serving", r"(?<!x)y", r"(?>vllm)", r"vllm-[0-9]*+",
           r"vllm\Z"]
# (pattern, label value, Prometheus' answer): Python's re.fullmatch answers the opposite
DIFFERENT = [
    (r"vllm-\d+", "vllm-٣", False),        # RE2's \d is ASCII; re's any Unicode digit (ARABIC-INDIC THREE)
    (r"\w+", "modèle", False),              # \w: ASCII word characters only
    (r"a\sb", "a\u00a0b", False),           # \s: no NO-BREAK SPACE
    (r"llm.serving", "llm\nserving", True),  # `.` matches a newline (Prometheus 3, (?s))
]
# the same in both, with the anchoring that matters
SAME = [(r"vllm-.*", "vllm-0", True), (r"vllm", "vllm-0", False), (r"vllm", "xvllm", False),
        (r"a|ab", "ab", True), (r"vllm", "vllm\n", False), (r"", "", True), (r"(?i)VLLM", "vllm", True)]


@pytest.mark.parametrize("pattern", REFUSED)
def test_what_re2_refuses_is_refused_with_the_reason(pattern: str) -> None:
    re.compile(pattern)                                   # Python's re would have taken it
    with pytest.raises(promregex.PromRegexError, match="RE2"):
        promregex.compile_matcher(pattern)


def test_a_value_cannot_escape_the_anchors() -> None:
    with pytest.raises(promregex.PromRegexError):
        promregex.compile_matcher("a)|(b")            # would be ^(?s:a)|(b)$: b anywhere
    with pytest.raises(promregex.PromRegexError):
        promregex.compile_matcher("(a")


@pytest.mark.parametrize(("pattern", "text", "expected"), DIFFERENT)
def test_where_python_re_means_something_else(pattern: str, text: str, expected: bool) -> None:
    assert (re.fullmatch(pattern, text) is not None) is not expected
    assert promregex.matches(pattern, text) is expected


@pytest.mark.parametrize(("pattern", "text", "expected"), SAME)
def test_anchored_as_prometheus_anchors(pattern: str, text: str, expected: bool) -> None:
    assert promregex.matches(pattern, text) is expected


def test_a_bad_regex_in_the_rule_settings_is_refused() -> None:
    with pytest.raises(ConfigError, match="--error-rate-handlers.*RE2"):
        render(RuleSettings(error_rate_handlers="/v1/(?!embeddings)"))


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make debs)")
def test_the_real_prometheus_engine_agrees(tmp_path: Path) -> None:
    """promtool evaluates `count(x{v=~PATTERN})` over series labelled with each text. The newline case is
    left out: Prometheus before 3.0 (Debian's promtool is 2.42) did not let `.` match a newline."""
    cases = [c for c in DIFFERENT + SAME if "\n" not in c[1] and c[1]]
    series = [{"series": f'x{{v="{text}", case="{i}"}}', "values": "1"} for i, (_, text, _) in enumerate(cases)]
    tests = []
    for i, (pattern, _, expected) in enumerate(cases):
        quoted = pattern.replace("\\", "\\\\")
        tests.append({"expr": f'count(x{{v=~"{quoted}", case="{i}"}})', "eval_time": "0m",
                      "exp_samples": [{"labels": "{}", "value": 1}] if expected else []})
    (tmp_path / "empty.yml").write_text("groups: []\n")
    doc = {"rule_files": [str(tmp_path / "empty.yml")], "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": tests}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(doc, allow_unicode=True))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "test.yml")], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for i, (pattern, text, expected) in enumerate(cases):
        assert promregex.matches(pattern, text) is expected, (i, pattern, text)
