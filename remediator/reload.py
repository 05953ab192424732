"""SIGHUP to the remediator (gunicorn's master; `systemctl reload`): read the config file again.

gunicorn answers HUP by loading its configuration again, starting new workers with it and stopping the
old ones gracefully (remediator/cli.py `RemediatorServer.load_config` is where our file is read again,
with the same command-line flags). Each new worker builds its app from the new config: backends added or
removed, the policy, timeouts, discovery, the listen address (gunicorn moves the listener), the number
of workers. Everything that matters lives in the state file, which the new workers open: incidents,
restart history, budgets, markers, the audit log go on. A restart action running in an old worker keeps
running in its own process; its outcome is collected from its status file by whichever worker holds the
lease next, as after a worker crash.

A reload is refused, and the running config stays, when the file does not load (the same checks as at
start), when the token file cannot be read (a remediator must never lose its token on a reload), or when
`remediator.state` names another file (the state file is opened once, at start: moving it takes a
restart). gunicorn replaces the workers all the same, with the running config and token. The master keeps
the outcome: `llm_health_remediator_config_last_reload_successful` (and the time of the last load that
worked) on every worker's /metrics, since every worker is forked after it.
"""

from __future__ import annotations

from collections.abc import Callable

from llm_health.config import Config, ConfigError
from llm_health.remediator.store import state_where
from llm_health.remediator.web.tokens import check_exposure, read_token


def reloaded(load: Callable[[], Config], running: Config) -> tuple[Config, str]:
    """The new config and its token, or ConfigError saying why the running config stays."""
    new = load()
    token = read_token(new)
    check_exposure(new, token)
    before, after = state_where(running), state_where(new)
    if before != after:
        raise ConfigError(f"remediator.state changed ({before} -> {after}): the state is opened once, at "
                          "start; moving it takes a restart")
    return new, token
