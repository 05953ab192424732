"""Offline checks of docker-compose.yml and the configs it mounts (there is no Docker engine here).

What can be checked without running containers: the file parses, profiles are as documented, every
bind-mounted file exists, and every host:port that one config names (Prometheus targets, the
Alertmanager webhook, llm-health backend/proxy URLs and restart actions, HAProxy servers, Grafana
datasources) is a compose service of the same stack that listens on that port. The mounted configs
pass their own tools (load_config, promtool, amtool, haproxy -c) where installed, and every
`llm-health ...` command line parses with the real CLI parser.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from llm_health.cli import COMMANDS, build_parser
from llm_health.config import Config, load_config
from tests.support.haproxy import Sizing, server_limits
from tests.support.paths import REPO

ROOT = REPO
COMPOSE_FILE = ROOT / "docker-compose.yml"

SIM_STACK = {"sim-a", "sim-b", "haproxy", "exporter", "remediator"}
GPU_STACK = {"vllm-a", "vllm-b", "haproxy-gpu", "exporter-gpu", "remediator-gpu"}
SHARED = {"token-init", "prometheus", "alertmanager", "grafana"}
# Container ports of the third-party images (their documented defaults; our commands do not change them).
IMAGE_PORTS = {"prom/prometheus": {9090}, "prom/alertmanager": {9093}, "grafana/grafana": {3000}}
# Host paths outside the repo that a service may bind-mount.
SYSTEM_BIND_PATHS = {"/var/run/docker.sock"}
VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> Any:
    """Compose's `${VAR:-default}` with an empty environment: the default (or empty)."""
    if isinstance(value, str):
        return VAR_RE.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Bind:
    source: str
    target: str


def binds(service: dict[str, Any]) -> list[Bind]:
    out = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith(("./", "/")):
            out.append(Bind(source, target))
    return out


def mounted_file(service: dict[str, Any], target: str) -> Path:
    for bind in binds(service):
        if bind.target == target:
            return ROOT / bind.source
    raise AssertionError(f"nothing is mounted at {target}")


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return interpolate(data)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def stack_of(name: str) -> str:
    return "gpu" if name in GPU_STACK else "sim" if name in SIM_STACK else "shared"


def llm_health_config(services: dict[str, dict[str, Any]], name: str) -> Config:
    return load_config(mounted_file(services[name], "/etc/llm-health/config.yml"))


def haproxy_binds(cfg: Path) -> set[int]:
    return {int(m.group(1)) for m in re.finditer(r"^\s*bind\s+\S*:(\d+)", cfg.read_text(), re.M)}


def haproxy_servers(cfg: Path) -> dict[str, tuple[str, int]]:
    found = re.finditer(r"^\s*server\s+(\S+)\s+([^:\s]+):(\d+)", cfg.read_text(), re.M)
    return {m.group(1): (m.group(2), int(m.group(3))) for m in found}


def listening_ports(services: dict[str, dict[str, Any]], name: str) -> set[int]:
    """The container ports a service listens on, from its own command or mounted config."""
    service = services[name]
    command = service.get("command", [])
    image = service["image"].split(":")[0]
    if image == "llm-health":
        sub = command[0]
        if sub == "sim":
            return {int(flag_value(command, "--port")), int(flag_value(command, "--control-port"))}
        config = llm_health_config(services, name)
        listen = config.exporter.listen if sub == "exporter" else config.remediator.listen
        return {int(listen.rsplit(":", 1)[1])}
    if image == "haproxy":
        return haproxy_binds(mounted_file(service, "/usr/local/etc/haproxy/haproxy.cfg"))
    if image == "vllm/vllm-openai":
        return {int(flag_value(command, "--port"))}
    return IMAGE_PORTS[image]


def assert_reachable(services: dict[str, dict[str, Any]], host: str, port: int, where: str) -> None:
    assert host in services, f"{where}: {host} is not a compose service"
    assert port in listening_ports(services, host), f"{where}: {host} does not listen on {port}"


# -- the compose file itself -------------------------------------------------------------------------

