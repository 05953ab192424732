"""A truthful /healthz: this worker can do its job right now.

Unhealthy (503, with the reasons) when
* the state file is not the file this remediator opened (deleted or replaced: the store stops),
* a small committed write fails (disk full, read-only file system, locked or damaged database),
* the store's own integrity check fails (cached for `INTEGRITY_EVERY` seconds; it reads every page),
* the authority loop has not finished a pass for `remediator.health_stale_after` seconds, unless
  a restart action of this worker is running and still inside `action_timeout` (the loop waits for it),
* a worker has been on one key (a backend's look) for longer than any look can take with the settings
  (`Authority.look_bound`: every I/O of a look at its deadline, plus the action when it runs): the
  answer names the key. The resync thread never blocks, so its pass alone cannot see stuck workers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from llm_health.config import Config
from llm_health.remediator.authority import Authority
from llm_health.remediator.store import StateError, StateStore

INTEGRITY_EVERY = 30.0


class Health:
    def __init__(self, config: Config, store: StateStore, authority: Authority | None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.store = store
        self.authority = authority
        self.monotonic = monotonic
        self.worker = f"{os.getpid()}"
        self._lock = threading.Lock()
        self._integrity: tuple[float, str] | None = None

    def integrity(self) -> str:
        with self._lock:
            now = self.monotonic()
            if self._integrity is None or now - self._integrity[0] > INTEGRITY_EVERY:
                self._integrity = (now, self.store.integrity_problem())
            return self._integrity[1]

    def loop_problem(self) -> str:
        a = self.authority
        if a is None:
            return ""
        r = self.config.remediator
        age = self.monotonic() - a.last_pass
        if age <= r.health_stale_after:
            return ""
        try:
            running = self.store.latest_unfinished_start(a.holder)
        except StateError as exc:
            return str(exc)
        if running is not None and a.clock() - float(running) <= r.action_timeout + r.health_stale_after:
            return ""
        return (f"the authority loop has not finished a pass for {age:.0f}s "
                f"(remediator.health_stale_after {r.health_stale_after:g}s): blocked or dead")

    def stuck_problem(self) -> str:
        """A worker that has had one key for longer than any look can take with these settings."""
        a = self.authority
        if a is None:
            return ""
        stuck = a.stuck_looks()
        if not stuck:
            return ""
        key, age = max(stuck.items(), key=lambda kv: kv[1])
        return (f"a worker has been looking at {key!r} for {age:.0f}s, longer than any look can take with "
                f"these settings ({a.look_bound(key in a.ctx.running.backends()):.0f}s): stuck"
                + (f" ({len(stuck)} keys stuck)" if len(stuck) > 1 else ""))

    def report(self) -> dict[str, Any]:
        problems = []
        why = self.store.check_identity()
        if why:
            problems.append(why)
        else:
            for problem in (self.store.write_problem(self.worker), self.integrity(), self.loop_problem(),
                            self.stuck_problem()):
                if problem:
                    problems.append(problem)
        out: dict[str, Any] = {"ok": not problems, "worker": self.worker}
        if problems:
            out["problems"] = problems
        if self.authority is not None:
            out["authority_loop_age_seconds"] = round(self.monotonic() - self.authority.last_pass, 1)
            out["holds_lease"] = self.authority.lease.holding.is_set()
            out["holder"] = self.authority.lease.holder
            out["epoch"] = self.authority.lease.epoch          # the term it holds or held last (0: none yet)
            looks = self.authority.scheduler.queue.processing_for()
            out["oldest_look_seconds"] = round(max(looks.values(), default=0.0), 1)
            out["stuck_looks"] = len(self.authority.stuck_looks())
        return out
