"""Discovery's pure parts: selector, target list -> backends, placeholder expansion (hostile labels),
the refresher's keep-last-good / grace / static-wins rules with an injected clock, and the config."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llm_health.config import Backend, ConfigError, DiscoverySettings, parse_config
from llm_health.discovery import (
    Discovery,
    LiveBackends,
    Matcher,
    PlaceholderError,
    RefusalKind,
    backends_from_targets,
    dns1123,
    expand_argv,
    parse_answer,
    parse_selector,
    template_placeholders,
)
from llm_health.discovery.collector import DiscoveryCollector
from tests.support.discovery import SETTINGS, Answers, pod, target
from tests.support.fakes import FakeClock

# ---- selector ------------------------------------------------------------------------------------

def test_selector_parses_the_four_operators_and_braces() -> None:
    got = parse_selector('{job="vllm", namespace=~"llm-.*",pod!="x", zone !~ "a|b"}')
    assert got == (Matcher("job", "=", "vllm"), Matcher("namespace", "=~", "llm-.*"),
                   Matcher("pod", "!=", "x"), Matcher("zone", "!~", "a|b"))


def test_selector_matching_is_anchored_and_missing_labels_are_empty() -> None:
    m = parse_selector('job=~"vllm", team=""')
    assert all(x.matches({"job": "vllm"}) for x in m)
    assert not m[0].matches({"job": "vllm-canary"})        # =~ is anchored as in PromQL
    assert not m[1].matches({"job": "vllm", "team": "a"})
    assert parse_selector('a!~"x.*"')[0].matches({})


def test_selector_escapes() -> None:
    assert parse_selector(r'a="say \"hi\" \\ ok"')[0].value == 'say "hi" \\ ok'


@pytest.mark.parametrize("bad", [
    "", "   ", "{}", 'job', 'job=vllm', 'job="vllm"  x="y"', 'job=="vllm"', '9job="x"', 'job="unterminated',
    'job=~"(("', r'job="\n"', 'up{job="x"}', 'job="a",,', 'job="a";rm -rf /', "x" * 3000,
])
def test_selector_refuses_anything_else(bad: str) -> None:
    with pytest.raises(ConfigError, match="discovery.selector"):
        parse_selector(bad)


def test_spaces_and_a_trailing_comma_are_fine_as_in_promql() -> None:
    assert len(parse_selector('  job = "a" ,  b != "c" , ')) == 2


# ---- placeholders --------------------------------------------------------------------------------

@pytest.mark.parametrize("good", ["vllm-0", "a", "gpu-a.node-1", "x" * 63, ".".join(["a" * 63] * 3) + ".b"])
def test_dns1123_accepts(good: str) -> None:
    assert dns1123(good)


HOSTILE = [
    "", "two words", "a;reboot", "$(reboot)", "`id`", "../etc/passwd", "..", "a..b", ".a", "a.", "-a", "a-",
    "UPPER", "under_score", "vllm\n-0", "vllm\x00", "pod*", "ünïcode", "ｖｌｌｍ", "a/b", "--force", "a b",
    "x" * 64, ".".join(["a" * 63] * 4) + ".bb", "{pod}", "a'b", 'a"b', "a|b", "a&b", "a>b",
]


@pytest.mark.parametrize("bad", HOSTILE)
def test_dns1123_refuses_hostile_values(bad: str) -> None:
    assert not dns1123(bad)


@pytest.mark.parametrize("bad", HOSTILE)
def test_expansion_refuses_hostile_values(bad: str) -> None:
    with pytest.raises(PlaceholderError, match="not a DNS-1123 name"):
        expand_argv(["kubectl", "delete", "pod", "{pod}"], {"pod": bad})


def test_expansion_fills_whole_and_partial_arguments_and_literal_braces() -> None:
    argv = expand_argv(["systemctl", "restart", "vllm@{backend}.service", "{{literal}}", "-n", "{namespace}"],
                       {"backend": "gpu-a", "namespace": "llm"})
    assert argv == ("systemctl", "restart", "vllm@gpu-a.service", "{literal}", "-n", "llm")


def test_expansion_without_the_label_is_refused() -> None:
    with pytest.raises(PlaceholderError, match="no label 'pod'"):
        expand_argv(["x", "{pod}"], {})


def test_expanded_value_is_one_argument_never_split_or_interpreted() -> None:
    # even a valid value can only ever be one argv element
    assert expand_argv(["a", "{pod}"], {"pod": "b.c"}) == ("a", "b.c")


@pytest.mark.parametrize("bad", [["x", "{0}"], ["x", "{pod.__class__}"], ["x", "{pod!r}"], ["x", "{pod:>9}"],
                                 ["x", "{"], ["x", "}"], ["x", "{ pod }"], ["x", ""], [3]])
def test_template_syntax_is_checked_at_load(bad: list[Any]) -> None:
    with pytest.raises(ConfigError, match="discovery.restart"):
        template_placeholders(bad)


def test_template_placeholders_names() -> None:
    assert template_placeholders(["kubectl", "-n", "{namespace}", "{pod}", "{{x}}", "{pod}"]) == ("namespace", "pod")


# ---- target list -> backends ---------------------------------------------------------------------

def test_targets_become_backends() -> None:
    found = backends_from_targets(
        [pod("vllm-1", "10.0.0.6:8000", node="n2"),
         pod("vllm-0", "10.0.0.5:8000", node="n1"),
         target("other", "10.0.0.7:9100", job="node")],
        SETTINGS, parse_selector(SETTINGS.selector))
    assert found.targets == 2 and not found.refusals and not found.duplicates
    assert found.backends == (
        Backend("vllm-0", "http://10.0.0.5:8000", "n1", "", ("kubectl", "delete", "pod", "-n", "llm", "vllm-0")),
        Backend("vllm-1", "http://10.0.0.6:8000", "n2", "", ("kubectl", "delete", "pod", "-n", "llm", "vllm-1")),
    )


def test_name_and_host_labels_are_configurable_and_url_keeps_a_path_prefix() -> None:
    t = target("ignored", "h:443", meta={"unit": "vllm-0", "machine": "box-1"}, pod="vllm-0", instance="ignored")
    t["scrapeUrl"] = "https://h:443/prefix/metrics?x=1"
    s = DiscoverySettings(prometheus_url="http://p:9090", name_label="pod", name_from="unit", host_from="machine",
                          model_label="model", restart=("restart-vllm", "{backend}"))
    t["labels"]["model"] = "m1"
    found = backends_from_targets([t], s, parse_selector(s.selector))
    assert found.backends == (Backend("vllm-0", "https://h:443/prefix", "box-1", "m1", ("restart-vllm", "vllm-0")),)


def test_a_discovered_backend_carries_the_group_labels_named_in_the_settings() -> None:
    """discovery.group_labels: target labels an alert about the backend must carry (llm_health/groups.py);
    the series, and so the alerts, carry the target's labels."""
    s = replace(SETTINGS, group_labels=("namespace", "cluster"))
    found = backends_from_targets([pod("vllm-0", namespace="llm")], s, parse_selector(s.selector))
    assert [b.labels for b in found.backends] == [(("namespace", "llm"),)]     # no cluster label: none kept
    found = backends_from_targets([pod("vllm-0", namespace="llm")], SETTINGS, parse_selector(SETTINGS.selector))
    assert [b.labels for b in found.backends] == [()]                          # off by default


