"""exporter/reload.py: what a reload applies and what it refuses; the scheduler keeps unchanged members."""

from __future__ import annotations

from dataclasses import replace

from llm_health.config import Backend, Config, ConfigError, DiscoverySettings, ExporterSettings, Proxy
from llm_health.exporter.reload import Reloader, restart_only_changes
from llm_health.exporter.scheduler import ReadScheduler
from llm_health.reload import fleet_change

A, B = Backend("a", "http://127.0.0.1:1"), Backend("b", "http://127.0.0.1:2")
LB = Proxy("lb", "http://127.0.0.1:3")


def config(*backends: Backend, proxies: tuple[Proxy, ...] = (), **exporter: object) -> Config:
    return Config(backends=backends, proxies=proxies, exporter=replace(ExporterSettings(), **exporter))


def test_thresholds_are_live_the_rest_takes_a_restart() -> None:
    old = config(A)
    assert restart_only_changes(old, config(A, B, stall_after=300, down_after=5, probe_every=60), "", "") == []
    changed = restart_only_changes(old, config(A, interval=30, listen="127.0.0.1:1", read_timeout=1), "", "")
    assert changed == ["exporter.listen", "exporter.interval", "exporter.read_timeout"]
    assert restart_only_changes(old, old, "k1", "k2") == ["the key in exporter.api_key_file"]
    discovering = replace(old, discovery=DiscoverySettings(prometheus_url="http://127.0.0.1:9090"))
    assert restart_only_changes(old, discovering, "", "") == ["discovery"]


def test_fleet_change_names_what_moves() -> None:
    moved = Backend("a", "http://127.0.0.1:9")
    assert fleet_change(config(A), config(moved, B, proxies=(LB,))) == "+b +lb ~a"
    assert fleet_change(config(A, B), config(B)) == "-a"
    assert fleet_change(config(A), config(A)) == ""


class Loads:
    def __init__(self, *results: Config | Exception) -> None:
        self.results = list(results)

    def __call__(self) -> Config:
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


def test_a_refused_reload_applies_nothing_and_keeps_the_last_success_time() -> None:
    applied: list[Config] = []
    now = iter([100.0, 200.0, 300.0, 400.0])
    load = Loads(config(A, B), ConfigError("x.yml: not valid YAML"), config(A, interval=1), config(B))
    r = Reloader(load, applied.append, config(A), key_of=lambda _c: "", clock=lambda: next(now))
    assert r.status.ok and r.status.success_at == 100.0
    assert r.reload().ok and r.status.success_at == 200.0 and applied == [config(A, B)]
    bad = r.reload()
    assert not bad.ok and bad.success_at == 200.0 and "not valid YAML" in bad.error and len(applied) == 1
    restart = r.reload()
    assert not restart.ok and "exporter.interval changed, which only a restart applies" in restart.error
    assert len(applied) == 1 and r.config == config(A, B)
    assert r.reload().ok and applied[-1] == config(B) and r.status.reloads == 4


def test_scheduler_keeps_unchanged_proxies_and_takes_new_thresholds() -> None:
    fleet = ReadScheduler([A], [LB], ExporterSettings(read_timeout=0.2))
    try:
        before = fleet._proxies["lb"]
        fleet.set_proxies([LB, Proxy("lb2", "http://127.0.0.1:4")])
        assert fleet._proxies["lb"] is before and set(fleet._proxies) == {"lb", "lb2"}
        fleet.set_proxies([Proxy("lb", "http://127.0.0.1:5")])
        assert set(fleet._proxies) == {"lb"} and fleet._proxies["lb"] is not before    # moved: afresh
        fleet.update_settings(ExporterSettings(read_timeout=0.2, stall_after=500, probe_model="m"))
        assert fleet.thresholds.stall_after == 500 and fleet.backends[0].prober.configured == "m"
    finally:
        fleet.close()
