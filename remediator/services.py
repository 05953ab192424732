"""A worker's background services: built by the app factory, started by the server, never by the factory.

`create_app()` (app.py) only wires: it builds the store, the live fleet and these services, and returns the
Flask app; nothing runs yet, no thread, no listener, no query to Prometheus. The server entry point starts
them: under gunicorn `post_worker_init` (cli.py), which gunicorn calls in each worker once its app is
loaded and before the worker accepts a request. Tests build the app the same way and start what they need.

Started in this order: service discovery (one refresh first, so discovered backends are known before the
first webhook, then its refresher thread), the authority (lease thread, scheduler: resync + workers),
retention (the pruner) and the HAProxy agent-check listener (it retries until it holds the port: one of
the workers gets it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_health.discovery import Discovery
from llm_health.remediator.agent import AgentListener
from llm_health.remediator.authority import Authority
from llm_health.remediator.retention import Pruner


@dataclass
class Services:
    discovery: Discovery | None = None
    authority: Authority | None = None
    pruner: Pruner | None = None
    agent: AgentListener | None = None
    started: bool = False

    def running_order(self) -> list[Any]:
        """The services there are, in the order they start (they stop in the reverse order)."""
        return [part for part in (self.discovery, self.authority, self.pruner, self.agent) if part is not None]

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        if self.discovery is not None:
            self.discovery.refresh()          # before the first webhook: discovered backends are known
        for part in self.running_order():
            part.start()

    def stop(self) -> None:
        """For tests and tools; the server's workers simply exit (every thread is a daemon)."""
        for part in reversed(self.running_order()):
            part.stop()