def test_url_from_discovered_labels_without_scrape_url() -> None:
    t = target("gpu-a", "10.0.0.5:8000")
    del t["scrapeUrl"]
    t["discoveredLabels"]["__scheme__"] = "https"
    found = backends_from_targets([t], DiscoverySettings(), parse_selector('job="vllm"'))
    assert found.backends[0].url == "https://10.0.0.5:8000"


@pytest.mark.parametrize("bad", ["$(reboot)", "llm;reboot", "a b", "../x"])
def test_hostile_label_keeps_the_backend_watched_but_without_restart(bad: str) -> None:
    found = backends_from_targets([pod("vllm-0", namespace=bad)], SETTINGS, parse_selector(SETTINGS.selector))
    assert [b.name for b in found.backends] == ["vllm-0"]
    assert found.backends[0].restart == ()
    (r,) = found.refusals
    assert r.restart_only and r.backend == "vllm-0" and bad in r.reason and "{namespace}" in r.reason
    assert r.kind == RefusalKind.PLACEHOLDER and "__meta_kubernetes_namespace" in r.reason


@pytest.mark.parametrize("name", ["", "a b", "a;b", "x" * 65, "ünï", "../x"])
def test_target_with_an_invalid_name_is_refused(name: str) -> None:
    found = backends_from_targets([target(name)], SETTINGS, parse_selector(SETTINGS.selector))
    assert found.backends == () and len(found.refusals) == 1 and not found.refusals[0].restart_only


