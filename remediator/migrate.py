"""`llm-health remediator migrate --from SQLITE_FILE --config FILE`: copy an existing SQLite state into the
PostgreSQL database the config's `remediator.state` names (moving to the HA setup, docs/ha.md).

Stop the remediator first and back the file up. The file is only read; the database must hold no
llm-health state yet; the copy is all or nothing (remediator/store/transfer.py). Exit 0 with a summary per
table; exit 2 with one line (no traceback, never a password) on anything refused or unreachable.
"""

from __future__ import annotations

import argparse
import logging
import sys

from llm_health.config import ConfigError, is_database_url, load_config
from llm_health.remediator.store import StateError, store_for

HELP = "copy a SQLite state file into the PostgreSQL database of remediator.state (stop the remediator first)"


def add_subcommand(parser: argparse.ArgumentParser) -> None:
    """`migrate` under `llm-health remediator` (remediator/cli.py); without it, the command serves."""
    sub = parser.add_subparsers(dest="remediator_command", metavar="{migrate}")
    p = sub.add_parser("migrate", help=HELP, description=HELP)
    configure(p)
    p.set_defaults(_run=run)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", required=True, metavar="SQLITE_FILE",
                        help="the SQLite state file to copy (the old remediator.state; stop the remediator first)")
    parser.add_argument("--config", required=True,
                        help="llm-health YAML config whose remediator.state is the postgresql:// target")


def run(args: argparse.Namespace) -> int:
    # The pool's own retry warnings ("error connecting in 'llm-health': ...", one per attempt) would reach the
    # terminal through logging's last-resort handler: the one line below says what failed, once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    config = load_config(args.config)
    if not is_database_url(config.remediator.state):
        raise ConfigError(f"remediator.state in {args.config} is {config.remediator.state!r}, not a postgresql:// "
                          "URL: set it to the target database")
    try:
        from llm_health.remediator.store.postgresql import PostgresStore
        from llm_health.remediator.store.transfer import copy_state
    except ImportError as exc:
        raise ConfigError(f"psycopg is not installed ({exc}): pip install 'llm-health[postgresql]'") from exc
    try:
        target = store_for(config)
        if not isinstance(target, PostgresStore):      # is_database_url() said it is one
            raise ConfigError(f"remediator.state in {args.config} does not name a PostgreSQL database")
        try:
            counts = copy_state(args.source, target)
        finally:
            target.close()
    except StateError as exc:
        raise ConfigError(str(exc)) from exc
    print(summary(args.source, target.where, counts), file=sys.stdout)
    return 0


def summary(source: str, where: str, counts: dict[str, int]) -> str:
    width = max(map(len, counts), default=0)
    lines = [f"copied {sum(counts.values())} rows from {source} to {where} (one transaction):"]
    lines += [f"  {name:<{width}}  {n}" for name, n in counts.items()]
    lines.append("next: set remediator.state to this URL everywhere (it is already in the config you gave), "
                 "start the remediators; the first one takes the lease with a new epoch")
    return "\n".join(lines)
