"""Group labels (llm_health/groups.py): which cluster and namespace an alert, a backend and a remediator
belong to. Pure."""

from __future__ import annotations

import pytest

from llm_health import groups
from llm_health.config import ConfigError, parse_config


def test_an_alert_of_the_group_matches_and_another_value_says_whose() -> None:
    wanted = (("cluster", "eu-1"),)
    assert groups.mismatch({"cluster": "eu-1", "backend": "vllm-0"}, wanted, "this remediator") is None
    why = groups.mismatch({"cluster": "us-2"}, wanted, "this remediator")
    assert why == "cluster='us-2': another group's alert (this remediator is cluster='eu-1')"


def test_a_missing_group_label_never_matches() -> None:
    """Fail closed: an alert that does not say its group is not taken for ours."""
    why = groups.mismatch({"backend": "vllm-0"}, (("namespace", "llm"),), "backend vllm-0")
    assert why is not None and "carries no namespace label" in why and "--group-labels" in why


def test_no_group_set_matches_every_alert() -> None:
    assert groups.mismatch({}, (), "this remediator") is None


def test_recorded_group_keeps_cluster_namespace_and_the_settings_own() -> None:
    labels = {"cluster": "eu-1", "namespace": "llm", "zone": "a", "pod": "vllm-0", "backend": "vllm-0"}
    assert groups.group_of(labels) == (("cluster", "eu-1"), ("namespace", "llm"))
    assert groups.group_of(labels, ["zone"]) == (("cluster", "eu-1"), ("namespace", "llm"), ("zone", "a"))
    assert groups.group_of({"backend": "x"}) == ()
    assert groups.shown((("cluster", "eu-1"), ("namespace", "llm"))) == 'cluster="eu-1",namespace="llm"'


def test_a_discovered_backend_takes_only_the_named_target_labels() -> None:
    target = {"namespace": "llm", "pod": "vllm-0", "cluster": ""}
    assert groups.from_target(target, ("namespace", "cluster")) == (("namespace", "llm"),)
    assert groups.from_target(target, ()) == ()


def test_config_takes_the_remediator_group_and_backend_labels() -> None:
    config = parse_config({
        "backends": [{"name": "vllm-0", "url": "http://127.0.0.1:8000", "labels": {"namespace": "llm"}}],
        "remediator": {"group_labels": {"cluster": "eu-1"}, "dry_run": True},
        "discovery": {"group_labels": ["namespace"]},
    })
    assert config.remediator.group_labels == (("cluster", "eu-1"),) and config.remediator.dry_run is True
    backend = config.backend("vllm-0")
    assert backend is not None and backend.labels == (("namespace", "llm"),)
    assert config.discovery.group_labels == ("namespace",)


@pytest.mark.parametrize(("section", "bad", "message"), [
    ("remediator", {"group_labels": ["cluster"]}, "remediator.group_labels: must be a mapping"),
    ("remediator", {"group_labels": {"cluster": ""}}, "remediator.group_labels.cluster: must be a non-empty"),
    ("remediator", {"group_labels": {"backend": "x"}}, "'backend' names something else"),
    ("remediator", {"group_labels": {"1x": "a"}}, "'1x' is not a label name"),
    ("discovery", {"group_labels": "namespace"}, "discovery.group_labels: must be a list"),
    ("discovery", {"group_labels": ["__meta_kubernetes_namespace"]}, "is not a target label name"),
])
def test_bad_group_settings_are_refused_with_where(section: str, bad: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_config({section: bad})


def test_bad_backend_labels_are_refused_with_where() -> None:
    with pytest.raises(ConfigError, match=r"backends\[0\]\.labels: must be a mapping"):
        parse_config({"backends": [{"name": "a", "url": "http://127.0.0.1:1", "labels": "ns=llm"}]})
