"""`llm-health remediator --config FILE [--listen HOST:PORT] [--workers N] [--dry-run]`.

Serves `remediator.app.create_app` under gunicorn. The app is built in each worker after the fork
(no preload), and the worker's services (its authority, retention, the agent-check listener, service
discovery; remediator/services.py) are started by gunicorn's `post_worker_init` hook: in each worker,
once its app is loaded and before it accepts a request. create_app() itself starts nothing. Every worker
has its own authority; the lease in the store makes one of them act.

SIGHUP (`systemctl reload`): gunicorn's reload, which reads our config file again (remediator/reload.py).
`llm-health remediator migrate --from FILE --config FILE`: a SQLite state into PostgreSQL (remediator/migrate.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication

from llm_health import logs
from llm_health.config import Config, ConfigError, load_config
from llm_health.logs import LogLevel
from llm_health.reload import ReloadStatus, fleet_change
from llm_health.remediator import migrate
from llm_health.remediator.app import create_app
from llm_health.remediator.buffering import ServingLimits
from llm_health.remediator.gunicorn_log import RootLogger
from llm_health.remediator.reload import reloaded
from llm_health.remediator.serving import CONNECTIONS_BEYOND_PENDING, GuardedThreadWorker
from llm_health.remediator.store import StateError, store_for
from llm_health.remediator.web.tokens import check_exposure, read_token, token_file_warning

log = logging.getLogger("llm_health.remediator")
#: --log-format text: as before, with the process id (gunicorn's master and each worker log)
TEXT_FORMAT = "%(asctime)s %(process)d %(levelname)s %(message)s"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="llm-health YAML config (required)")   # not required=True: `migrate` has its own
    parser.add_argument("--listen", help="HOST:PORT (default: remediator.listen)")
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: remediator.workers)")
    parser.add_argument("--dry-run", action="store_true", help="record 'would restart', execute nothing")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="serve without remediator.token_file (only with a loopback --listen; local trials)")
    logs.add_arguments(parser)
    migrate.add_subcommand(parser)


def apply_flags(config: Config, args: argparse.Namespace) -> Config:
    r = config.remediator
    changes: dict[str, Any] = {}
    if args.listen:
        host, sep, port = args.listen.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"--listen: expected HOST:PORT, got {args.listen!r}")
        changes["listen"] = args.listen
    if args.workers is not None:
        if args.workers < 1:
            raise ConfigError("--workers: must be at least 1")
        changes["workers"] = args.workers
    if args.dry_run:
        changes["dry_run"] = True
    if getattr(args, "insecure_no_auth", False):
        changes["insecure_no_auth"] = True
    return dataclasses.replace(config, remediator=dataclasses.replace(r, **changes))


class RemediatorServer(BaseApplication):  # type: ignore[misc]
    """gunicorn's application. `reread`: how SIGHUP reads the config again (the file and the same flags);
    None: a HUP only replaces the workers. `token`: read by the master, handed to every worker."""

    def __init__(self, config: Config, state_identity: tuple[int, int] | None = None,
                 log_level: LogLevel = LogLevel.INFO, reread: Callable[[], Config] | None = None,
                 token: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.llm_config = config
        self.state_identity = state_identity
        self.log_level = log_level
        self.reread = reread
        self.token = token
        self.clock = clock
        self.reload_status = ReloadStatus.loaded(clock())
        self._loaded = False
        super().__init__()

    def reload_llm_config(self) -> None:
        """gunicorn's HUP, in the master: the config again, or the running one with the reason logged."""
        assert self.reread is not None
        try:
            new, token = reloaded(self.reread, self.llm_config)
        except ConfigError as exc:
            self.reload_status = self.reload_status.failed(str(exc))
            log.error("config reload failed, the running configuration stays: %s", exc)
            return
        warning = token_file_warning(new)
        if warning:
            log.warning("llm-health remediator: %s", warning)
        change = fleet_change(self.llm_config, new)
        self.llm_config, self.token = new, token
        self.reload_status = self.reload_status.succeeded(self.clock())
        log.info("config reloaded: %d backend(s)%s; new workers start with it", len(tuple(new.backends)),
                 f" ({change})" if change else ", none added or removed")

    def load_config(self) -> None:
        if self._loaded and self.reread is not None:
            self.reload_llm_config()
        self._loaded = True
        r = self.llm_config.remediator
        GuardedThreadWorker.limits = ServingLimits(
            request_timeout=r.request_timeout, idle_timeout=r.idle_timeout, max_header_bytes=r.max_header_bytes,
            max_body_bytes=r.max_body_bytes, max_pending_connections=r.max_pending_connections,
            max_pending_per_peer=r.max_pending_per_peer)
        self.cfg.set("bind", [r.listen])
        self.cfg.set("workers", max(1, r.workers))
        self.cfg.set("worker_class", GuardedThreadWorker)
        self.cfg.set("threads", max(1, r.threads))
        self.cfg.set("worker_connections", r.max_pending_connections + CONNECTIONS_BEYOND_PENDING)
        self.cfg.set("keepalive", max(1, math.ceil(r.idle_timeout)))   # gunicorn: whole seconds
        # gunicorn >= 25.1 opens a control socket ($XDG_RUNTIME_DIR/gunicorn.ctl or ~/.gunicorn/) by default:
        # a second way to manage this server, and a file outside our state. Off.
        self.cfg.set("control_socket_disable", True)
        self.cfg.set("timeout", 60)
        self.cfg.set("graceful_timeout", 10)
        self.cfg.set("preload_app", False)
        # gunicorn's lines (its own and one per request) through our root handler, in --log-format, redacted;
        # none for scrapes of /metrics and /healthz probes (remediator/gunicorn_log.py)
        self.cfg.set("logger_class", RootLogger)
        self.cfg.set("loglevel", self.log_level.value)
        self.cfg.set("accesslog", "-")
        self.cfg.set("proc_name", "llm-health-remediator")
        self.cfg.set("post_worker_init", start_services)

    def load(self) -> Any:
        # logging: the root handler set up before the fork (run()), inherited by every worker
        return create_app(self.llm_config, expect_state=self.state_identity, token=self.token,
                          reload_status=self.reload_status)


