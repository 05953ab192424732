"""deploy/kubernetes/ validated offline: Kubernetes API schemas, the operator's CRDs by structure, promtool.

Built-in kinds are validated strictly (unknown fields are errors) against the schemas that the
`kubernetes-validate` package ships. PodMonitor/ServiceMonitor/PrometheusRule have no schema there:
their fields are checked against the prometheus-operator v1 fields used here, and what they point at
(pod/service labels, port names, the job labels the rules select) is checked against the objects they
point at; the PrometheusRule's groups pass `promtool check rules`. `kubectl kustomize` (when installed)
builds the base as a user would. Generated files must be a fresh render.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml

from llm_health.config import load_config
from llm_health.remediator.sidecar import cli as sidecar_cli
from llm_health.render import dashboards, prometheusrule
from llm_health.render.rules import RuleSettings, render
from tests.support import crds
from tests.support.kube import BASE, DASHBOARDS, EXAMPLES, base_objects, by_kind, kustomization, load, named
from tests.support.paths import REPO

ROOT = REPO
K8S_VERSION = "1.30"
KUBECTL = shutil.which("kubectl")
PROMTOOL = shutil.which("promtool")
CRD_KINDS = crds.KINDS

# prometheus-operator monitoring.coreos.com/v1 fields used (a subset of the CRDs' schemas)
RELABEL_KEYS = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
ENDPOINT_KEYS = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "relabelings",
                 "metricRelabelings", "honorLabels", "honorTimestamps", "params", "bearerTokenSecret",
                 "authorization", "tlsConfig", "followRedirects", "enableHttp2"}
MONITOR_SPEC_KEYS = {"selector", "namespaceSelector", "jobLabel", "podTargetLabels", "targetLabels",
                     "sampleLimit", "attachMetadata", "podMetricsEndpoints", "endpoints"}
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"


def example_objects() -> list[dict[str, Any]]:
    return [obj for path in sorted(EXAMPLES.glob("*.yaml")) for obj in load(path)]


def validate_builtin(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def check_relabelings(items: list[dict[str, Any]], where: str) -> None:
    for r in items:
        assert set(r) <= RELABEL_KEYS, f"{where}: unknown relabeling fields {set(r) - RELABEL_KEYS}"
        assert "targetLabel" in r or r.get("action") in {"keep", "drop", "labelmap", "labeldrop", "labelkeep"}


def check_monitor(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Structure of a PodMonitor/ServiceMonitor; returns its endpoints."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    assert prometheusrule.check_name(obj["metadata"]["name"])
    spec = obj["spec"]
    assert set(spec) <= MONITOR_SPEC_KEYS, set(spec) - MONITOR_SPEC_KEYS
    assert set(spec["selector"]) <= {"matchLabels", "matchExpressions"} and spec["selector"]
    key = "podMetricsEndpoints" if obj["kind"] == "PodMonitor" else "endpoints"
    assert set(spec) & {"podMetricsEndpoints", "endpoints"} == {key}
    endpoints = spec[key]
    assert endpoints
    for ep in endpoints:
        assert set(ep) <= ENDPOINT_KEYS, set(ep) - ENDPOINT_KEYS
        assert isinstance(ep["port"], str) and ep["path"].startswith("/")
        for field in ("interval", "scrapeTimeout"):
            if field in ep:
                assert re.match(DURATION, ep[field]), ep[field]
        check_relabelings(ep.get("relabelings", []), obj["metadata"]["name"])
    return endpoints


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert not selector.get("matchExpressions")
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def job_of(endpoint: dict[str, Any]) -> str | None:
    jobs = [r["replacement"] for r in endpoint.get("relabelings", []) if r.get("targetLabel") == "job"]
    return jobs[-1] if jobs else None


def pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(o["metadata"]["name"], o["spec"]["template"]) for o in objects
            if o["kind"] in {"Deployment", "StatefulSet"}]


# -- schemas -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("obj", base_objects() + example_objects(),
                         ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_manifest_validates(obj: dict[str, Any]) -> None:
    if obj["kind"] in CRD_KINDS:
        crds.validate(obj)   # the operator's CRD schema, no unknown field
        if obj["kind"] == "PrometheusRule":
            assert set(obj["spec"]) == {"groups"}
        elif obj["kind"] in {"PodMonitor", "ServiceMonitor"}:
            check_monitor(obj)
        return
    validate_builtin(obj)


def test_the_base_has_each_kind_it_should() -> None:
    kinds = {o["kind"] for o in base_objects()}
    assert {"PodMonitor", "ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"} <= kinds
    assert "ConfigMap" not in kinds  # the dashboards are apart, for Grafana's namespace (dashboards/)


def test_schema_validation_can_fail() -> None:
    deployment = copy.deepcopy(named(base_objects(), "Deployment", "llm-health-remediator"))
    deployment["spec"]["replicaz"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_builtin(deployment)
    monitor = copy.deepcopy(by_kind(base_objects(), "PodMonitor")[0])
    monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["target_label"] = "x"
    with pytest.raises(AssertionError):
        check_monitor(monitor)
    with pytest.raises(crds.SchemaError, match="target_label"):
        crds.validate(monitor)


@pytest.mark.parametrize(("path", "value", "error"), [
    (("spec", "receivers", 0, "webhookConfigs", 0, "sendResolve"), True, "sendResolve"),   # misspelt: pruned
    (("spec", "route", "matchers", 0, "matchType"), "==", "matchType"),                   # not an operator
    (("spec", "receivers", 0, "webhookConfigs", 0, "maxAlerts"), -1, "maxAlerts"),        # minimum 0
    (("spec", "route", "routes"), [{"receiver": "x", "groupWaitt": "1s"}], "groupWaitt"),  # a nested route
])
def test_alertmanagerconfig_schema_validation_can_fail(path: tuple[Any, ...], value: Any, error: str) -> None:
    obj = copy.deepcopy(by_kind(base_objects(), "AlertmanagerConfig")[0])
    crds.validate(obj)
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(crds.SchemaError, match=error):
        crds.validate(obj)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
def test_kustomize_builds_the_base(tmp_path: Path) -> None:
    base = tmp_path / "base"
    shutil.copytree(BASE, base)
    missing = subprocess.run([KUBECTL, "kustomize", str(base)], capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "remediator.token" in missing.stderr  # no token, no build
    (base / "remediator.token").write_text("0123456789abcdef\n")
    built = subprocess.run([KUBECTL, "kustomize", str(base)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    objects = [o for o in yaml.safe_load_all(built.stdout) if o]
    namespace = kustomization()["namespace"]
    for obj in objects:
        assert obj["metadata"]["namespace"] == namespace, obj["metadata"]["name"]
        if obj["kind"] not in CRD_KINDS:
            validate_builtin(obj)
    (binding,) = by_kind(objects, "RoleBinding")
    assert binding["subjects"][0]["namespace"] == namespace
    # generated names (hash suffix) are wired into the pods
    (secret,) = by_kind(objects, "Secret")
    remediator = named(objects, "Deployment", "llm-health-remediator")
    volumes = {v["name"]: v for v in remediator["spec"]["template"]["spec"]["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == secret["metadata"]["name"]
    config_maps = {o["metadata"]["name"] for o in by_kind(objects, "ConfigMap")}
    assert volumes["config"]["configMap"]["name"] in config_maps
    # ... and into the AlertmanagerConfig's bearer token (kustomizeconfig.yaml's nameReference)
    (routing,) = by_kind(objects, "AlertmanagerConfig")
    crds.validate(routing)
    credentials = routing["spec"]["receivers"][0]["webhookConfigs"][0]["httpConfig"]["authorization"]["credentials"]
    assert credentials == {"name": secret["metadata"]["name"], "key": "token"}
    assert secret["metadata"]["name"].startswith("llm-health-remediator-token-")  # the hashed name


# -- what the objects mean -----------------------------------------------------------------------------

def test_rbac_grants_only_pod_delete_in_the_namespace() -> None:
    objects = base_objects()
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")
    (role,) = by_kind(objects, "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    (binding,) = by_kind(objects, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-health-remediator"}]
    exporter = named(objects, "Deployment", "llm-health-exporter")["spec"]["template"]["spec"]
    assert exporter["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", ["llm-health-exporter", "llm-health-remediator"])
def test_pods_run_as_non_root_without_privileges(name: str) -> None:
    spec = named(base_objects(), "Deployment", name)["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for container in spec["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]


def test_one_remediator_with_state_token_and_config_wired(tmp_path: Path) -> None:
    objects = base_objects()
    deployment = named(objects, "Deployment", "llm-health-remediator")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == named(
        objects, "PersistentVolumeClaim", "llm-health-remediator-state")["metadata"]["name"]
    generators = kustomization()
    assert volumes["token"]["secret"]["secretName"] == generators["secretGenerator"][0]["name"]
    assert volumes["config"]["configMap"]["name"] == generators["configMapGenerator"][0]["name"]
    config = load_config(str(BASE / "llm-health.yml"))
    assert config.remediator.state.startswith(mounts["state"] + "/")
    assert Path(config.remediator.token_file).parent == Path(mounts["token"])
    assert Path(config.remediator.token_file).name == "token"  # the key of the generated Secret
    port = int(config.remediator.listen.rsplit(":", 1)[1])
    assert container["ports"] == [{"name": "http", "containerPort": port}]
    service = named(objects, "Service", "llm-health-remediator")
    assert selects({"matchLabels": service["spec"]["selector"]}, deployment["spec"]["template"]["metadata"]["labels"])


def test_config_restarts_by_deleting_the_backends_own_pod() -> None:
    config = load_config(str(BASE / "llm-health.yml"))
    assert config.backends
    for backend in config.backends:
        assert list(backend.restart) == ["kubectl", "delete", "pod", backend.name, "--wait=false"], backend
        assert backend.url.startswith(f"http://{backend.name}.vllm:")


def test_podmonitor_scrapes_each_vllm_pod_with_backend_from_the_pod_name() -> None:
    (monitor,) = by_kind(base_objects(), "PodMonitor")
    (endpoint,) = check_monitor(monitor)
    assert {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "backend"} in endpoint["relabelings"]
    assert f'job="{job_of(endpoint)}"' == RuleSettings().vllm_selector
    # it selects every example's vLLM pods, on a port they name
    examples = pods(example_objects())
    assert len(examples) == 2    # vllm-statefulset.yaml, and with the readiness sidecar
    for _, template in examples:
        assert selects(monitor["spec"]["selector"], template["metadata"]["labels"])
        assert endpoint["port"] in {p["name"] for p in vllm_container(template).get("ports", [])}


def test_servicemonitors_watch_our_two_services_with_the_rules_job_labels() -> None:
    objects = base_objects()
    monitors = {m["metadata"]["name"]: m for m in by_kind(objects, "ServiceMonitor")}
    assert set(monitors) == {"llm-health-exporter", "llm-health-remediator"}
    for name, monitor in monitors.items():
        (endpoint,) = check_monitor(monitor)
        service = named(objects, "Service", name)
        assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert f'job="{job_of(monitors["llm-health-exporter"]["spec"]["endpoints"][0])}"' == \
        RuleSettings().exporter_selector


def vllm_container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    return container


def test_example_vllm_has_no_liveness_probe() -> None:
    for name, template in pods(example_objects()):
        container = vllm_container(template)
        assert "livenessProbe" not in container, f"{name}: the kubelet would be a second restart authority"
        if "readinessProbe" in container:
            assert container["readinessProbe"]["timeoutSeconds"] >= 40  # a busy server's /health is slow


def sidecar_pod() -> dict[str, Any]:
    (template,) = [t for _, t in pods(load(EXAMPLES / "vllm-statefulset-readiness.yaml"))]
    return template


def test_example_readiness_sidecar_alone_decides_readiness() -> None:
    spec = sidecar_pod()["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert set(containers) == {"vllm", "readiness"}
    vllm, sidecar = containers["vllm"], containers["readiness"]
    # the Pod is Ready only when every container is: vLLM's own probe would overrule the lifecycle
    assert "readinessProbe" not in vllm and "livenessProbe" not in vllm and "startupProbe" in vllm
    probe = sidecar["readinessProbe"]
    assert probe["httpGet"] == {"path": "/ready", "port": "readiness"} and probe["timeoutSeconds"] <= 2
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "readiness"}
    assert sidecar["image"] == named(base_objects(), "Deployment", "llm-health-remediator")["spec"]["template"][
        "spec"]["containers"][0]["image"]   # our one image, which the overlay's images: pins
    sc = sidecar["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert sidecar["env"] == [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]


def test_example_readiness_sidecar_args_are_ours_and_point_at_the_right_places(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_health.cli import build_parser

    spec = sidecar_pod()["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    sidecar, vllm = containers["readiness"], containers["vllm"]
    monkeypatch.setenv("POD_NAME", "vllm-0")       # what the downward API gives the first pod
    args = build_parser(only="readiness").parse_args(sidecar["args"])
    settings = sidecar_cli.settings_of(args)                   # the flags the sidecar checks at start
    assert settings.backend == "vllm-0"
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert sidecar_cli.parse_listen(args.listen)[1] == ports["readiness"]
    assert urlparse(settings.engine).hostname == "127.0.0.1"       # the engine in this pod
    assert urlparse(settings.engine).port == vllm["ports"][0]["containerPort"]
    remediator = urlparse(settings.remediator)
    service = named(base_objects(), "Service", "llm-health-remediator")
    assert remediator.hostname == service["metadata"]["name"]
    assert remediator.port == service["spec"]["ports"][0]["port"]
    # a drain reaches the endpoints within a poll and a probe; the fallback waits out short outages
    assert settings.interval + sidecar["readinessProbe"]["periodSeconds"] <= 5
    assert settings.fallback_after >= 10 * settings.interval


# -- generated files -----------------------------------------------------------------------------------

def test_prometheusrule_is_a_fresh_render(tmp_path: Path) -> None:
    from llm_health.cli import main

    assert main(["rules", "render", "--format", "prometheusrule", "--out", str(tmp_path)]) == 0
    assert (BASE / prometheusrule.FILE_NAME).read_text() == (tmp_path / prometheusrule.FILE_NAME).read_text(), (
        "stale: llm-health rules render --format prometheusrule --out deploy/kubernetes")
    # the Kubernetes render keeps namespace (the plain one does not), so the alerts carry it
    k8s = RuleSettings(group_labels=("namespace",))
    assert (tmp_path / prometheusrule.FILE_NAME).read_text() == prometheusrule.build(render(k8s))
    assert prometheusrule.build(render(k8s)) != prometheusrule.build(render())


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_prometheusrule_groups_pass_promtool(tmp_path: Path) -> None:
    path = prometheusrule.groups_file((BASE / prometheusrule.FILE_NAME).read_text(), tmp_path)
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {r["alert"] for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert "LLMBackendStalled" in alerts and "LLMBackendDown" in alerts


def test_prometheusrule_cli_sets_name_namespace_and_labels(tmp_path: Path) -> None:
    from llm_health.cli import main

    assert main(["rules", "render", "--format", "prometheusrule", "--out", str(tmp_path), "--k8s-name", "llm",
                 "--k8s-namespace", "monitoring", "--k8s-label", "release=kube-prometheus-stack"]) == 0
    (obj,) = load(tmp_path / prometheusrule.FILE_NAME)
    assert obj["metadata"]["name"] == "llm" and obj["metadata"]["namespace"] == "monitoring"
    assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert [g["name"] for g in obj["spec"]["groups"]] == [
        "llm-health.records", "llm-health.restart", "llm-health.alerts", "llm-health.self"]


@pytest.mark.parametrize("args", [["--k8s-name", "Bad_Name"], ["--k8s-namespace", "a.b"],
                                  ["--k8s-label", "release"], ["--k8s-label", "x=has space"]])
def test_prometheusrule_bad_metadata_is_refused_and_writes_nothing(args: list[str], tmp_path: Path) -> None:
    from llm_health.cli import main

    assert main(["rules", "render", "--format", "prometheusrule", "--out", str(tmp_path / "out"), *args]) == 2
    assert not (tmp_path / "out").exists()


def test_dashboard_configmaps_are_a_fresh_render_labelled_for_the_sidecar(tmp_path: Path) -> None:
    from llm_health.cli import main

    assert main(["dashboards", "render", "--format", "configmap", "--out", str(tmp_path)]) == 0
    path = DASHBOARDS / dashboards.CONFIGMAP_FILE
    assert path.read_text() == (tmp_path / dashboards.CONFIGMAP_FILE).read_text(), (
        "stale: llm-health dashboards render --format configmap --out deploy/kubernetes/dashboards")
    maps = load(path)
    assert {name for m in maps for name in m["data"]} == {p.name for p in (ROOT / "dashboards").glob("*.json")}
    for config_map in maps:
        validate_builtin(config_map)
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        # the sidecar's folder annotation (its default name, and the one the grafana chart is usually given)
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "llm-health",
                                                         "k8s-sidecar-target-directory": "llm-health"}
        # rendered as the rules: a namespace variable and `namespace` in every aggregation
        (text,) = config_map["data"].values()
        variables = [v["name"] for v in json.loads(text)["templating"]["list"]]
        assert variables[:2] == ["datasource", "namespace"], variables
    assert kustomization(DASHBOARDS)["resources"] == [dashboards.CONFIGMAP_FILE]


def test_dashboard_folder_is_an_option_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    from llm_health.cli import main

    assert main(["dashboards", "render", "--format", "configmap", "--out", str(tmp_path), "--k8s-folder", "LLM ops"]) == 0
    assert {m["metadata"]["annotations"]["grafana_folder"] for m in load(tmp_path / dashboards.CONFIGMAP_FILE)} == {
        "LLM ops"}
    for bad in ("a/b", "../up", "", "x" * 64):
        assert main(["dashboards", "render", "--format", "configmap", "--out", str(tmp_path / "bad"),
                     "--k8s-folder", bad]) == 2
    assert not (tmp_path / "bad").exists()


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
def test_dashboards_kustomization_puts_them_in_grafanas_namespace() -> None:
    built = subprocess.run([KUBECTL, "kustomize", str(DASHBOARDS)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    objects = [o for o in yaml.safe_load_all(built.stdout) if o]
    assert objects and {o["kind"] for o in objects} == {"ConfigMap"}
    assert {o["metadata"]["namespace"] for o in objects} == {kustomization(DASHBOARDS)["namespace"]} == {"monitoring"}


def test_docs_explain_the_restart_authority_and_the_commands() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    for needle in ("livenessProbe", "second restart authority", "kubectl delete pod", "remediator.token",
                   "--runbook-base-url", "--format prometheusrule",
                   # routing: who matches on namespace, what selects the object
                   "OnNamespace", "alertmanagerConfigSelector", "alertmanagerConfigNamespaceSelector",
                   "prometheus-operator's matching, not\n   Prometheus'",
                   # dashboards: which namespace and why, and the folder
                   "searchNamespace", "foldersFromFilesStructure", "kubectl apply -k deploy/kubernetes/dashboards",
                   # traffic follows the lifecycle: the sidecar, its probe, its fallback and its flags
                   "## Traffic follows the lifecycle", "/api/backends/<name>/readiness",
                   "examples/vllm-statefulset-readiness.yaml", "--fallback-after", "POD_NAME", "no readinessProbe",
                   "warm-up gate"):
        assert needle in text, needle
    assert "only if your Prometheus keeps it" not in text  # it was prometheus-operator's matcher, not Prometheus
    # every flag of `llm-health readiness` is in its table, and nothing else
    parser = argparse.ArgumentParser()
    sidecar_cli.configure(parser)
    options = {o for action in parser._actions for o in action.option_strings if o.startswith("--")} - {"--help"}
    table = text.split("`llm-health readiness` flags:", 1)[1].split("\n\n", 2)[1]
    assert set(re.findall(r"`(--[a-z-]+)", table)) == options, table
    for folder in (BASE, DASHBOARDS):
        for line in (folder / "kustomization.yaml").read_text().splitlines():
            if line.startswith("#   llm-health "):
                shlex.split(line[4:])  # the documented commands parse
