"""A discovery selector means what the same matchers mean in Prometheus (RE2, ^(?s:...)$): a pattern
Prometheus would refuse is refused at load with the reason, and no target is selected that Prometheus'
own matcher would not select (Python's re did: its \\d takes any Unicode digit)."""

from __future__ import annotations

import re

import pytest

from llm_health.config import ConfigError
from llm_health.discovery import parse_selector, selects
from tests.support.discovery import pod


@pytest.mark.parametrize("pattern", [r"(vllm)-\\1", r"vllm-(?=[0-9])[0-9]+", r"vllm-(?!canary).*", r"(?<=vllm-)[0-9]+",
                                     r"(?>vllm)-0", r"vllm-[0-9]*+"])
def test_patterns_prometheus_refuses_are_refused_with_the_reason(pattern: str) -> None:
    re.compile(pattern.replace("\\\\", "\\"))          # Python's re would have accepted it
    with pytest.raises(ConfigError, match=r"discovery.selector: bad regular expression .*RE2"):
        parse_selector(f'job="vllm", __meta_kubernetes_pod_name=~"{pattern}"')


def test_a_unicode_digit_is_no_digit_as_in_prometheus() -> None:
    (matcher,) = parse_selector(r'__meta_kubernetes_pod_name=~"vllm-\\d+"')
    real, lookalike = pod("vllm-3"), pod("vllm-٣")      # ARABIC-INDIC DIGIT THREE
    assert selects([matcher], real["labels"], real["discoveredLabels"])
    assert re.fullmatch(r"vllm-\d+", "vllm-٣")           # what the old matching said
    assert not selects([matcher], lookalike["labels"], lookalike["discoveredLabels"])
    negated = parse_selector(r'__meta_kubernetes_pod_name!~"vllm-\\d+"')
    assert selects(negated, lookalike["labels"], lookalike["discoveredLabels"])


def test_matching_stays_anchored() -> None:
    (matcher,) = parse_selector('__meta_kubernetes_namespace=~"llm|llm-serving"')
    for namespace, expected in (("llm", True), ("llm-serving", True), ("llm-serving-x", False), ("xllm", False)):
        p = pod("vllm-0", namespace=namespace)
        assert selects([matcher], p["labels"], p["discoveredLabels"]) is expected, namespace