def test_static_names_win_and_a_duplicate_name_is_refused_for_every_claimant() -> None:
    found = backends_from_targets(
        [target("dup", "10.0.0.9:1"), target("dup", "10.0.0.1:1"), target("static-a", "10.0.0.2:1"),
         target("b", "10.0.0.3:1")],
        DiscoverySettings(), parse_selector('job="vllm"'), reserved=["static-a"])
    assert [(b.name, b.url) for b in found.backends] == [("b", "http://10.0.0.3:1")]
    assert sorted(r.reason.split(":")[0].split(";")[0] for r in found.refusals) == \
        ["a static backend has this name", "duplicate", "duplicate"]
    (dup,) = found.duplicates
    assert dup.name == "dup" and dup.targets == ("http://10.0.0.1:1/metrics", "http://10.0.0.9:1/metrics")
    assert {r.target for r in found.refusals if r.kind == RefusalKind.DUPLICATE} == set(dup.targets)


def test_odd_metrics_path_or_scheme_is_refused() -> None:
    t = target("a")
    t["scrapeUrl"] = "http://10.0.0.5:8000/federate"
    found = backends_from_targets([t, "junk", {"labels": None}], DiscoverySettings(), parse_selector('job="vllm"'))
    assert found.backends == () and "cannot tell its URL" in found.refusals[0].reason


def test_parse_answer() -> None:
    assert parse_answer(json.dumps({"status": "success", "data": {"activeTargets": [1]}}).encode()) == [1]
    for bad in (b"{}", b"[]", b'{"status":"error","error":"x"}', b'{"status":"success","data":{}}', b"nope"):
        with pytest.raises(ValueError):
            parse_answer(bad)


# ---- the refresher -------------------------------------------------------------------------------


def make(grace: float = 60.0, static: tuple[Backend, ...] = ()) -> tuple[Discovery, Answers, FakeClock]:
    answers, mono = Answers(), FakeClock(100.0)
    d = Discovery(DiscoverySettings(prometheus_url="http://p:9090", refresh=10, grace=grace), static=static,
                  fetch=answers, monotonic=mono, wall=FakeClock(1_700_000_000.0))
    return d, answers, mono


def registry(d: Discovery) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DiscoveryCollector(d.status))
    return reg


def names(d: Discovery) -> list[str]:
    return [b.name for b in d.backends()]


def test_a_failed_refresh_keeps_the_last_good_list_and_marks_it_stale() -> None:
    d, answers, mono = make()
    answers.next = [target("a", "h:1"), target("b", "h:2")]
    assert d.refresh() and names(d) == ["a", "b"]
    st = d.status()
    assert not st.stale and st.last_success == 1_700_000_000.0 and st.errors == 0
    for failure in (OSError("connection refused"), ValueError("bad json")):
        answers.next = failure
        mono.advance(1000)                                   # far past the grace period
        assert not d.refresh()
        assert names(d) == ["a", "b"]                        # never emptied by a bad answer
    st = d.status()
    assert st.stale and st.errors == 2 and "bad json" in st.last_error
    page = generate_latest(registry(d)).decode()
    assert "llm_health_discovery_stale 1.0" in page and "llm_health_discovery_errors_total 2.0" in page
    answers.next = [target("a", "h:1"), target("b", "h:2")]
    assert d.refresh() and not d.status().stale


def test_no_good_answer_for_two_intervals_is_stale() -> None:
    d, answers, mono = make()
    assert d.status().stale                                  # never answered yet
    answers.next = [target("a")]
    d.refresh()
    mono.advance(20)
    assert not d.status().stale
    mono.advance(0.5)
    assert d.status().stale


