"""On Kubernetes the two restart alerts reach the remediator through the base's AlertmanagerConfig.

prometheus-operator adds every AlertmanagerConfig's route as a first-level route with a matcher
namespace="<the object's namespace>" (alertmanagerConfigMatcherStrategy OnNamespace, the default). So:
- promtool: the alerts of the Kubernetes render (deploy/kubernetes/prometheusrule.yaml) carry the vLLM
  pods' `namespace` (the PodMonitor's targets have it); the plain render's drop it in `by (backend)`;
- amtool: the route as the operator writes it into Alertmanager's configuration (namespace matcher,
  receiver `<namespace>/<object>/<receiver>`) sends the Kubernetes render's alerts to the remediator and
  the plain render's to nobody;
- the object is the production example's remediator route (deploy/alertmanager/alertmanager.yml), with
  the token from the Secret the remediator reads and the URL of the remediator's Service.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from llm_health.render import prometheusrule
from tests.support.kube import BASE, base_objects, by_kind, kustomization, named
from tests.support.paths import REPO
from tests.support.promtool import (
    AMTOOL,
    EXPORTER,
    PROMTOOL,
    RULE_FILES,
    N,
    Scenario,
    alert_rules,
    promtool_document,
    run_promtool_tests,
    series,
    vllm_backend,
)

NAMESPACE = kustomization()["namespace"]
PRODUCTION = yaml.safe_load((REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make debs)")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (make debs)")


def routing() -> dict[str, Any]:
    (obj,) = by_kind(base_objects(), "AlertmanagerConfig")
    return obj


def webhook(obj: dict[str, Any]) -> dict[str, Any]:
    (receiver,) = obj["spec"]["receivers"]
    assert receiver["name"] == obj["spec"]["route"]["receiver"]
    (hook,) = receiver["webhookConfigs"]
    return hook


def matcher_text(m: dict[str, Any]) -> str:
    op = m.get("matchType") or ("=~" if m.get("regex") else "=")
    return f'{m["name"]}{op}"{m["value"]}"'


def production_route() -> dict[str, Any]:
    (route,) = [r for r in PRODUCTION["route"]["routes"] if r["receiver"] == "llm-health-remediator"
                and r["matchers"] == ['remediation="restart"']]
    return route


def kubernetes_rules(tmp_path: Path) -> list[Path]:
    return [prometheusrule.groups_file((BASE / prometheusrule.FILE_NAME).read_text(), tmp_path)]


# -- the object ----------------------------------------------------------------------------------------

def test_the_route_is_the_production_remediator_route() -> None:
    route, prod = routing()["spec"]["route"], production_route()
    assert [matcher_text(m) for m in route["matchers"]] == prod["matchers"] == ['remediation="restart"']
    for ours, theirs in (("groupWait", "group_wait"), ("groupInterval", "group_interval"),
                         ("repeatInterval", "repeat_interval")):
        assert route[ours] == prod[theirs], ours
    assert set(prod["group_by"]) <= set(route["groupBy"])  # finer groups never merge two backends
    (prod_receiver,) = [r for r in PRODUCTION["receivers"] if r["name"] == "llm-health-remediator"]
    (prod_hook,) = prod_receiver["webhook_configs"]
    hook = webhook(routing())
    assert hook["sendResolved"] is prod_hook["send_resolved"] is True  # resolved closes the incident
    assert hook["maxAlerts"] == prod_hook["max_alerts"] == 0
    assert hook["httpConfig"]["authorization"]["type"] == "Bearer"


def test_the_webhook_is_the_remediators_service_with_its_token() -> None:
    objects = base_objects()
    hook = webhook(routing())
    url = urlsplit(hook["url"])
    service = named(objects, "Service", "llm-health-remediator")
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "http"]
    # Alertmanager runs in another namespace: the Service's name with the base's namespace
    assert (url.scheme, url.hostname, url.port, url.path) == (
        "http", f"{service['metadata']['name']}.{NAMESPACE}.svc", port, "/webhook")
    (generator,) = kustomization()["secretGenerator"]
    assert generator["files"] == ["token=remediator.token"]
    assert hook["httpConfig"]["authorization"]["credentials"] == {"name": generator["name"], "key": "token"}
    remediator = named(objects, "Deployment", "llm-health-remediator")["spec"]["template"]["spec"]
    assert {"name": "token", "secret": {"secretName": generator["name"], "defaultMode": 0o400}} in remediator["volumes"]


# -- the alerts carry namespace (promtool) -------------------------------------------------------------

def stalled_and_down() -> Scenario:
    """vllm-0 stalls (work in flight, counters flat), vllm-1 stops answering; series as the PodMonitor
    scrapes them, with the pods' namespace."""
    groups = {"namespace": NAMESPACE}
    s = Scenario(f"vllm-0 stalled, vllm-1 down, in namespace {NAMESPACE}")
    s.add(vllm_backend("vllm-0", running=f"3x{N}", waiting=f"2x{N}", progress=f"0+100x20 2000x{N}", up=f"1x{N}",
                       groups=groups))
    s.add(vllm_backend("vllm-1", running=f"0x{N}", waiting=f"0x{N}", progress=f"10x{N}", up=f"1x8 0x{N}",
                       groups=groups))
    s.add(series("up", {**EXPORTER, **groups}, f"1x{N}"))
    return s


