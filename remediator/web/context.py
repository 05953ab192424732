"""What the request handlers need, kept in `app.extensions['remediator']` (Flask's place for per-app state)."""

from __future__ import annotations

from collections.abc import Callable

from flask import current_app

from llm_health.config import Config
from llm_health.discovery.collector import DiscoveryCollector
from llm_health.reload import ReloadCollector, ReloadStatus
from llm_health.remediator import metrics
from llm_health.remediator.agent import AgentAnswers
from llm_health.remediator.health import Health
from llm_health.remediator.services import Services
from llm_health.remediator.store import StateStore
from llm_health.remediator.store.group import GroupCommit
from llm_health.remediator.web.guard import token_given


class WebContext:
    def __init__(self, config: Config, store: StateStore, token: str, clock: Callable[[], float],
                 services: Services, reload_status: ReloadStatus | None = None) -> None:
        self.config = config
        self.store = store
        self.writes = GroupCommit(store)   # the webhook's notifications of one moment: one transaction
        self.token = token
        self.clock = clock
        self.services = services          # built, not started: the server starts them (services.py)
        self.discovery = services.discovery
        self.authority = services.authority
        self.agent = services.agent
        self.health = Health(config, store, services.authority)
        self.answers = AgentAnswers(store, config)   # who takes traffic: the agent's rule, for readiness too
        self.registry = metrics.registry_for(config, store, self.health.report)
        if services.discovery is not None:
            self.registry.register(DiscoveryCollector(services.discovery.status))
        self.reload_status = reload_status or ReloadStatus.loaded(clock())   # the master's, at the fork
        self.registry.register(ReloadCollector("llm_health_remediator", lambda: self.reload_status))

    def authenticated(self) -> bool:
        """This request carries the bearer token (restart output is shown to it)."""
        return token_given(self.token)


def ctx() -> WebContext:
    return current_app.extensions["remediator"]