def test_services_and_profiles(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == SIM_STACK | GPU_STACK | SHARED
    default = {n for n, s in services.items() if not s.get("profiles")}
    assert default == SIM_STACK | SHARED, "`docker compose up` must start the simulated stack"
    gpu = {n for n, s in services.items() if s.get("profiles") == ["gpu"]}
    assert gpu == GPU_STACK
    assert default | gpu == set(services), "no other profiles"


def test_depends_on_stays_inside_the_enabled_services(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for dep in service.get("depends_on", []):
            assert dep in services, (name, dep)
            if stack_of(name) != "gpu":
                assert not services[dep].get("profiles"), f"{name} would need the gpu profile for {dep}"


def test_bind_mounts_exist_and_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
            elif source.startswith("/"):
                assert source in SYSTEM_BIND_PATHS, f"{name}: unexpected host path {source}"
            else:
                assert source in declared, f"{name}: named volume {source} is not declared"


def test_published_ports_are_loopback_and_listened_on(services: dict[str, dict[str, Any]]) -> None:
    host_ports = []
    for name, service in services.items():
        for spec in service.get("ports", []):
            ip, host_port, container_port = spec.split(":")
            assert ip == "127.0.0.1", f"{name}: publish on loopback only"
            host_ports.append(int(host_port))
            assert int(container_port) in listening_ports(services, name), f"{name}: nothing on {container_port}"
    assert len(host_ports) == len(set(host_ports)), "two services publish the same host port"


def test_llm_health_commands_parse_with_the_real_cli(services: dict[str, dict[str, Any]]) -> None:
    parser = build_parser()
    for name, service in services.items():
        if service["image"].startswith("llm-health:"):
            command = service["command"]
            assert command[0] in COMMANDS, name
            args = parser.parse_args(command)
            assert args.command == command[0]


def test_dockerfile_builds_the_llm_health_image(services: dict[str, dict[str, Any]]) -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\s*$", text, re.M)
    assert re.search(r"^RUN pip install '\.\[postgresql\]'", text, re.M)     # with the PostgreSQL store's driver
    assert 'ENTRYPOINT ["llm-health"]' in text
    for package in ("llm_health", "exporter", "remediator", "simulator"):
        assert re.search(rf"^COPY {package} ", text, re.M), package
    built = {n for n, s in services.items() if s.get("build") == "."}
    assert built == {n for n, s in services.items() if s["image"] == "llm-health:local"}


def test_dockerfile_runs_as_non_root_with_a_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}, "the image must end as a non-root user"
    (health,) = re.findall(r"^HEALTHCHECK .*CMD (\[.*\])$", text, re.M)
    assert yaml.safe_load(health)[:2] == ["llm-health", "healthcheck"]
    for needed in ("setup.py", "LICENSE", "dashboards", "rules", "docs/runbooks.md"):
        assert re.search(rf"^COPY .*{re.escape(needed)}", text, re.M), f"the wheel build needs {needed}"


def test_dockerfile_carries_oci_labels_that_are_true() -> None:
    import tomllib

    import llm_health

    text = (ROOT / "Dockerfile").read_text()
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', text))
    assert set(labels) >= {f"org.opencontainers.image.{k}" for k in
                           ("title", "description", "licenses", "version", "revision", "created")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert labels["org.opencontainers.image.description"] == project["description"]
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert re.search(rf"^ARG VERSION={re.escape(llm_health.__version__)}$", text, re.M), "ARG VERSION is stale"
    # nothing points at a repository or site that does not exist
    assert not {"org.opencontainers.image.source", "org.opencontainers.image.url",
                "org.opencontainers.image.documentation"} & set(labels)
    assert "github.com" not in text


def healthcheck_url(test: list[str]) -> tuple[str, int, str] | None:
    """(host, port, path) that a healthcheck command reaches, for the forms used in docker-compose.yml."""
    text = " ".join(test)
    m = re.search(r"https?://([^/:\s']+):(\d+)(/[^\s']*)", text)
    if m:
        return m.group(1), int(m.group(2)), m.group(3)
    m = re.search(r"/dev/tcp/([^/\s]+)/(\d+)", text)
    if m:
        return m.group(1), int(m.group(2)), re.search(r"GET (\S+)", text).group(1)  # type: ignore[union-attr]
    return None


def test_every_service_has_a_healthcheck_on_its_own_port(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if service.get("restart") == "no":
            continue  # a one-shot job (token-init): it runs, writes, exits; there is nothing to check
        check = service.get("healthcheck")
        assert check and check["test"][0] == "CMD", f"{name}: no healthcheck"
        target = healthcheck_url(check["test"])
        assert target is not None, f"{name}: cannot tell what {check['test']} checks"
        host, port, _ = target
        assert host == "127.0.0.1", f"{name}: a healthcheck checks its own container"
        assert port in listening_ports(services, name), f"{name}: nothing listens on {port}"
        if service["image"].startswith("llm-health:"):
            assert check["test"][1] == "llm-health"
            args = build_parser().parse_args(check["test"][2:])
            assert args.command == "healthcheck"
    for name in ("vllm-a", "vllm-b"):  # tolerant: a busy vLLM's /health is slow, not broken
        check = services[name]["healthcheck"]
        assert check["timeout"] == "60s" and check["retries"] >= 10


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_haproxy_healthcheck_is_valid_bash(services: dict[str, dict[str, Any]]) -> None:
    for name in ("haproxy", "haproxy-gpu"):
        test = services[name]["healthcheck"]["test"]
        assert test[1:3] == ["bash", "-c"]
        syntax = subprocess.run(["bash", "-n", "-c", test[3]], capture_output=True, text=True, timeout=10)
        assert syntax.returncode == 0, syntax.stderr


def test_backends_have_no_docker_restart_policy(services: dict[str, dict[str, Any]]) -> None:
    for name in ("sim-a", "sim-b", "vllm-a", "vllm-b"):
        assert services[name]["restart"] == "no", f"{name}: the remediator is the one restart authority"


def test_gpu_backends_use_real_vllm_on_nvidia(services: dict[str, dict[str, Any]]) -> None:
    for name in ("vllm-a", "vllm-b"):
        service = services[name]
        assert service["image"].startswith("vllm/vllm-openai:")
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices and all(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
        assert service["container_name"] == name
    gpus = [services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n in ("vllm-a", "vllm-b")]
    assert gpus[0] != gpus[1], "each vLLM needs its own GPU"


# -- llm-health configs ----------------------------------------------------------------------------

@pytest.mark.parametrize(("exporter", "remediator"), [("exporter", "remediator"), ("exporter-gpu", "remediator-gpu")])
def test_exporter_and_remediator_share_one_config(
    services: dict[str, dict[str, Any]], exporter: str, remediator: str
) -> None:
    exp = mounted_file(services[exporter], "/etc/llm-health/config.yml")
    rem = mounted_file(services[remediator], "/etc/llm-health/config.yml")
    assert exp == rem
    config = load_config(exp)
    assert config.exporter.listen.startswith("0.0.0.0:") and config.remediator.listen.startswith("0.0.0.0:")
    assert config.remediator.state.startswith("/var/lib/llm-health/")
    assert any(v.target == "/var/lib/llm-health" for v in _volumes(services[remediator])), "state must persist"
    assert urlparse(config.remediator.alertmanager_url).hostname == "alertmanager"


def _volumes(service: dict[str, Any]) -> list[Bind]:
    return [Bind(*v.split(":")[:2]) for v in service.get("volumes", [])]


@pytest.mark.parametrize("exporter", ["exporter", "exporter-gpu"])
def test_config_urls_point_at_services_of_the_same_stack(services: dict[str, dict[str, Any]], exporter: str) -> None:
    config = llm_health_config(services, exporter)
    stack = stack_of(exporter)
    assert len(config.backends) == 2 and len(config.proxies) == 1
    for backend in config.backends:
        url = urlparse(backend.url)
        assert url.hostname == backend.name, "backend name = compose service name = Prometheus `backend` label"
        assert stack_of(url.hostname) == stack
        assert_reachable(services, url.hostname, url.port, f"backend {backend.name}")
    proxy = urlparse(config.proxies[0].url)
    assert stack_of(proxy.hostname) == stack and services[proxy.hostname]["image"].startswith("haproxy:")
    assert_reachable(services, proxy.hostname, proxy.port, "proxy")


def test_sim_restart_action_targets_the_same_simulator_control_port(services: dict[str, dict[str, Any]]) -> None:
    from llm_health.simulator.ctl import build_parser as ctl_parser

    for backend in llm_health_config(services, "remediator").backends:
        argv = list(backend.restart)
        assert argv[:4] == ["python", "-m", "llm_health.simulator.ctl", "restart"], backend.name
        args = ctl_parser().parse_args(argv[3:])
        url = urlparse(args.url)
        assert url.hostname == backend.name
        assert url.port == int(flag_value(services[backend.name]["command"], "--control-port"))


def test_gpu_restart_action_restarts_the_container_through_the_socket(services: dict[str, dict[str, Any]]) -> None:
    for backend in llm_health_config(services, "remediator-gpu").backends:
        assert list(backend.restart) == ["docker", "restart", services[backend.name]["container_name"]]
    assert any(b.source == "/var/run/docker.sock" for b in binds(services["remediator-gpu"]))
    assert not any(b.source == "/var/run/docker.sock" for b in binds(services["remediator"]))
    assert "docker" in (ROOT / "Dockerfile").read_text(), "the image needs the docker CLI"


# -- HAProxy ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("haproxy", "exporter"), [("haproxy", "exporter"), ("haproxy-gpu", "exporter-gpu")])
def test_haproxy_balances_the_backends_of_its_stack(
    services: dict[str, dict[str, Any]], haproxy: str, exporter: str
) -> None:
    cfg = mounted_file(services[haproxy], "/usr/local/etc/haproxy/haproxy.cfg")
    servers = haproxy_servers(cfg)
    names = {b.name for b in llm_health_config(services, exporter).backends}
    assert set(servers) == names
    for name, (host, port) in servers.items():
        assert host == name
        assert_reachable(services, host, port, f"{haproxy} server {name}")


HAPROXY_DIR = "/usr/local/etc/haproxy"


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed")
@pytest.mark.parametrize("haproxy", ["haproxy", "haproxy-gpu"])
def test_haproxy_config_is_valid(services: dict[str, dict[str, Any]], haproxy: str, tmp_path: Path) -> None:
    """`haproxy -c` on the container's config folder as mounted: the config loads least_loaded.lua from
    next to itself (default-path config), so the Lua file must be mounted there too."""
    for bind in binds(services[haproxy]):
        if bind.target.startswith(HAPROXY_DIR + "/"):
            dest = tmp_path / bind.target.removeprefix(HAPROXY_DIR + "/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / bind.source, dest)
    assert (tmp_path / "least_loaded.lua").is_file(), f"{haproxy}: least_loaded.lua is not mounted next to its config"
    result = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("haproxy", "engines"), [("haproxy", ("sim-a", "sim-b")), ("haproxy-gpu", ("vllm-a", "vllm-b"))])
def test_haproxy_limits_are_sized_from_the_engines_slots(
    services: dict[str, dict[str, Any]], haproxy: str, engines: tuple[str, ...]
) -> None:
    """maxconn/maxqueue follow the sizing rule for the --max-num-seqs the stack starts its engines with."""
    (slots,) = {int(flag_value(services[name]["command"], "--max-num-seqs")) for name in engines}
    cfg = mounted_file(services[haproxy], f"{HAPROXY_DIR}/haproxy.cfg").read_text()
    size = Sizing(slots)
    assert server_limits(cfg) == {"maxconn": size.maxconn, "maxqueue": size.maxqueue}, (haproxy, slots)
    assert f"{{ avg_queue gt {size.maxqueue} }}" in cfg


# -- Prometheus ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prometheus(services: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(mounted_file(services["prometheus"], "/etc/prometheus/prometheus.yml").read_text())


def scrape_job(prometheus: dict[str, Any], job: str) -> dict[str, Any]:
    return next(j for j in prometheus["scrape_configs"] if j["job_name"] == job)


def test_prometheus_targets_are_services_listening_there(
    services: dict[str, dict[str, Any]], prometheus: dict[str, Any]
) -> None:
    for job in prometheus["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                if host == "localhost":
                    assert job["job_name"] == "prometheus"
                    continue
                assert stack_of(host) != "gpu", "gpu services are found by DNS, not static targets"
                assert_reachable(services, host, int(port), f"job {job['job_name']}")
        for sd in job.get("dns_sd_configs", []):
            assert sd["type"] == "A"
            for name in sd["names"]:
                assert stack_of(name) == "gpu", f"{name}: only optional (gpu) services use DNS discovery"
                assert_reachable(services, name, sd["port"], f"job {job['job_name']}")
    alertmanagers = [t for am in prometheus["alerting"]["alertmanagers"] for s in am["static_configs"] for t in s["targets"]]
    for target in alertmanagers:
        host, port = target.rsplit(":", 1)
        assert_reachable(services, host, int(port), "alerting")


def test_every_backend_is_scraped_with_its_backend_label(
    services: dict[str, dict[str, Any]], prometheus: dict[str, Any]
) -> None:
    job = scrape_job(prometheus, "vllm")
    static = {t: s["labels"]["backend"] for s in job["static_configs"] for t in s["targets"]}
    dns = {n for sd in job["dns_sd_configs"] for n in sd["names"]}
    relabel = {(r["target_label"], r.get("replacement", "$1")) for r in job["relabel_configs"]
               if r["source_labels"] == ["__meta_dns_name"]}
    assert ("backend", "$1") in relabel, "DNS-discovered backends get backend = their service name"
    for backend in llm_health_config(services, "exporter").backends:
        assert static.get(backend.address) == backend.name
    for backend in llm_health_config(services, "exporter-gpu").backends:
        assert backend.name in dns
    exporters = [t for s in scrape_job(prometheus, "llm-health-exporter")["static_configs"] for t in s["targets"]]
    assert exporters == ["exporter:9410"]


def test_prometheus_loads_the_repo_rules(services: dict[str, dict[str, Any]], prometheus: dict[str, Any]) -> None:
    mounts = {b.target: b.source for b in binds(services["prometheus"])}
    assert mounts["/etc/prometheus/rules"] == "./rules"
    assert prometheus["rule_files"] == ["/etc/prometheus/rules/llm_health_*.yml"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_config_passes_promtool(services: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    copy = tmp_path / "prometheus.yml"
    copy.write_text(mounted_file(services["prometheus"], "/etc/prometheus/prometheus.yml").read_text())
    result = subprocess.run(["promtool", "check", "config", str(copy)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# -- Alertmanager ----------------------------------------------------------------------------------

def alertmanager_file(services: dict[str, dict[str, Any]]) -> Path:
    return mounted_file(services["alertmanager"], "/etc/alertmanager/alertmanager.yml")


def test_webhooks_reach_the_remediator_of_each_stack(services: dict[str, dict[str, Any]]) -> None:
    am = yaml.safe_load(alertmanager_file(services).read_text())
    urls = {r["name"]: [w["url"] for w in r.get("webhook_configs", [])] for r in am["receivers"]}
    remediators = set()
    for receiver, hooks in urls.items():
        if not hooks:
            continue  # the people receivers (operators, operators-info) have no integration in the demo
        assert len(hooks) == 1, receiver
        url = urlparse(hooks[0])
        assert url.path == "/webhook"
        assert services[url.hostname]["command"][0] == "remediator"
        assert_reachable(services, url.hostname, url.port, f"receiver {receiver}")
        remediators.add(url.hostname)
    assert remediators == {"remediator", "remediator-gpu"}


AMTOOL = shutil.which("amtool")
PRODUCTION_AM = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("compose_alertmanager", ROOT / "scripts" / "compose_alertmanager.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compose_alertmanager_is_generated_from_the_production_example(services: dict[str, dict[str, Any]]) -> None:
    generator = load_generator()
    assert alertmanager_file(services).read_text() == generator.render(PRODUCTION_AM.read_text()), (
        "stale: python scripts/compose_alertmanager.py")
    # Only URL, token and the gpu stack's receiver/route differ: undo those and the two are equal.
    production = yaml.safe_load(PRODUCTION_AM.read_text())
    compose = yaml.safe_load(alertmanager_file(services).read_text())
    compose["receivers"] = [r for r in compose["receivers"] if r["name"] != generator.GPU_RECEIVER]
    (remediator_route,) = [r for r in compose["route"]["routes"]
                           if r["receiver"] == generator.RECEIVER and generator.RESTART in r["matchers"]]
    assert remediator_route.pop("routes") == [{"receiver": generator.GPU_RECEIVER, "matchers": [generator.GPU_BACKENDS]}]
    for config in (production, compose):
        for receiver in config["receivers"]:
            for hook in receiver.get("webhook_configs") or []:
                hook.pop("url")
                hook.pop("http_config", None)
    assert compose == production


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed")
@pytest.mark.parametrize("which", ["production", "compose"])
def test_both_alertmanager_configs_pass_amtool(services: dict[str, dict[str, Any]], which: str) -> None:
    path = PRODUCTION_AM if which == "production" else alertmanager_file(services)
    check = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed")
@pytest.mark.parametrize(
    ("labels", "receivers"),
    [(["alertname=LLMBackendStalled", "backend=sim-a", "remediation=restart", "severity=critical"],
      "llm-health-remediator,operators"),
     (["alertname=LLMBackendDown", "backend=vllm-b", "remediation=restart", "severity=critical"],
      "llm-health-remediator-gpu,operators"),
     (["alertname=LLMBackendRestarted", "backend=sim-a", "severity=info"], "operators-info"),
     (["alertname=LLMKVCachePressure", "backend=vllm-a", "severity=warning"], "operators"),
     (["alertname=Other"], "operators"),
     (["alertname=Watchdog", "severity=none"], "llm-health-remediator,watchdog")],
)
def test_alertmanager_routes_each_backend_to_its_remediator(
    services: dict[str, dict[str, Any]], labels: list[str], receivers: str
) -> None:
    routed = subprocess.run(
        ["amtool", "config", "routes", "test", f"--config.file={alertmanager_file(services)}",
         f"--verify.receivers={receivers}", *labels],
        capture_output=True, text=True, timeout=30,
    )
    assert routed.returncode == 0, routed.stdout + routed.stderr


# -- Grafana ---------------------------------------------------------------------------------------

def test_grafana_provisioning_matches_the_mounts(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    mounts = {b.target: ROOT / b.source for b in binds(grafana)}
    provisioning = mounts["/etc/grafana/provisioning"]
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    by_type = {d["type"]: d for d in datasources["datasources"]}
    assert by_type["prometheus"]["isDefault"] is True
    for ds in datasources["datasources"]:
        url = urlparse(ds["url"])
        assert_reachable(services, url.hostname, url.port, f"datasource {ds['name']}")
    providers = yaml.safe_load((provisioning / "dashboards" / "provider.yml").read_text())["providers"]
    assert len(providers) == 1 and providers[0]["type"] == "file"
    path = providers[0]["options"]["path"]
    assert path in mounts, "the provider must read the mounted dashboards"
    dashboards = sorted(p.name for p in mounts[path].glob("*.json"))
    assert dashboards == ["llm-health-fleet.json", "llm-health-remediator.json"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent.as_posix() == path and Path(home).name in dashboards


def test_job_names_in_the_rules_are_scraped(prometheus: dict[str, Any]) -> None:
    jobs = {j["job_name"] for j in prometheus["scrape_configs"]}
    referenced = {m for path in (ROOT / "rules").glob("llm_health_*.yml") for m in re.findall(r'job="([^"]+)"', path.read_text())}
    assert referenced <= jobs, f"rules select jobs the compose Prometheus does not have: {sorted(referenced - jobs)}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_config_with_the_repo_rules_passes_promtool(prometheus: dict[str, Any], tmp_path: Path) -> None:
    config = dict(prometheus, rule_files=[str(ROOT / "rules" / "llm_health_*.yml")])
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_remediators_and_alertmanager_share_a_generated_token(services: dict[str, dict[str, Any]]) -> None:
    """Issue 12 finding 4: the compose stack never runs the remediator without a token."""
    init = services["token-init"]
    assert init["command"][:3] == ["token", "--out", "/run/llm-health-token/token"]
    assert init["restart"] == "no"
    for name, config in (("remediator", "llm-health.yml"), ("remediator-gpu", "llm-health-gpu.yml")):
        assert "token-init" in services[name]["depends_on"]
        assert "llm-health-token:/run/llm-health-token:ro" in services[name]["volumes"]
        remediator = yaml.safe_load((ROOT / "deploy" / "compose" / config).read_text())["remediator"]
        assert remediator["token_file"] == "/run/llm-health-token/token"
        assert not remediator.get("insecure_no_auth")
    assert "llm-health-token:/run/llm-health-token:ro" in services["alertmanager"]["volumes"]
    am = yaml.safe_load((ROOT / "deploy" / "compose" / "alertmanager.yml").read_text())
    for receiver in am["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            assert hook["http_config"]["authorization"]["credentials_file"] == "/run/llm-health-token/token"


def test_token_command_writes_a_private_token_once(tmp_path: Path) -> None:
    from llm_health.cli import main

    path = tmp_path / "t" / "token"
    assert main(["token", "--out", str(path)]) == 0
    first = path.read_text()
    assert len(first.strip()) == 64 and (path.stat().st_mode & 0o777) == 0o600
    assert main(["token", "--out", str(path)]) == 0
    assert path.read_text() == first
