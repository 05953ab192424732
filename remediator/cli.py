"""`llm-health remediator --config FILE [--listen HOST:PORT] [--workers N] [--dry-run]`.

Serves `remediator.app.create_app` under gunicorn. The app is built in each worker after the fork
(no preload), so each worker has its own authority thread; the SQLite lease makes one of them act.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from gunicorn.app.base import BaseApplication
from llm_health.remediator.app import create_app, read_token
from llm_health.remediator.authority import state_path
from llm_health.remediator.store import StateError, Store

from llm_health.config import Config, ConfigError, load_config


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="llm-health YAML config")
    parser.add_argument("--listen", help="HOST:PORT (default: remediator.listen)")
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: remediator.workers)")
    parser.add_argument("--dry-run", action="store_true", help="record 'would restart', execute nothing")


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
    return dataclasses.replace(config, remediator=dataclasses.replace(r, **changes))


class RemediatorServer(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: Config) -> None:
        self.llm_config = config
        super().__init__()

    def load_config(self) -> None:
        r = self.llm_config.remediator
        self.cfg.set("bind", [r.listen])
        self.cfg.set("workers", max(1, r.workers))
        self.cfg.set("worker_class", "gthread")
        self.cfg.set("threads", 4)
        self.cfg.set("timeout", 60)
        self.cfg.set("graceful_timeout", 10)
        self.cfg.set("preload_app", False)
        self.cfg.set("accesslog", "-")
        self.cfg.set("proc_name", "llm-health-remediator")

    def load(self) -> Any:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(message)s")
        return create_app(self.llm_config)


def run(args: argparse.Namespace) -> int:
    config = apply_flags(load_config(args.config), args)
    read_token(config)  # fail before forking when the token file is unusable
    store = Store(state_path(config))
    try:
        store.init()
    except StateError as exc:
        raise ConfigError(str(exc)) from exc
    finally:
        store.close()
    RemediatorServer(config).run()
    return 0
