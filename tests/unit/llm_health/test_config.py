"""The shared config: the example file documents every setting, bad input changes nothing, and the
defaults hold (the re-verification window outlasts a long engine step)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from llm_health.config import (
    Config,
    ConfigError,
    DiscoverySettings,
    ExporterSettings,
    RemediatorSettings,
    load_config,
    local_url,
    parse_config,
    parse_named_url,
)
from tests.support.paths import REPO

EXAMPLE = REPO / "deploy" / "llm-health.example.yml"


def test_example_config_loads_and_names_every_setting() -> None:
    config = load_config(EXAMPLE)
    assert [b.name for b in config.backends] == ["gpu-a", "gpu-b", "gpu-c"]
    assert config.backends[0].restart == ("systemctl", "--no-ask-password", "restart", "vllm@gpu-a.service")
    gpu_c = config.backends[2]      # the three-step restart: stop, headroom, start
    assert not gpu_c.restart and gpu_c.stop[-2:] == ("stop", "vllm@gpu-c.service") and gpu_c.headroom
    assert gpu_c.start[-2:] == ("start", "vllm@gpu-c.service")
    raw = yaml.safe_load(EXAMPLE.read_text())
    for section, cls in (("exporter", ExporterSettings), ("remediator", RemediatorSettings),
                         ("discovery", DiscoverySettings)):
        missing = {f.name for f in dataclasses.fields(cls)} - set(raw[section])
        assert not missing, f"{EXAMPLE.name} does not document {section}: {sorted(missing)}"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"backends": [{"name": "a b", "url": "http://x:1"}]}, "name"),
        ({"backends": [{"name": "a", "url": "ftp://x"}]}, "url"),
        ({"backends": [{"name": "a", "url": "http://x:1", "restart": "systemctl restart x"}]}, "argv"),
        ({"backends": [{"name": "a", "url": "http://x:1"}, {"name": "a", "url": "http://y:1"}]}, "duplicate"),
        ({"exporter": {"interval": "soon"}}, "exporter.interval"),
        ({"exporter": {"stall_after": -1}}, "exporter.stall_after"),
        ({"remediator": {"dry_run": "yes"}}, "remediator.dry_run"),
        ({"remediator": {"backoff": {"initial": 1, "jitter": 2}}}, "remediator.backoff"),
        ({"surprise": 1}, "unknown key"),
        ({"remediator": {"request_timeout": 0}}, "remediator.request_timeout"),
        ({"remediator": {"idle_timeout": 0}}, "remediator.idle_timeout"),
        ({"remediator": {"max_header_bytes": 100}}, "remediator.max_header_bytes"),
        ({"remediator": {"max_body_bytes": 0}}, "remediator.max_body_bytes"),
        ({"remediator": {"max_pending_per_peer": 0}}, "remediator.max_pending_per_peer"),
        ({"remediator": {"max_pending_connections": 10, "max_pending_per_peer": 20}}, "max_pending_per_peer"),
        ({"remediator": {"max_pending_connections": 1.5}}, "remediator.max_pending_connections"),
    ],
)
def test_bad_config_is_refused_with_a_message_naming_the_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


def test_instance_label_matches_a_backend_by_address() -> None:
    config = parse_config({"backends": [{"name": "a", "url": "http://10.0.0.5:8000"}]})
    assert isinstance(config, Config)
    assert config.backend_for_instance("10.0.0.5:8000").name == "a"
    assert config.backend_for_instance("http://10.0.0.5:8000/metrics").name == "a"
    assert config.backend_for_instance("10.0.0.5:8001") is None


def test_named_url_flag() -> None:
    assert parse_named_url("a=http://h:1/", "--backend") == ("a", "http://h:1")
    with pytest.raises(ConfigError, match="NAME=URL"):
        parse_named_url("http://h:1", "--backend")


def test_unreadable_and_invalid_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("backends: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_default_verification_is_one_fresh_look_not_the_evidence_again() -> None:
    """Issue 25: the alert already waited the stall out; the re-check is two readings 5 s apart (a long step
    extends them: tests/unit/exporter/test_steptime.py), not another 20 s window."""
    r = RemediatorSettings()
    assert (r.verify_readings, r.verify_interval) == (2, 5.0)
    assert r.unresponsive_after == 120.0


def test_local_url_of_a_listen_address() -> None:
    """What `llm-health ctl --config` and the remediator's exporter evidence call: the URL this host reaches
    a listen address at."""
    assert local_url("127.0.0.1:9411") == "http://127.0.0.1:9411"
    assert local_url("0.0.0.0:9410") == local_url(":9410") == local_url("[::]:9410") == "http://127.0.0.1:9410"
    assert local_url("[::1]:9410") == "http://[::1]:9410"
    assert local_url("exporter:9410") == "http://exporter:9410"
    assert local_url("127.0.0.1") == local_url("host:http") == ""