def test_a_vanished_backend_is_removed_only_after_the_grace_period() -> None:
    d, answers, mono = make(grace=60)
    answers.next = [target("a", "h:1"), target("b", "h:2")]
    d.refresh()
    answers.next = [target("a", "h:1")]
    mono.advance(30)
    d.refresh()
    assert names(d) == ["a", "b"]
    mono.advance(30)
    d.refresh()
    assert names(d) == ["a", "b"]                             # exactly 60 s: still within grace
    mono.advance(1)
    d.refresh()
    assert names(d) == ["a"]
    answers.next = [target("a", "h:1"), target("b", "h:3")]    # back, at a new address
    d.refresh()
    assert [b.url for b in d.backends()] == ["http://h:1", "http://h:3"]


def test_an_empty_answer_removes_nothing_before_the_grace_period() -> None:
    d, answers, mono = make(grace=60)
    answers.next = [target("a")]
    d.refresh()
    answers.next = []                                         # e.g. Prometheus restarted, SD not run yet
    mono.advance(59)
    d.refresh()
    assert names(d) == ["a"]


def test_keep_holds_a_backend_with_an_open_incident_past_grace() -> None:
    d, answers, mono = make(grace=10)
    held = {"a"}
    d.keep = lambda name: name in held
    answers.next = [target("a")]
    d.refresh()
    answers.next = []
    mono.advance(100)
    d.refresh()
    assert names(d) == ["a"]
    held.clear()
    d.refresh()
    assert names(d) == []


def test_static_backends_stay_and_win_on_name_clash() -> None:
    static = (Backend("a", "http://static:1"),)
    d, answers, _ = make(static=static)
    answers.next = [target("a", "other:1"), target("b", "h:2")]
    d.refresh()
    live = LiveBackends(static, d)
    assert [(b.name, b.url) for b in live] == [("a", "http://static:1"), ("b", "http://h:2")]
    assert len(live) == 2 and live[1].name == "b"
    assert d.status().refused == 1
    answers.next = OSError("down")
    d.refresh()
    assert [b.name for b in live] == ["a", "b"]
    assert LiveBackends(static) == static


def test_listeners_hear_good_refreshes_only() -> None:
    d, answers, _ = make()
    heard: list[tuple[list[str], int]] = []
    d.on_change(lambda backends, refusals: heard.append(([b.name for b in backends], len(refusals))))
    answers.next = [target("a"), target("bad name")]
    d.refresh()
    answers.next = OSError("x")
    d.refresh()
    assert heard == [(["a"], 1)]


# ---- config --------------------------------------------------------------------------------------

def test_config_defaults_off() -> None:
    c = parse_config({})
    assert not c.discovery.enabled and c.discovery.selector == 'job="vllm"' and c.discovery.grace == 300


def test_config_reads_the_section() -> None:
    c = parse_config({"discovery": {"prometheus_url": "http://127.0.0.1:9090", "selector": 'job=~"vllm|sglang"',
                                    "name_label": "pod", "refresh": 5, "restart": ["kubectl", "{pod}"],
                                    "name_from": "__meta_kubernetes_pod_name",
                                    "placeholders": {"pod": "__meta_kubernetes_pod_name"},
                                    "allow_networks": ["10.0.0.0/8", "fd00::/8"], "allow_ports": [8000]}})
    d = c.discovery
    assert d.enabled and d.restart == ("kubectl", "{pod}") and d.refresh == 5.0
    assert d.placeholder_labels == {"pod": "__meta_kubernetes_pod_name"} and d.name_from == "__meta_kubernetes_pod_name"
    assert d.allow_networks == ("10.0.0.0/8", "fd00::/8") and d.allow_ports == (8000,)
    assert d.host_from == "__meta_kubernetes_pod_node_name" and not d.allow_link_local and not d.allow_userinfo


