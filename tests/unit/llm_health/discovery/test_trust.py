"""Service discovery as a trust boundary (issue 18): target labels are whatever relabelling made them,
and whoever may create a PodMonitor/ServiceMonitor writes the relabelling. These tests are the abuses
tried against the old code, each held to the rule that stops it:

* restart placeholders and the host come from `discoveredLabels` (unforgeable by relabelling), never
  from target labels: a rogue target labelled `pod=vllm-0` cannot get vllm-0 deleted;
* the backend's name must be the discovered label `name_from`: a target named like a real pod it is not
  gets no restart;
* a name two targets claim restarts neither (the already known one stays watched), and it is counted;
* link-local and userinfo URLs are refused unless allowed; the allow-lists for networks and ports hold;
* old configs whose placeholders or host read target labels are refused with a message saying what to write.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llm_health.config import ConfigError, DiscoverySettings, parse_config
from llm_health.discovery import (
    Discovery,
    RefusalKind,
    backends_from_targets,
    parse_selector,
    url_refusal,
)
from llm_health.discovery.collector import DiscoveryCollector
from llm_health.drill.procs import wait_until
from tests.support.discovery import K8S, SETTINGS, Answers, pod, rogue
from tests.support.fakes import FakeClock
from tests.support.paths import REPO


def found_from(*targets: dict[str, Any], settings: DiscoverySettings = SETTINGS, selector: str = "") -> Any:
    return backends_from_targets(list(targets), settings, parse_selector(selector or settings.selector))


# ---- what a restart acts on comes from discovered labels ------------------------------------------

def test_a_rogue_target_labelled_pod_vllm_0_never_gets_vllm_0_deleted() -> None:
    """The issue's attack: target `vllm-evil` with target labels pod=vllm-0, namespace=llm. The old code
    filled the argv from those labels: `kubectl delete pod -n llm vllm-0`."""
    found = found_from(pod("vllm-0", "10.0.0.5:8000"), rogue("vllm-evil", "vllm-0"))
    argv = {b.name: b.restart for b in found.backends}
    assert argv["vllm-0"] == ("kubectl", "delete", "pod", "-n", "llm", "vllm-0")
    assert argv["vllm-evil"] == ("kubectl", "delete", "pod", "-n", "evil", "vllm-evil")   # its own pod only
    assert "vllm-0" not in argv["vllm-evil"] and "llm" not in argv["vllm-evil"]


def test_a_target_named_like_a_pod_it_is_not_gets_no_restart() -> None:
    """A rogue target named vllm-0 (while the real one is not scraped, e.g. mid-restart): its discovered
    pod name is vllm-evil, so its name is not what a restart would act on."""
    found = found_from(rogue("vllm-0", "vllm-0"))
    (b,) = found.backends
    assert b.name == "vllm-0" and b.restart == ()               # watched, never restarted
    (r,) = found.refusals
    assert r.restart_only and r.kind == RefusalKind.NAME_MISMATCH and "vllm-evil" in r.reason


def test_without_name_from_there_is_no_restart_even_if_the_settings_were_built_by_hand() -> None:
    s = DiscoverySettings(prometheus_url="http://p:9090", restart=("kubectl", "delete", "pod", "{pod}"),
                          placeholders=(("pod", "__meta_kubernetes_pod_name"),))
    found = found_from(pod("vllm-0"), settings=s)
    assert found.backends[0].restart == () and found.refusals[0].kind == RefusalKind.NAME_MISMATCH


def test_a_placeholder_without_a_discovered_source_is_never_filled_from_a_target_label() -> None:
    s = DiscoverySettings(prometheus_url="http://p:9090", name_from="__meta_kubernetes_pod_name",
                          restart=("kubectl", "delete", "pod", "{pod}"))          # built by hand, no mapping
    found = found_from(pod("vllm-0"), settings=s)
    assert found.backends[0].restart == () and found.refusals[0].kind == RefusalKind.PLACEHOLDER


def test_the_host_comes_from_discovered_labels_so_a_forged_node_label_claims_no_mutex() -> None:
    """The per-host restart mutex keys on Backend.host. A rogue with target label node=gpu-node-1 (the
    real backend's host) would have held that host's mutex and deferred the real backend's restarts."""
    found = found_from(pod("vllm-0", "10.0.0.5:8000", node="gpu-node-1"),
                       rogue("vllm-evil", "x", node="gpu-node-1"))
    host = {b.name: b.host for b in found.backends}
    assert host == {"vllm-0": "gpu-node-1", "vllm-evil": "evil-node"}
    s = DiscoverySettings(prometheus_url="http://p:9090", host_from="")
    assert {b.host for b in found_from(pod("vllm-0", node="n1"), settings=s).backends} == {""}


def test_the_selector_can_match_discovered_labels_and_the_scrape_pool() -> None:
    """Target labels never start with `__`; a matcher on such a name reads discoveredLabels, which a
    rogue's relabelling cannot set. `__scrape_pool__` is the scrape config (with prometheus-operator:
    which monitor, in which namespace)."""
    both = (pod("vllm-0", pool="podMonitor/llm/vllm/0"), rogue("vllm-evil", "vllm-0", namespace="llm"))
    assert {b.name for b in found_from(*both).backends} == {"vllm-0", "vllm-evil"}     # job="vllm" only
    by_ns = found_from(*both, selector='job="vllm", __meta_kubernetes_namespace="llm"')
    assert [b.name for b in by_ns.backends] == ["vllm-0"] and by_ns.targets == 1
    by_pool = found_from(*both, selector='__scrape_pool__=~"podMonitor/llm/.*"')
    assert [b.name for b in by_pool.backends] == ["vllm-0"]
    forged = rogue("vllm-evil", "x")
    forged["discoveredLabels"]["__scrape_pool__"] = "podMonitor/llm/vllm/0"    # the answer's own: not used
    assert found_from(forged, selector='__scrape_pool__=~"podMonitor/llm/.*"').backends == ()


# ---- a name claimed twice --------------------------------------------------------------------------

def make(**settings: Any) -> tuple[Discovery, Answers, FakeClock]:
    answers, mono = Answers(), FakeClock(100.0)
    s = DiscoverySettings(**{"prometheus_url": "http://p:9090", "refresh": 10, "grace": 60, **settings,
                             "restart": SETTINGS.restart, "placeholders": SETTINGS.placeholders,
                             "name_from": SETTINGS.name_from})
    return Discovery(s, fetch=answers, monotonic=mono, wall=FakeClock(1_700_000_000.0)), answers, mono


def metric(d: Discovery, name: str) -> float:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DiscoveryCollector(d.status))
    for line in generate_latest(reg).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed")


