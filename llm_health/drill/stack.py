"""The whole pipeline on loopback with real programs: simulated vLLM backends, HAProxy as a proxy,
the exporter, the remediator (gunicorn), Alertmanager and Prometheus.

Shared by `llm-health demo` and the end-to-end tests. Every port is a free loopback port; every
process is a child that `Stack.stop()` reaps, even after a failure. Timings are short (seconds,
not minutes) and come from `Timings`, so a fire drill runs in well under a minute.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from llm_health.drill.procs import ManagedProcess, free_port, llm_health, python_module, wait_until

REPO = Path(__file__).resolve().parents[2]  # the checkout: llm_health/drill/stack.py


def _asset(relative: str) -> Path:
    """A deploy/ or rules/ file of the repository."""
    path = REPO / relative
    if not path.exists():
        raise FileNotFoundError(f"{relative} not found under {REPO}")
    return path


@dataclass(frozen=True)
class Timings:
    """Seconds-scale settings for drills and tests (production defaults are minutes)."""

    scrape: str = "1s"
    exporter_scrape: str | None = None  # the exporter's job (None: `scrape`, as every other job)
    step_seconds: float = 0.05          # simulated engine step
    exporter_interval: float = 0.5
    stall_after: float = 4.0
    read_timeout: float = 1.0
    probe_timeout: float = 2.0
    rules: tuple[tuple[str, str], ...] = (
        ("--scrape-interval", "1s"),
        ("--restart-evaluation-interval", "1s"),
        ("--down-busy-grace", "10s"),
        ("--stall-window", "8s"),
        ("--stall-for", "3s"),
        ("--down-for", "3s"),
        ("--restart-window", "20s"),
        ("--rate-window", "4s"),
        ("--no-metrics-for", "5s"),
        ("--unknown-for", "30s"),
        ("--missing-window", "2m"),
        ("--missing-for", "10s"),
        ("--proxy-down-for", "3s"),
        ("--exporter-down-for", "10s"),
        ("--probe-busy-window", "10s"),
        ("--proxy-window", "30s"),
    )
    group_wait: str | None = "1s"       # None (all three): the shipped deploy/alertmanager/alertmanager.yml's
    group_interval: str | None = "2s"
    repeat_interval: str | None = "6s"
    verify_readings: int = 2
    verify_interval: float = 0.5
    stalled_drain_timeout: float = 0.5
    poll_interval: float = 0.2
    warmup_timeout: float = 30.0
    warmup_poll: float = 0.3
    backoff_initial: float = 30.0
    drain_timeout: float = 3.0


@dataclass(frozen=True)
class BackendSpec:
    name: str
    sim_args: tuple[str, ...] = ()
    host: str = ""


@dataclass(frozen=True)
class ExternalBackend:
    """A backend the stack does not start (e.g. a real vLLM): its URL, model and restart argv."""

    name: str
    url: str
    model: str
    restart: tuple[str, ...]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])


@dataclass
class SimHandle:
    name: str
    port: int
    control_port: int
    process: ManagedProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    def fault(self, name: str, **extra: Any) -> None:
        r = requests.post(f"{self.control_url}/sim/fault", json={"fault": name, **extra}, timeout=5)
        r.raise_for_status()

    def stats(self) -> dict[str, Any]:
        r = requests.get(f"{self.control_url}/sim/stats", timeout=5)
        r.raise_for_status()
        return dict(r.json())


class Load:
    """Keeps `slots` generation requests in flight against one backend until stopped (a batch job)."""

    def __init__(self, url: str, slots: int, max_tokens: int = 400, prompt: str = "summarise the logs") -> None:
        self.url = url
        self.slots = slots
        self.max_tokens = max_tokens
        self.prompt = prompt
        self.stop_event = threading.Event()
        self.completed = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(slots)]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                r = requests.post(
                    f"{self.url}/v1/completions",
                    json={"model": "sim-model", "prompt": self.prompt, "max_tokens": self.max_tokens},
                    timeout=120,
                )
                ok = r.status_code == 200
            except requests.RequestException:
                ok = False
            with self._lock:
                if ok:
                    self.completed += 1
                else:
                    self.failed += 1
            if not ok:
                self.stop_event.wait(0.2)

    def stop(self) -> None:
        self.stop_event.set()


@dataclass
class Stack:
    workdir: Path
    backends: tuple[BackendSpec, ...] = (BackendSpec("sim-a"), BackendSpec("sim-b"))
    timings: Timings = field(default_factory=Timings)
    alertmanager_replicas: int = 1
    peer_timeout: str = "10ms"
    proxy: bool = True
    remediator_workers: int = 2
    token: str = "drill-token"
    echo: Callable[[str], None] | None = None

    external: tuple[ExternalBackend, ...] = ()   # started by the caller, judged like the sims
    sims: dict[str, SimHandle] = field(default_factory=dict)
    processes: list[ManagedProcess] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    am_ports: list[int] = field(default_factory=list)

    # ---- paths and URLs -------------------------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def config_path(self) -> Path:
        return self.workdir / "llm-health.yml"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    @property
    def exporter_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['exporter']}"

    @property
    def remediator_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['remediator']}"

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['haproxy']}"

    def alertmanager_url(self, replica: int = 0) -> str:
        return f"http://127.0.0.1:{self.am_ports[replica]}"

    def _say(self, text: str) -> None:
        if self.echo:
            self.echo(text)

    # ---- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        for name in ("exporter", "remediator", "prometheus", "haproxy", "agent"):
            self.ports[name] = free_port()
        self.am_ports = [free_port() for _ in range(self.alertmanager_replicas)]
        (self.workdir / "remediator.token").write_text(self.token + "\n")
        (self.workdir / "busy").mkdir(exist_ok=True)
        self._start_sims()
        if self.proxy:
            self._start_haproxy()
        self._write_config()
        self._start_remediator()
        self._start_exporter()
        self._start_alertmanagers()
        self._start_prometheus()
        self.settle()

    def settle(self, timeout: float = 45.0) -> None:
        """Wait until Prometheus scrapes every target, the exporter has judged every backend
        (idle or busy) and no alert fires: the quiet start a drill begins from."""
        members = len(self.sims) + len(self.external)
        targets = members + 2
        self.wait(lambda: len([s for s in self.query("up") if s["value"][1] == "1"]) >= targets,
                  timeout, "every target scraped by Prometheus")
        self.wait(lambda: all(v["verdict"] in ("idle", "busy") for v in self.verdicts().values())
                  and len(self.verdicts()) == members, timeout, "a verdict for every backend")
        self.wait(lambda: not self.query('ALERTS{alertstate="firing"}'), timeout, "no alert firing")
        self._say("stack settled: every target scraped, every backend judged, nothing firing")

    def stop(self) -> None:
        for proc in reversed(self.processes):
            try:
                proc.stop(timeout=5)
            except Exception:  # noqa: BLE001 - keep reaping the rest
                pass
        self.processes.clear()

    def _spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> ManagedProcess:
        proc = ManagedProcess(argv, name, self.logs, env=env, cwd=self.workdir)
        self.processes.append(proc)
        return proc

    # ---- components -----------------------------------------------------------------------
    def _start_sims(self) -> None:
        t = self.timings
        for spec in self.backends:
            port, control = free_port(), free_port()
            proc = self._spawn(
                llm_health(
                    "sim", "--port", port, "--control-port", control,
                    "--step-seconds", t.step_seconds, *spec.sim_args,
                ),
                spec.name,
            )
            self.sims[spec.name] = SimHandle(spec.name, port, control, proc)
        for sim in self.sims.values():
            sim.process.wait_http(f"{sim.control_url}/sim/stats")
            self._say(f"simulated vLLM {sim.name} at {sim.url} (control {sim.control_url})")

    def _start_haproxy(self) -> None:
        haproxy = shutil.which("haproxy")
        if not haproxy:
            raise RuntimeError("haproxy not installed (make test installs the Debian package)")
        servers = "\n".join(
            f"    server {s.name} 127.0.0.1:{s.port} check" for s in [*self.sims.values(), *self.external]
        )
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(
            "global\n    maxconn 256\n"
            "defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n"
            f"frontend fe\n    bind 127.0.0.1:{self.ports['haproxy']}\n    default_backend vllm\n"
            "backend vllm\n    balance roundrobin\n    option httpchk GET /health\n"
            "    default-server inter 1s fall 2 rise 1\n"
            f"{servers}\n"
        )
        proc = self._spawn([haproxy, "-db", "-f", str(cfg)], "haproxy")
        proc.wait_http(f"{self.proxy_url}/v1/models")
        self._say(f"HAProxy (proxy) at {self.proxy_url}")

    def config_data(self) -> dict[str, Any]:
        t = self.timings
        return {
            "backends": [
                {
                    "name": s.name,
                    "url": s.url,
                    "host": spec.host,
                    "model": "sim-model",
                    "restart": [*python_module("llm_health.simulator.ctl", "restart", s.control_url)],
                }
                for spec, s in ((spec, self.sims[spec.name]) for spec in self.backends)
            ] + [
                {"name": x.name, "url": x.url, "model": x.model, "restart": list(x.restart)}
                for x in self.external
            ],
            "proxies": [{"name": "lb", "url": self.proxy_url}] if self.proxy else [],
            "exporter": {
                "listen": f"127.0.0.1:{self.ports['exporter']}",
                "interval": t.exporter_interval,
                "stall_after": t.stall_after,
                "read_timeout": t.read_timeout,
                "probe_timeout": t.probe_timeout,
            },
            "remediator": {
                "listen": f"127.0.0.1:{self.ports['remediator']}",
                "state": str(self.workdir / "remediator.db"),
                "token_file": str(self.workdir / "remediator.token"),
                "busy_dir": str(self.workdir / "busy"),
                "workers": self.remediator_workers,
                "action_timeout": 20.0,
                "dedup_window": 60.0,
                "verify_readings": t.verify_readings,
                "verify_interval": t.verify_interval,
                "unresponsive_after": t.stall_after,
                "warmup_timeout": t.warmup_timeout,
                "warmup_poll": t.warmup_poll,
                "drain_timeout": t.drain_timeout,
                "stalled_drain_timeout": t.stalled_drain_timeout,
                "poll_interval": t.poll_interval,
                "alertmanager_url": self.alertmanager_url(0) if self.am_ports else "",
                "backoff": {"initial": t.backoff_initial, "factor": 2.0, "cap": 600.0, "stable_after": 600.0},
                "budget": {"restarts": 3, "window": 600.0},
                "breaker": {"restarts": 6, "window": 600.0},
            },
        }

    def _write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config_data(), sort_keys=False))

    def _start_remediator(self) -> None:
        proc = self._spawn(llm_health("remediator", "--config", self.config_path), "remediator")
        proc.wait_http(f"{self.remediator_url}/healthz", timeout=30)
        self._say(f"remediator (one restart authority) at {self.remediator_url}/")

    def _start_exporter(self) -> None:
        proc = self._spawn(llm_health("exporter", "--config", self.config_path), "exporter")
        proc.wait_http(f"{self.exporter_url}/metrics", timeout=30)
        self._say(f"exporter at {self.exporter_url}/verdicts")

    def alertmanager_config(self) -> dict[str, Any]:
        """deploy/alertmanager/alertmanager.yml with drill timings and this stack's remediator URL."""
        data = yaml.safe_load(_asset("deploy/alertmanager/alertmanager.yml").read_text())
        t = self.timings

        def shorten(route: dict[str, Any]) -> None:
            for key, value in (("group_wait", t.group_wait), ("group_interval", t.group_interval),
                               ("repeat_interval", t.repeat_interval)):
                if value is not None and (key in route or route is data["route"]):
                    route[key] = value
            for child in route.get("routes", []) or []:
                shorten(child)

        shorten(data["route"])
        for receiver in data.get("receivers", []):
            for hook in receiver.get("webhook_configs", []) or []:
                hook["url"] = f"{self.remediator_url}/webhook"
                auth = (hook.get("http_config") or {}).get("authorization")
                if auth is not None:
                    auth["credentials_file"] = str(self.workdir / "remediator.token")
        return data

    def _start_alertmanagers(self) -> None:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if not binary:
            raise RuntimeError("prometheus-alertmanager not installed")
        cfg = self.workdir / "alertmanager.yml"
        cfg.write_text(yaml.safe_dump(self.alertmanager_config(), sort_keys=False))
        cluster_ports = [free_port() for _ in self.am_ports]
        for i, port in enumerate(self.am_ports):
            argv = [
                binary, f"--config.file={cfg}", f"--storage.path={self.workdir / f'am{i}'}",
                f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url=http://127.0.0.1:{port}",
            ]
            if len(self.am_ports) == 1:
                argv.append("--cluster.listen-address=")
            else:
                argv += [
                    f"--cluster.listen-address=127.0.0.1:{cluster_ports[i]}",
                    f"--cluster.advertise-address=127.0.0.1:{cluster_ports[i]}",
                    f"--cluster.peer-timeout={self.peer_timeout}",
                    "--cluster.gossip-interval=50ms",
                    "--cluster.pushpull-interval=500ms",
                ]
                argv += [f"--cluster.peer=127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i]
            proc = self._spawn(argv, f"alertmanager{i}")
            proc.wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=30)
        self._say(f"Alertmanager at {self.alertmanager_url(0)} ({len(self.am_ports)} replica(s))")

    def _render_rules(self) -> Path:
        out = self.workdir / "rules"
        out.mkdir(exist_ok=True)
        # the runbook links lead to this stack's remediator (its /runbooks page)
        args: list[str] = ["rules", "render", "--out", str(out), "--runbook-base-url", f"{self.remediator_url}/runbooks"]
        for flag, value in self.timings.rules:
            args += [flag, value]
        subprocess.run(llm_health(*args), check=True, capture_output=True, text=True)
        return out

    def prometheus_config(self, rules_dir: Path) -> dict[str, Any]:
        t = self.timings
        return {
            "global": {"scrape_interval": t.scrape, "evaluation_interval": t.scrape,
                       "scrape_timeout": t.scrape},
            "rule_files": [str(rules_dir / "*.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [f"127.0.0.1:{p}" for p in self.am_ports]}]}]},
            "scrape_configs": [
                {"job_name": "vllm", "static_configs": [
                    {"targets": [f"127.0.0.1:{s.port}"], "labels": {"backend": s.name}}
                    for s in [*self.sims.values(), *self.external]]},
                {"job_name": "llm-health-exporter",
                 **({"scrape_interval": t.exporter_scrape, "scrape_timeout": t.exporter_scrape}
                    if t.exporter_scrape else {}),
                 "static_configs": [{"targets": [f"127.0.0.1:{self.ports['exporter']}"]}]},
                {"job_name": "llm-health-remediator",
                 "static_configs": [{"targets": [f"127.0.0.1:{self.ports['remediator']}"]}]},
            ],
        }

    def _start_prometheus(self) -> None:
        binary = shutil.which("prometheus")
        if not binary:
            raise RuntimeError("prometheus not installed")
        rules_dir = self._render_rules()
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.prometheus_config(rules_dir), sort_keys=False))
        port = self.ports["prometheus"]
        proc = self._spawn(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url=http://127.0.0.1:{port}",
             "--rules.alert.resend-delay=1s"],
            "prometheus",
        )
        proc.wait_http(f"{self.prometheus_url}/-/ready", timeout=30)
        self._say(f"Prometheus at {self.prometheus_url}")

    # ---- queries ------------------------------------------------------------------------
    def query(self, expr: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr}, timeout=5)
        r.raise_for_status()
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"query failed: {expr}: {body}")
        return list(body["data"]["result"])

    def firing(self, alertname: str, backend: str | None = None) -> bool:
        sel = f'ALERTS{{alertname="{alertname}",alertstate="firing"'
        sel += f',backend="{backend}"}}' if backend else "}"
        return bool(self.query(sel))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def events(self, backend: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if backend:
            params["backend"] = backend
        r = requests.get(f"{self.remediator_url}/api/events", params=params, timeout=5)
        r.raise_for_status()
        body = r.json()
        return list(body["events"] if isinstance(body, dict) else body)

    def verdicts(self) -> dict[str, dict[str, Any]]:
        r = requests.get(f"{self.exporter_url}/verdicts", timeout=5)
        r.raise_for_status()
        body = r.json()
        items = body["backends"] if isinstance(body, dict) else body
        return {v["backend"]: v for v in items if "backend" in v}

    def set_busy(self, backend: str, owner: str, ttl: float) -> dict[str, Any]:
        r = requests.post(f"{self.remediator_url}/api/busy", headers=self.headers(),
                          json={"backend": backend, "owner": owner, "ttl_seconds": ttl}, timeout=5)
        r.raise_for_status()
        return dict(r.json())

    def clear_busy(self, marker_id: str) -> None:
        r = requests.delete(f"{self.remediator_url}/api/busy/{marker_id}", headers=self.headers(), timeout=5)
        r.raise_for_status()

    def wait(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        return wait_until(condition, timeout=timeout, interval=0.2, what=what)

    def fill_slots(self, backend: str, slots: int, max_tokens: int = 2000) -> Load:
        return Load(self.sims[backend].url, slots, max_tokens=max_tokens).start()

    def describe(self) -> str:
        return json.dumps({"prometheus": self.prometheus_url, "remediator": self.remediator_url,
                           "exporter": self.exporter_url, "alertmanager": self.alertmanager_url(0)})


def event_kinds(events: Iterable[dict[str, Any]]) -> list[str]:
    return [str(e.get("kind") or e.get("decision") or e.get("event")) for e in events]


def main() -> int:  # pragma: no cover - manual use: python -m llm_health.drill.stack DIR
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "var/stack")
    with Stack(workdir, echo=print) as stack:
        print(stack.describe())
        threading.Event().wait()
    return 0