@pytest.mark.parametrize("section, match", [
    ({"prometheus_url": "ftp://x"}, "discovery.prometheus_url"),
    ({"prometheus_url": "http://p", "selector": "job=vllm"}, "discovery.selector"),
    ({"prometheus_url": "http://p", "name_label": "a-b"}, "discovery.name_label"),
    ({"prometheus_url": "http://p", "restart": "kubectl delete"}, "discovery.restart"),
    ({"prometheus_url": "http://p", "restart": ["x", "{pod.__dict__}"]}, "discovery.restart"),
    ({"prometheus_url": "http://p", "placeholders": ["pod"]}, "discovery.placeholders"),
    ({"prometheus_url": "http://p", "placeholders": {"pod": "a-b"}}, "discovery.placeholders.pod"),
    ({"prometheus_url": "http://p", "placeholders": {"backend": "x"}}, "discovery.placeholders"),
    ({"prometheus_url": "http://p", "allow_networks": ["10.0.0.5/8"]}, "discovery.allow_networks"),
    ({"prometheus_url": "http://p", "allow_networks": "10.0.0.0/8"}, "discovery.allow_networks"),
    ({"prometheus_url": "http://p", "allow_ports": [0]}, "discovery.allow_ports"),
    ({"prometheus_url": "http://p", "allow_ports": ["80"]}, "discovery.allow_ports"),
    ({"prometheus_url": "http://p", "allow_link_local": "yes"}, "discovery.allow_link_local"),
    ({"prometheus_url": "http://p", "name_from": "a-b"}, "discovery.name_from"),
    ({"prometheus_url": "http://p", "extra_refresh_every": 0}, "discovery.extra_refresh_every"),
    ({"prometheus_url": "http://p", "refresh": 0}, "discovery.refresh"),
    ({"prometheus_url": "http://p", "grace": -1}, "discovery.grace"),
    ({"prometheus_url": "http://p", "selectr": "x"}, "unknown key"),
    ("yes", "discovery: must be a mapping"),
])
def test_config_refuses_bad_sections(section: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({"discovery": section})


# ---- wiring: exporter flags, remediator lookups and audit ------------------------------------------

def test_exporter_flags_turn_discovery_on_without_a_file() -> None:
    import argparse

    from llm_health.exporter.cli import build_config, configure

    parser = argparse.ArgumentParser()
    configure(parser)
    c = build_config(parser.parse_args(["--discover-from", "http://127.0.0.1:9090",
                                        "--discover-selector", 'job="sglang"']))
    assert c.discovery.enabled and c.discovery.selector == 'job="sglang"' and c.backends == ()
    with pytest.raises(ConfigError, match="--discover-selector"):
        build_config(parser.parse_args(["--backend", "a=http://h:1", "--discover-selector", 'job="x"']))
    with pytest.raises(ConfigError, match="discovery.selector"):
        build_config(parser.parse_args(["--discover-from", "http://p:9090", "--discover-selector", "job=x"]))
    with pytest.raises(ConfigError, match="nothing to watch"):
        build_config(parser.parse_args([]))


def test_config_lookups_see_discovered_backends() -> None:
    import dataclasses

    static = (Backend("s", "http://10.0.0.1:8000"),)
    d, answers, _ = make(static=static)
    config = dataclasses.replace(parse_config({}), backends=LiveBackends(static, d))
    assert config.backend("a") is None
    answers.next = [target("a", "10.0.0.5:8000")]
    d.refresh()
    assert config.backend("a") is not None and config.backend("a").url == "http://10.0.0.5:8000"
    assert config.backend_for_instance("10.0.0.5:8000").name == "a"
    assert [b.name for b in config.backends] == ["s", "a"]


def test_refusals_are_audited_once_while_they_last(tmp_path: Any) -> None:
    from llm_health.remediator.discovered import AUDIT_EVERY, EVENT, audit_refusals
    from llm_health.remediator.store import SqliteStore

    store = SqliteStore(tmp_path / "state.db")
    store.init()
    found = backends_from_targets([pod("a", namespace="a;reboot"), target("bad name")],
                                  SETTINGS, parse_selector(SETTINGS.selector))
    assert audit_refusals(store, found.refusals, 1000.0) == 2
    assert audit_refusals(store, found.refusals, 1001.0) == 0          # the next refresh: nothing new
    events = store.events(kind=EVENT)
    assert {e.backend for e in events} == {"a", ""}
    (restart,) = [e for e in events if e.backend == "a"]
    assert "a;reboot" in restart.reason and restart.detail["restart_only"] is True
    assert audit_refusals(store, found.refusals, 1000.0 + AUDIT_EVERY + 1) == 2   # still there a day later


def test_busy_marker_file_for_a_discovered_backend(tmp_path: Any) -> None:
    import argparse

    import yaml

    from llm_health.remediator.busy import open_marker

    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"remediator": {"busy_dir": "busy"},
                                   "discovery": {"prometheus_url": "http://127.0.0.1:9"}}))

    def args(backend: str) -> argparse.Namespace:
        return argparse.Namespace(remediator=None, config=str(cfg), backend=backend, ttl=60.0, token_file=None)

    marker = open_marker(args("vllm-0"), "me")          # not in the file, but may be discovered
    assert marker.path.parent == tmp_path / "busy" and marker.path.name.startswith("vllm-0@")
    for bad in ("../x", "a b", "a/b", ""):
        with pytest.raises(ConfigError, match="--backend"):
            open_marker(args(bad), "me")
    assert [p.name for p in (tmp_path / "busy").iterdir()] == [marker.path.name]