def test_a_hijacked_name_restarts_neither_keeps_the_known_one_watched_and_is_counted() -> None:
    d, answers, mono = make()
    real = pod("vllm-0", "10.0.0.5:8000", node="n1")
    answers.next = [real]
    d.refresh()
    assert d.backends()[0].restart and metric(d, "llm_health_discovery_duplicate_names") == 0
    # a rogue claims the name; it sorts first by scrape URL (the old code kept the first)
    answers.next = [real, rogue("vllm-0", "vllm-0", "10.0.0.1:8000")]
    mono.advance(10)
    d.refresh()
    (b,) = d.backends()
    assert (b.name, b.url, b.restart) == ("vllm-0", "http://10.0.0.5:8000", ())   # watched where it was, no restart
    st = d.status()
    assert [x.name for x in st.duplicates] == ["vllm-0"] and len(st.duplicates[0].targets) == 2
    assert metric(d, "llm_health_discovery_duplicate_names") == 1
    for _ in range(20):                                        # far past grace: still watched while contested
        mono.advance(10)
        d.refresh()
    assert [(x.name, x.restart) for x in d.backends()] == [("vllm-0", ())]
    answers.next = [real]                                      # the impostor removed: restart back at once
    mono.advance(10)
    d.refresh()
    assert d.backends()[0].restart == ("kubectl", "delete", "pod", "-n", "llm", "vllm-0")
    assert metric(d, "llm_health_discovery_duplicate_names") == 0


