"""SIGHUP: read the config file again (with the same command-line flags) and apply it to the running fleet.

What a reload applies:

* backends and proxies added, removed or moved (`ReadScheduler.set_backends` / `set_proxies`): one whose name
  and URL are unchanged keeps everything it has (verdict, history, counters, schedule), a new one starts as
  `unknown` until read, a removed one is forgotten;
* the thresholds (LIVE_SETTINGS: stall_after, stall_floor, stall_ceiling, down_after, probe_every,
  probe_model).

What it refuses: a file that does not load (YAML, a bad key or value, a missing api key file: the same
checks as at start), and a change to a setting only a restart applies (listen, interval, the timeouts,
max_reads_per_endpoint, the api key, discovery). A refused reload changes nothing: the running
configuration stays, the log says why, and `llm_health_exporter_config_last_reload_successful` is 0
until a reload works (llm_health/reload.py; alert LLMHealthExporterConfigReloadFailed).

With discovery on, the names of static backends removed by a reload stay reserved for discovery until
a restart (a discovered target of that name is refused as clashing, never taken for the old backend).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import fields

from llm_health.config import Config, ConfigError, ExporterSettings
from llm_health.reload import ReloadStatus, fleet_change

log = logging.getLogger("llm_health.exporter")

LIVE_SETTINGS = frozenset({"stall_after", "stall_floor", "stall_ceiling", "down_after", "probe_every", "probe_model"})


def restart_only_changes(old: Config, new: Config, old_key: str, new_key: str) -> list[str]:
    """The settings that differ between the running and the new config and take a restart."""
    changed = [f"exporter.{f.name}" for f in fields(ExporterSettings)
               if f.name not in LIVE_SETTINGS and getattr(old.exporter, f.name) != getattr(new.exporter, f.name)]
    if old_key != new_key and "exporter.api_key_file" not in changed:
        changed.append("the key in exporter.api_key_file")
    if old.discovery != new.discovery:
        changed.append("discovery")
    return changed


class Reloader:
    """Loads the config again on request and applies it, one reload at a time."""

    def __init__(self, load: Callable[[], Config], apply: Callable[[Config], None], current: Config,
                 key_of: Callable[[Config], str], clock: Callable[[], float] = time.time) -> None:
        self._load = load
        self._apply = apply
        self._key_of = key_of
        self.config = current
        self._key = key_of(current)
        self._clock = clock
        self._lock = threading.Lock()
        self.status = ReloadStatus.loaded(clock())

    def reload(self) -> ReloadStatus:
        with self._lock:
            try:
                new = self._load()
                key = self._key_of(new)
            except ConfigError as exc:
                return self._failed(str(exc))
            changed = restart_only_changes(self.config, new, self._key, key)
            if changed:
                return self._failed(f"{', '.join(changed)} changed, which only a restart applies")
            change = fleet_change(self.config, new)
            self._apply(new)
            self.config = new
            self.status = self.status.succeeded(self._clock())
            log.info("config reloaded: %d backend(s), %d proxy(ies)%s", len(new.backends), len(new.proxies),
                     f" ({change})" if change else ", none added or removed")
            return self.status

    def _failed(self, why: str) -> ReloadStatus:
        self.status = self.status.failed(why)
        log.error("config reload failed, the running configuration stays: %s", why)
        return self.status

    def serve(self, wanted: threading.Event, stop: threading.Event) -> None:
        """Reload whenever `wanted` is set (the SIGHUP handler only sets it) until `stop`."""
        while not stop.is_set():
            if wanted.wait(0.5):
                wanted.clear()
                self.reload()
