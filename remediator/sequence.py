"""A restart in three steps, for backends that need headroom before a start: stop -> wait for headroom -> start.

After a crash an engine process can stay behind holding the GPU's memory (vLLM's EngineCore stuck in R
state, immune to kill -9, until a reboot); a new server started then fails with out-of-memory and lands in
ERROR, again and again. A backend configured with `stop`, `start` and `headroom` argvs is restarted by
this program instead of one `restart` argv: it runs `stop`, then polls `headroom` (e.g. a script asking
`nvidia-smi` for the processes and free memory of the backend's GPUs; exit 0 = room for a new server)
every `--poll` seconds, each run bounded by `--check-timeout`, for at most `--wait` seconds, and runs
`start` only once headroom passed. When it never passes it exits HEADROOM_EXIT without starting
anything: the authority puts the backend in ERROR, escalates ("host needs attention": the old process did
not go away) and waits for a person, instead of a restart loop.

It runs as the argv of the action wrapper (remediator/action.py), so its exit status survives a crash of
the remediator like any restart's. Arguments come only from the configuration (no shell).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence

from llm_health.config import Backend, RemediatorSettings

HEADROOM_EXIT = 75        # EX_TEMPFAIL: headroom never passed, nothing was started


def has_restart(backend: Backend) -> bool:
    """A restart action is configured: one `restart` argv, or `stop` and `start`."""
    return bool(backend.restart or backend.start)


def restart_argv(backend: Backend, r: RemediatorSettings, command: Sequence[str] | None = None) -> tuple[str, ...]:
    """What the action wrapper runs to restart `backend`. `command`: the backend's stored command (a
    rollout set it, remediator/rollout/): it takes the place of `restart`, or of `start` for a backend
    restarted in three steps (the stop and the headroom check still come first)."""
    if not backend.start:
        return tuple(command) if command else backend.restart
    start = list(command) if command else list(backend.start)
    steps = {"stop": list(backend.stop), "headroom": list(backend.headroom), "start": start}
    return (sys.executable, "-m", "llm_health.remediator.sequence", "--wait", f"{r.headroom_wait:g}",
            "--poll", f"{r.headroom_poll:g}", "--check-timeout", f"{r.headroom_timeout:g}", json.dumps(steps))


def say(text: str) -> None:
    print(f"[llm-health sequence] {text}", flush=True)


def run_step(argv: Sequence[str], timeout: float | None = None) -> int:
    """Run one argv (output to ours, which the wrapper keeps); its exit code, 124 on timeout."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        say(f"cannot start {argv[0]!r}: {exc.strerror or exc}")
        return 127
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        say(f"{argv[0]!r} killed after {timeout:g}s")
        return 124


def main(args: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llm_health.remediator.sequence")
    p.add_argument("--wait", type=float, required=True)
    p.add_argument("--poll", type=float, required=True)
    p.add_argument("--check-timeout", type=float, required=True)
    p.add_argument("steps", help='JSON {"stop": argv, "headroom": argv, "start": argv}')
    ns = p.parse_args(args)
    steps = json.loads(ns.steps)
    if steps.get("stop"):
        code = run_step(steps["stop"])
        if code != 0:
            say(f"stop exited {code}: not starting")
            return code or 1
    if steps.get("headroom"):
        deadline = time.monotonic() + ns.wait
        tries = 0
        while True:
            tries += 1
            code = run_step(steps["headroom"], ns.check_timeout)
            if code == 0:
                say(f"headroom passed (check {tries})")
                break
            if time.monotonic() + ns.poll > deadline:
                say(f"HEADROOM NEVER PASSED: {tries} checks in {ns.wait:g}s, the last exited {code}: the old "
                    "process did not go away or its memory is still held; not starting (host needs attention)")
                return HEADROOM_EXIT
            time.sleep(ns.poll)
    code = run_step(steps["start"])
    if code != 0:
        say(f"start exited {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
