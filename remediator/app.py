"""The Flask application factory: it wires, it runs nothing (services.py; Flask's tutorial `create_app`).

The webhook only validates and records (one short transaction) and answers 2xx; the authority does the
work. Every reader (API, /metrics, status page) reads the store, so all gunicorn workers agree. The HTTP
side is split by concern under remediator/web/.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from flask import Flask
from werkzeug.exceptions import HTTPException

from llm_health.config import Config
from llm_health.reload import ReloadStatus
from llm_health.remediator import discovered
from llm_health.remediator.agent import AgentAnswers, AgentListener
from llm_health.remediator.authority import Authority
from llm_health.remediator.backend_io import Verifier, WarmupCheck
from llm_health.remediator.retention import Pruner
from llm_health.remediator.runbooks import runbooks
from llm_health.remediator.services import Services
from llm_health.remediator.store import StateError, StateStore, store_for
from llm_health.remediator.web.api import api
from llm_health.remediator.web.context import WebContext
from llm_health.remediator.web.guard import error
from llm_health.remediator.web.rollouts import rollouts
from llm_health.remediator.web.status import status
from llm_health.remediator.web.tokens import check_exposure, read_token
from llm_health.remediator.web.webhook import webhook

log = logging.getLogger(__name__)


def create_app(
    config: Config,
    *,
    verifier: Verifier | None = None,
    warmup_check: WarmupCheck | None = None,
    clock: Callable[[], float] = time.time,
    with_authority: bool = True,
    expect_state: tuple[int, int] | None = None,
    token: str | None = None,
    reload_status: ReloadStatus | None = None,
) -> Flask:
    """The app, its store and its services (not started: `app.extensions['remediator'].services.start()`).

    `with_authority=False`: no authority, pruner or agent listener (tests build their own authority).
    `expect_state`: (device, inode) of the state file the server opened before forking workers; a
    worker then only opens that very file (never creates one) and refuses any other. `token`: the one the
    server's master read (None: read it here). `reload_status`: the master's last config (re)load, for
    /metrics (None: loaded now)."""
    token = read_token(config) if token is None else token
    check_exposure(config, token)
    store = store_for(config, expect=expect_state)
    if expect_state is None:
        store.init()
    else:
        store.open()   # the file the server's master created and checked, never a new one
    config, discovery = discovered.attach(config, store, clock)   # backends: static + discovered (if on)
    services = build_services(config, store, clock, discovery, verifier, warmup_check) if with_authority \
        else Services(discovery=discovery)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.remediator.max_body_bytes
    app.extensions["remediator"] = WebContext(config, store, token, clock, services,
                                              reload_status or ReloadStatus.loaded(clock()))
    for blueprint in (webhook, api, rollouts, status, runbooks):
        app.register_blueprint(blueprint)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        return error(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(StateError)
    def state_error(exc: StateError) -> Any:
        log.error("%s", exc)
        return error(503, str(exc))

    return app


def build_services(config: Config, store: StateStore, clock: Callable[[], float], discovery: Any,
                   verifier: Verifier | None = None, warmup_check: WarmupCheck | None = None) -> Services:
    """This worker's authority, pruner and agent listener, built and not started."""
    listen = config.remediator.agent_listen
    return Services(
        discovery=discovery,
        authority=Authority(store, config, verifier=verifier, warmup_check=warmup_check, clock=clock),
        pruner=Pruner(store, config, clock),
        agent=AgentListener(listen, AgentAnswers(store, config).status_for) if listen else None,
    )