def test_a_name_first_seen_contested_is_no_backend_and_a_stale_one_ages_out() -> None:
    d, answers, mono = make()
    answers.next = [pod("vllm-0", "10.0.0.5:8000"), rogue("vllm-0", "vllm-0", "10.0.0.1:8000")]
    d.refresh()
    assert d.backends() == ()                                  # which one is real cannot be told
    d2, answers2, mono2 = make()
    answers2.next = [pod("vllm-0", "10.0.0.5:8000")]
    d2.refresh()
    # the real pod moved (new address) just as a rogue appeared: the known URL is no claimant any more
    answers2.next = [pod("vllm-0", "10.0.0.6:8000"), rogue("vllm-0", "vllm-0", "10.0.0.1:8000")]
    mono2.advance(10)
    d2.refresh()
    assert [(b.url, b.restart) for b in d2.backends()] == [("http://10.0.0.5:8000", ())]   # restart gone at once
    mono2.advance(61)
    d2.refresh()
    assert d2.backends() == ()


# ---- URLs --------------------------------------------------------------------------------------------

PLAIN = DiscoverySettings(prometheus_url="http://p:9090")


@pytest.mark.parametrize("url, kind", [
    ("http://169.254.169.254", RefusalKind.LINK_LOCAL),
    ("http://169.254.0.1:8000", RefusalKind.LINK_LOCAL),
    ("http://[fe80::1]:8000", RefusalKind.LINK_LOCAL),
    ("http://[febf::1]:8000", RefusalKind.LINK_LOCAL),
    ("http://[::ffff:169.254.169.254]:80", RefusalKind.LINK_LOCAL),
    ("http://2852039166", RefusalKind.URL),                  # 169.254.169.254 as one number
    ("http://0xa9.0xfe.0xa9.0xfe", RefusalKind.URL),
    ("http://169.254.43518:80", RefusalKind.URL),
    ("http://user:pass@10.0.0.5:8000", RefusalKind.USERINFO),
    ("http://user@10.0.0.5:8000", RefusalKind.USERINFO),
    ("http://user:pw%4010.0.0.5:8000", RefusalKind.USERINFO),  # what Prometheus 2.42 shows for user:pw@host
    ("http://10.0.0.5:notaport", RefusalKind.URL),
    ("http://10.0.0.5%2f:80", RefusalKind.URL),
])
def test_link_local_userinfo_and_odd_addresses_are_refused(url: str, kind: RefusalKind) -> None:
    got = url_refusal(url, PLAIN)
    assert got is not None and got[0] == kind, got


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "https://vllm-0.vllm:8000", "http://[fd00::5]:8000",
                                 "http://127.0.0.1:8000", "http://169.255.0.1:8000", "http://[fec0::1]:1"])
def test_ordinary_addresses_pass(url: str) -> None:
    assert url_refusal(url, PLAIN) is None


def test_link_local_and_userinfo_are_accepted_when_allowed() -> None:
    s = DiscoverySettings(prometheus_url="http://p:9090", allow_link_local=True, allow_userinfo=True)
    for url in ("http://169.254.169.254", "http://[fe80::1]:8000", "http://u:p@10.0.0.5:8000"):
        assert url_refusal(url, s) is None, url
    assert url_refusal("http://u:p@169.254.169.254", DiscoverySettings(allow_link_local=True))[0] == \
        RefusalKind.USERINFO


