"""The path from a frozen engine to a started restart, as the replay models and times it (issue 25).

Two things live here:

* `Timing`: the waits between the exporter's verdict and the remediator that are not our code: Prometheus
  scraping the exporter, evaluating `LLMBackendStalled` / `LLMBackendDown` (their `for`), and Alertmanager's
  `group_wait` on the restart route; each with the phase at which its clock ticks (a seed draws them, so the
  replay does not always meet the lucky or the unlucky alignment). `shipped()` reads the shipped settings
  (`RuleSettings`' defaults, the restart route of deploy/alertmanager/alertmanager.yml, the exporter job's scrape
  interval in deploy/prometheus/prometheus.yml, the config defaults),
  `before_issue_25()` is what they were: `stall_after` the floor for every engine, `for: 1m`, `group_wait: 10s`,
  3 verification readings 10 s apart.
* `Path`: the times one stall passed each step (frozen -> first stalled verdict -> alert firing ->
  notification delivered -> verification done -> drain done -> restart started), and `parts()` / `summary()`
  for p50/p95/max over many stalls.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path as FsPath

import yaml

from llm_health.config import ExporterSettings, RemediatorSettings
from llm_health.render.rules import RuleSettings, parse_duration

ROOT = FsPath(__file__).resolve().parent.parent
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GOAL_P95 = 90.0           # issue 25: engine frozen -> restart started, p95, shipped defaults, GPU-like steps
STEPS = ("frozen", "verdict", "firing", "delivered", "verified", "drained", "restarted")
PARTS = tuple(f"{a} -> {b}" for a, b in zip(STEPS, STEPS[1:], strict=False))


def seconds(duration: str) -> float:
    return 0.0 if duration.strip() in ("0", "0s") else float(parse_duration(duration, "duration"))


def restart_route_group_wait(path: FsPath = ALERTMANAGER) -> float:
    """`group_wait` of the shipped route that sends `remediation="restart"` to the remediator."""
    doc = yaml.safe_load(path.read_text())
    for route in doc["route"].get("routes", []):
        if route.get("receiver") == "llm-health-remediator" and 'remediation="restart"' in route.get("matchers", []):
            return seconds(str(route.get("group_wait", doc["route"].get("group_wait", "30s"))))
    raise ValueError(f"{path}: no restart route to llm-health-remediator")


def exporter_scrape_interval(path: FsPath = PROMETHEUS) -> str:
    """The shipped Prometheus config's scrape interval for the exporter's job (its own, else the global one)."""
    doc = yaml.safe_load(path.read_text())
    for job in doc["scrape_configs"]:
        if job["job_name"] == "llm-health-exporter":
            return str(job.get("scrape_interval", doc["global"]["scrape_interval"]))
    raise ValueError(f"{path}: no llm-health-exporter job")


@dataclass(frozen=True)
class Timing:
    name: str
    exporter: ExporterSettings
    remediator: RemediatorSettings
    stall_for: float                  # LLMBackendStalled's `for`
    down_for: float                   # LLMBackendDown's `for`
    group_wait: float                 # Alertmanager, the restart route (a new group's first notification)
    group_interval: float = 60.0      # ... a resolved notification goes out with the group's next flush
    repeat_interval: float = 1800.0
    evidence: bool = True             # the verification reuses the exporter's frozen span (remediator.exporter_url)
    scrape_interval: float = 15.0     # Prometheus scraping the exporter
    evaluation_interval: float = 15.0  # ... evaluating the restart alerts' group
    exporter_phase: float = 0.0       # second at which each clock first ticks (0 <= phase < its interval)
    scrape_phase: float = 0.0
    evaluation_phase: float = 0.0

    def with_phases(self, seed: int) -> Timing:
        rng = random.Random(f"phases-{seed}")
        return replace(self, exporter_phase=float(rng.randrange(int(self.exporter.interval))),
                       scrape_phase=float(rng.randrange(int(self.scrape_interval))),
                       evaluation_phase=float(rng.randrange(int(self.evaluation_interval))))


def shipped() -> Timing:
    rules = RuleSettings()
    return Timing("shipped defaults", ExporterSettings(), RemediatorSettings(), seconds(rules.stall_for),
                  seconds(rules.down_for), restart_route_group_wait(),
                  scrape_interval=seconds(exporter_scrape_interval()),
                  evaluation_interval=seconds(rules.restart_evaluation_interval))


def before_issue_25() -> Timing:
    return Timing("before (stall_after floor for every engine, for: 1m, group_wait 10s, verify 3 x 10 s without "
                  "the exporter's evidence, the exporter scraped and the alerts evaluated every 15 s)",
                  ExporterSettings(stall_floor=ExporterSettings().stall_after),
                  RemediatorSettings(verify_readings=3, verify_interval=10.0),
                  stall_for=60.0, down_for=seconds(RuleSettings().down_for), group_wait=10.0, evidence=False)


@dataclass
class Path:
    """When one stall passed each step (simulated seconds; None: not reached)."""
    at: dict[str, float] = field(default_factory=dict)
    alert: str = ""                   # the first alert delivered for it: LLMBackendStalled or LLMBackendDown
    work: bool = True                 # the engine had requests in flight when it froze

    def mark(self, step: str, t: float) -> None:
        self.at.setdefault(step, t)

    def parts(self) -> dict[str, float | str | None]:
        out: dict[str, float | str | None] = {"alert": self.alert, "work": "yes" if self.work else "no"}
        for a, b in zip(STEPS, STEPS[1:], strict=False):
            out[f"{a} -> {b}"] = (self.at[b] - self.at[a]) if a in self.at and b in self.at else None
        out["frozen -> restarted"] = (self.at["restarted"] - self.at["frozen"]) if "restarted" in self.at else None
        return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(paths: list[dict[str, float | str | None]]) -> dict[str, dict[str, float | int]]:
    """p50/p95/max of each part over the stalls that reached both of its ends."""
    out: dict[str, dict[str, float | int]] = {}
    for part in (*PARTS, "frozen -> restarted"):
        vals = [float(v) for p in paths if isinstance(v := p.get(part), (int, float))]
        if vals:
            out[part] = {"n": len(vals), "p50": percentile(vals, 50), "p95": percentile(vals, 95), "max": max(vals)}
    return out
