"""gunicorn's own log lines (gunicorn.error, gunicorn.access) through our one root handler.

gunicorn installs a handler of its own on each of its two loggers, in its own format, and stops them
from propagating. Under `--log-format json` that would mix gunicorn's plain lines ("Booting worker",
every access line) into a JSON log, unredacted. `RootLogger` (gunicorn's `logger_class`) installs
nothing: both loggers propagate to the root logger, where llm_health.logs has put the one handler in the
chosen format (redacted, like every line of ours). The access logger gets the QuietScrapes filter: no
line per Prometheus scrape of /metrics or per /healthz probe (kept at --log-level debug).

The access log itself stays on (`accesslog = "-"`): webhook deliveries, API calls and the status page
are logged, one line each.
"""

from __future__ import annotations

import logging
from typing import Any

from gunicorn import glogging

from llm_health.logs import QuietScrapes


class RootLogger(glogging.Logger):  # type: ignore[misc]
    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        if not any(isinstance(f, QuietScrapes) for f in self.access_log.filters):
            self.access_log.addFilter(QuietScrapes())

    def _set_handler(self, log: logging.Logger, output: Any, fmt: Any, stream: Any = None) -> None:
        """Instead of gunicorn's handler for `log`: none, and propagate to the root logger."""
        own = self._get_gunicorn_handler(log)
        if own is not None:
            log.removeHandler(own)
        log.propagate = True