def test_allow_networks_and_ports_are_enforced() -> None:
    s = DiscoverySettings(prometheus_url="http://p:9090", allow_networks=("10.0.0.0/24", "fd00::/8"),
                          allow_ports=(8000, 443))
    assert url_refusal("http://10.0.0.5:8000", s) is None
    assert url_refusal("http://[fd00::5]:8000", s) is None
    assert url_refusal("https://10.0.0.5", s) is None                     # the default https port
    assert url_refusal("http://10.0.1.5:8000", s)[0] == RefusalKind.NETWORK
    assert url_refusal("http://[::ffff:10.0.1.5]:8000", s)[0] == RefusalKind.NETWORK
    assert url_refusal("http://vllm-0.vllm:8000", s)[0] == RefusalKind.NETWORK   # a name cannot be checked
    assert url_refusal("http://10.0.0.5:9100", s)[0] == RefusalKind.PORT
    assert url_refusal("http://10.0.0.5", s)[0] == RefusalKind.PORT               # the default http port
    link = DiscoverySettings(allow_networks=("169.254.0.0/16",))
    assert url_refusal("http://169.254.1.1:80", link)[0] == RefusalKind.LINK_LOCAL   # still needs allow_link_local


def test_refused_urls_are_refusals_and_the_target_gets_neither_probes_nor_the_key() -> None:
    bad = pod("vllm-1", "169.254.169.254:80")
    found = found_from(pod("vllm-0"), bad)
    assert [b.name for b in found.backends] == ["vllm-0"]
    (r,) = found.refusals
    assert (r.backend, r.kind, r.restart_only) == ("vllm-1", RefusalKind.LINK_LOCAL, False)
    no_scrape_url = pod("vllm-2", "user:pw@10.0.0.7:8000")
    del no_scrape_url["scrapeUrl"]                                        # the discoveredLabels path
    assert found_from(no_scrape_url).refusals[0].kind == RefusalKind.USERINFO


# ---- the refresher: asked-for refreshes are rate-limited and never block the asker ----------------