def test_the_first_answer_after_an_outage_longer_than_grace_removes_nothing() -> None:
    """Prometheus down for longer than the grace period (a long WAL replay), then its first answer is
    empty (service discovery has not run yet): the fleet must not be emptied by that one answer. The
    grace period counts only while Prometheus answers."""
    d, answers, mono = make(grace=60)
    answers.next = [target("a", "h:1"), target("b", "h:2")]
    d.refresh()
    answers.next = OSError("connection refused")
    for _ in range(30):                                       # 300 s of failed refreshes
        mono.advance(10)
        assert not d.refresh()
    answers.next = []                                         # back, nothing discovered yet
    mono.advance(10)
    assert d.refresh()
    assert names(d) == ["a", "b"]
    answers.next = [target("a", "h:1")]                       # b really gone: removed after grace
    mono.advance(60)
    d.refresh()
    assert names(d) == ["a", "b"]
    mono.advance(1)
    d.refresh()
    assert names(d) == ["a"]


def test_keep_failing_keeps_the_backend_and_the_refresher_survives() -> None:
    """keep() reads the state database; when it raises (database locked, I/O error) the backend stays
    and the refresher thread goes on refreshing."""
    import threading

    from llm_health.drill.procs import wait_until

    d, answers, mono = make(grace=10)
    answers.next = [target("a")]
    d.refresh()
    broken = [True]

    def keep(_name: str) -> bool:
        if broken[0]:
            raise RuntimeError("database is locked")
        return False

    d.keep = keep
    answers.next = []
    mono.advance(100)
    d.refresh()                                               # must not raise
    assert names(d) == ["a"]
    calls = [0]
    base = d._fetch

    def counting() -> list[Any]:
        calls[0] += 1
        return base()

    d._fetch = counting
    d.settings = DiscoverySettings(prometheus_url="http://p:9090", refresh=0.05, grace=10)
    stop = threading.Event()
    t = threading.Thread(target=d.run_forever, args=(stop,), daemon=True)
    t.start()
    try:
        assert wait_until(lambda: calls[0] >= 3, timeout=10)
        assert t.is_alive()
        broken[0] = False
        assert wait_until(lambda: names(d) == [], timeout=10)
    finally:
        stop.set()
        t.join(timeout=5)


def test_exporter_raises_the_open_file_limit_for_discovered_backends() -> None:
    """The exporter sized its open-file limit from the static backends only: with discovery (no static
    backend at all) a fleet of hundreds ran into EMFILE (every read an error, its own /metrics refused).
    Run in a child process: it lowers its own limit first."""
    import subprocess
    import sys

    script = r'''
import http.server, json, resource, sys, threading
n = 400
targets = [{"labels": {"job": "vllm", "backend": f"b{i}", "instance": f"127.0.0.1:{10000 + i}"},
            "scrapeUrl": f"http://127.0.0.1:{10000 + i}/metrics", "health": "up"} for i in range(n)]
body = json.dumps({"status": "success", "data": {"activeTargets": targets}}).encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
import argparse
from llm_health.exporter.cli import build_config, configure, watch_discovered
from llm_health.exporter.scheduler import ReadScheduler
p = argparse.ArgumentParser(); configure(p)
config = build_config(p.parse_args(["--discover-from", f"http://127.0.0.1:{srv.server_address[1]}",
                                    "--discover-selector", 'job="vllm"']))
fleet = ReadScheduler(config.backends, config.proxies, config.exporter, dynamic=True)
d = watch_discovered(config, fleet)
assert len(fleet.backends) == n, len(fleet.backends)
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
fleet.close(); srv.shutdown()
'''
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    soft, hard = (int(x) for x in out.stdout.split())
    assert soft >= min(hard, 3 * 400 + 256)