def start_services(worker: Any) -> None:
    """gunicorn's post_worker_init: this worker's app is loaded (`worker.wsgi`) and it accepts nothing yet.
    Then what the worker built to serve is set aside from the garbage collector (gc.freeze): a full collection
    walked every object of the app, the store and the authority, a pause of about 20 ms (measured in-process
    at 63 000 objects; 3.6 ms the slowest request with them frozen), and a worker paused inside its turn on
    the state's write lock holds every other writer of the storm for that long. Objects made later, per
    request, are collected as before; the set-aside ones live as long as the worker anyway."""
    services = worker.wsgi.extensions["remediator"].services
    services.start()
    if services.authority is not None:     # the authority's worker leaves new connections to the others (serving.py)
        worker.leads = services.authority.lease.holding.is_set
    gc.freeze()


def run(args: argparse.Namespace) -> int:
    if not args.config:
        raise ConfigError("--config: required")
    logs.setup(args.log_format, args.log_level, stream=sys.stderr, text_format=TEXT_FORMAT, with_pid=True)
    config = apply_flags(load_config(args.config), args)
    token = read_token(config)
    check_exposure(config, token)  # fail before forking when the token is unusable or missing
    warning = token_file_warning(config)
    if warning:
        log.warning("llm-health remediator: %s", warning)
    store = store_for(config)
    try:
        store.init()   # creates the file on first start, checks its integrity
    except StateError as exc:
        raise ConfigError(str(exc)) from exc
    finally:
        store.close()
    # workers open exactly this file: never a new one created behind the first one's back
    RemediatorServer(config, store.identity, log_level=args.log_level, token=token,
                     reread=lambda: apply_flags(load_config(args.config), args)).run()
    return 0