class Gate:
    """A Prometheus whose answers wait until released; counts the queries."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self) -> list[Any]:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(30), "never released"
        return [pod("vllm-0")]


def test_requests_during_a_slow_refresh_cost_one_more_query_and_never_wait() -> None:
    gate = Gate()
    s = DiscoverySettings(prometheus_url="http://p:9090", refresh=3600, extra_refresh_every=0.05)
    d = Discovery(s, fetch=gate)
    d.start()
    try:
        assert gate.entered.wait(10)                 # the first refresh hangs in Prometheus
        mark = d.mark()
        for _ in range(1000):
            d.request_refresh()                      # returns at once although Prometheus hangs
        assert not d.answered_since(mark)
        gate.release.set()
        assert wait_until(lambda: d.answered_since(mark), timeout=10)
        assert gate.calls == 2                       # 1000 requests: one extra query
        assert d.status().extra_refreshes == 1
    finally:
        d.stop()


def test_a_storm_of_requests_gets_at_most_one_extra_refresh_per_interval() -> None:
    calls: list[float] = []

    def fetch() -> list[Any]:
        calls.append(time.monotonic())
        return []

    gap = 0.25
    s = DiscoverySettings(prometheus_url="http://p:9090", refresh=3600, extra_refresh_every=gap)
    d = Discovery(s, fetch=fetch)
    d.start()
    try:
        assert wait_until(lambda: len(calls) >= 1, timeout=10)
        until = time.monotonic() + 1.5
        while time.monotonic() < until:              # requests for 1.5 s as fast as they come
            d.request_refresh()
        assert wait_until(lambda: len(calls) >= 2, timeout=10)
    finally:
        d.stop()
    spacing = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert all(x >= gap * 0.8 for x in spacing), spacing           # never two within the interval
    assert len(calls) <= 1 + 1.5 / gap + 2, len(calls)


# ---- config: old forms refused with what to write ------------------------------------------------

def test_old_host_label_is_refused_saying_what_to_write() -> None:
    with pytest.raises(ConfigError, match="discovery.host_label.*host_from: __meta_kubernetes_pod_node_name"):
        parse_config({"discovery": {"prometheus_url": "http://p:9090", "host_label": "node"}})


def test_old_restart_templates_are_refused_saying_what_to_write() -> None:
    old = {"prometheus_url": "http://p:9090", "restart": ["kubectl", "delete", "pod", "-n", "{namespace}", "{pod}"]}
    with pytest.raises(ConfigError, match=r"placeholders: \{namespace: __meta_kubernetes_namespace, "
                                          r"pod: __meta_kubernetes_pod_name\}"):
        parse_config({"discovery": old})
    with pytest.raises(ConfigError, match="discovery.name_from: required with discovery.restart"):
        parse_config({"discovery": {**old, "placeholders": K8S}})
    with pytest.raises(ConfigError, match="discovery.name_from"):
        parse_config({"discovery": {"prometheus_url": "http://p:9090", "restart": ["restart-vllm", "{backend}"]}})
    ok = parse_config({"discovery": {**old, "placeholders": K8S, "name_from": "__meta_kubernetes_pod_name"}})
    assert ok.discovery.restart == tuple(old["restart"])


def test_a_hand_built_config_is_checked_too() -> None:
    from llm_health.config import check_discovery
    with pytest.raises(ConfigError, match="discovery.restart"):
        check_discovery(DiscoverySettings(prometheus_url="http://p:9090", name_from="x", restart=("a", "{pod}")))


def test_the_exporter_flags_keep_the_file_settings(tmp_path: Any) -> None:
    import argparse

    import yaml

    from llm_health.exporter.cli import build_config, configure

    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"discovery": {"prometheus_url": "http://127.0.0.1:9", "allow_ports": [8000],
                                                 "placeholders": K8S, "name_from": "__meta_kubernetes_pod_name",
                                                 "restart": ["kubectl", "{pod}"]}}))
    parser = argparse.ArgumentParser()
    configure(parser)
    c = build_config(parser.parse_args(["--config", str(cfg), "--discover-selector", 'job="sglang"']))
    assert c.discovery.selector == 'job="sglang"' and c.discovery.allow_ports == (8000,)
    assert c.discovery.placeholder_labels == K8S


# ---- the documented Kubernetes setup --------------------------------------------------------------

def kubernetes_discovery() -> dict[str, Any]:
    """The commented-out `discovery:` block of deploy/kubernetes/llm-health.yml, uncommented."""

    import yaml

    text = (REPO / "deploy" / "kubernetes" / "llm-health.yml").read_text()
    lines = text.splitlines()
    start = lines.index("# discovery:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:])
    return yaml.safe_load("\n".join(block))["discovery"]


def test_the_kubernetes_example_selects_our_monitor_and_restarts_only_what_it_discovered() -> None:
    section = kubernetes_discovery()
    settings = parse_config({"discovery": section}).discovery
    ours = pod("vllm-0", "10.0.0.5:8000", namespace="llm-serving", node="n1", pool="podMonitor/llm-serving/vllm/0")
    # another namespace's monitor, forging every target label ours carries, and even pointing at our pod
    other = rogue("vllm-1", "vllm-1", "10.0.0.6:8000", namespace="llm-serving")
    cross = pod("vllm-2", "10.0.0.7:8000", namespace="llm-serving", pool="podMonitor/evil/copy/0")
    found = found_from(ours, other, cross, settings=settings)
    assert [(b.name, b.host, b.restart) for b in found.backends] == [
        ("vllm-0", "n1", ("kubectl", "delete", "pod", "--namespace", "llm-serving", "vllm-0", "--wait=false"))]
    assert found.targets == 1                                     # the other two are not even watched
    off_port = pod("vllm-3", "10.0.0.8:9100", namespace="llm-serving", pool="podMonitor/llm-serving/vllm/0")
    assert found_from(off_port, settings=settings).refusals[0].kind == RefusalKind.PORT
