"""Run a backend's configured restart argv: no shell, a timeout, exit code and (truncated) output.

The argv comes only from the configuration. The child gets the backend name and incident id as
environment variables (an idempotency key for the action), never anything from an alert.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

OUTPUT_LIMIT = 4000

OK = "ok"
FAILED = "failed"      # ran and exited non-zero, or could not start: the restart did not happen
TIMEOUT = "timeout"    # killed after the timeout: outcome unknown, never retried blindly


@dataclass(frozen=True)
class ActionResult:
    result: str
    exit_code: int | None
    output: str

    @property
    def outcome_unknown(self) -> bool:
        return self.result == TIMEOUT


def _truncate(data: bytes) -> str:
    text = data.decode(errors="replace")
    if len(text) <= OUTPUT_LIMIT:
        return text
    return text[: OUTPUT_LIMIT // 2] + "\n...[truncated]...\n" + text[-OUTPUT_LIMIT // 2:]


def run_action(argv: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> ActionResult:
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        proc = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, start_new_session=True, shell=False,
        )
    except OSError as exc:
        return ActionResult(FAILED, None, f"cannot start {argv[0]!r}: {exc.strerror or exc}")
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return ActionResult(TIMEOUT, None, _truncate(out or b"") + f"\n[killed after {timeout:g}s timeout]")
    code = proc.returncode
    return ActionResult(OK if code == 0 else FAILED, code, _truncate(out or b""))