@needs_promtool
def test_the_kubernetes_renders_restart_alerts_carry_namespace(tmp_path: Path) -> None:
    s = stalled_and_down()
    s.expect("5m", "LLMBackendDown", {"backend": "vllm-1", "namespace": NAMESPACE})
    s.expect("8m30s", "LLMBackendStalled", {"backend": "vllm-0", "namespace": NAMESPACE})
    files = kubernetes_rules(tmp_path)
    result = run_promtool_tests(promtool_document([s], files), tmp_path / "k8s_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_plain_render_drops_namespace(tmp_path: Path) -> None:
    """Why the Kubernetes render keeps it: by (backend) alone, the same alerts have no namespace."""
    s = stalled_and_down()
    s.expect("5m", "LLMBackendDown", {"backend": "vllm-1"})
    s.expect("8m30s", "LLMBackendStalled", {"backend": "vllm-0"})
    result = run_promtool_tests(promtool_document([s], RULE_FILES), tmp_path / "plain_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


# -- the route as the operator writes it (amtool) ------------------------------------------------------

def operator_config(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The Alertmanager configuration prometheus-operator generates from `obj` in `namespace`, reduced to
    what routes: a null root receiver, the object's route first-level with the OnNamespace matcher."""
    route, hook = obj["spec"]["route"], webhook(obj)
    prefix = f"{namespace}/{obj['metadata']['name']}"
    return {
        "route": {"receiver": "null", "routes": [{
            "receiver": f"{prefix}/{route['receiver']}",
            "matchers": [f'namespace="{namespace}"', *map(matcher_text, route["matchers"])],
            "group_by": route["groupBy"], "group_wait": route["groupWait"],
            "group_interval": route["groupInterval"], "repeat_interval": route["repeatInterval"],
            "continue": True,
        }]},
        "receivers": [{"name": "null"}, {"name": f"{prefix}/{route['receiver']}", "webhook_configs": [{
            "url": hook["url"], "send_resolved": hook["sendResolved"], "max_alerts": hook["maxAlerts"],
            "http_config": {"authorization": {"type": "Bearer", "credentials": "from-the-secret"}},
        }]}],
    }


def routed_to(config: Path, labels: dict[str, str]) -> str:
    result = subprocess.run([AMTOOL, "config", "routes", "test", f"--config.file={config}",
                             *(f"{k}={v}" for k, v in sorted(labels.items()))],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


@needs_amtool
@pytest.mark.parametrize("alert", ["LLMBackendStalled", "LLMBackendDown"])
def test_only_alerts_with_the_namespace_reach_the_remediator(alert: str, tmp_path: Path) -> None:
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(operator_config(routing(), NAMESPACE), sort_keys=False))
    check = subprocess.run([AMTOOL, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    k8s = {"alertname": alert, **alert_rules(kubernetes_rules(tmp_path))[alert]["labels"],
           "backend": "vllm-0", "namespace": NAMESPACE}   # as promtool above shows them
    assert routed_to(config, k8s) == f"{NAMESPACE}/llm-health-remediator/llm-health-remediator"
    plain = {k: v for k, v in k8s.items() if k != "namespace"}
    assert routed_to(config, plain) == "null"               # the plain render's: nowhere
    assert routed_to(config, {**k8s, "namespace": "other"}) == "null"
    info = {"alertname": "LLMBackendRestarted", "backend": "vllm-0", "namespace": NAMESPACE, "severity": "info"}
    assert routed_to(config, info) == "null"                 # not a restart alert
