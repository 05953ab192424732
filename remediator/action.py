"""Run a backend's configured restart argv: no shell, a timeout, exit code and (truncated) output.

The argv comes only from the configuration. The child gets the backend name, incident and action ids
as environment variables (an idempotency key for the action) and the lease's epoch (LLM_HEALTH_EPOCH, a
fencing token a restart script may hand on), never anything from an alert.

How it runs (so that a restart script may start the server in the background, and so that its result
survives a crash of ours):

    authority --waits for the PROCESS--> wrapper (python -m llm_health.remediator.action, own session)
                                          `-> argv (own process group; may leave `nohup server &` behind)

* The wrapper writes its pid to `<key>.pid`, runs the argv, waits for the argv's process to exit
  (waitpid, never its pipes), and writes `<key>.status` (JSON: result, exit code) atomically. On
  `timeout` it kills the argv's process group and records `timeout` (outcome unknown). A child the
  argv left running on purpose is never killed once the argv has exited.
* The status survives a full disk: before the argv starts, the wrapper writes `<key>.status` with a
  placeholder (`running`) of STATUS_SIZE bytes, so its blocks are allocated while there is room. The
  result replaces it atomically (a new file, renamed); when that fails (no block for the new file),
  the result overwrites the placeholder's own bytes in place, which needs no new block. Without it, a
  restart that exited 0 while the disk was full was recorded `interrupted`. (A copy-on-write file
  system, btrfs or ZFS, may need new blocks even for that; ext4, XFS and tmpfs do not.)
* Output goes to `<key>.out`, a FILE, not a pipe: a background child that inherits it holds nobody.
* The wrapper is in its own session: when the authority dies (kill -9, a reload), it carries on,
  enforces the timeout and writes the status, which the next authority collects (`collect`) instead
  of calling the restart "interrupted".
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

OUTPUT_LIMIT = 4000
STATUS_SIZE = 512      # bytes of every status file, placeholder and result alike (JSON padded with spaces)
RUNNING = "running"    # the placeholder's result: no outcome yet
WAIT_GRACE = 10.0      # the wrapper enforces the timeout; we give up on the wrapper only this much later

OK = "ok"
FAILED = "failed"      # ran and exited non-zero, or could not start: the restart did not happen
TIMEOUT = "timeout"    # killed after the timeout: outcome unknown, never retried blindly
UNKNOWN = "unknown"    # the wrapper vanished without a status: outcome unknown, never retried blindly


@dataclass(frozen=True)
class ActionResult:
    result: str
    exit_code: int | None
    output: str

    @property
    def outcome_unknown(self) -> bool:
        return self.result in (TIMEOUT, UNKNOWN)


@dataclass(frozen=True)
class ActionFiles:
    """Where one action's pid, output and exit status go (under the state dir)."""

    folder: Path
    key: str

    @property
    def pid(self) -> Path:
        return self.folder / f"{self.key}.pid"

    @property
    def out(self) -> Path:
        return self.folder / f"{self.key}.out"

    @property
    def status(self) -> Path:
        return self.folder / f"{self.key}.status"

    def remove(self) -> None:
        for p in (self.pid, self.out, self.status):
            p.unlink(missing_ok=True)


def _truncate(data: bytes) -> str:
    text = data.decode(errors="replace")
    if len(text) <= OUTPUT_LIMIT:
        return text
    return text[: OUTPUT_LIMIT // 2] + "\n...[truncated]...\n" + text[-OUTPUT_LIMIT // 2:]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)        # what it took is given back (a full disk)
        raise


def _overwrite_in_place(path: Path, data: bytes) -> None:
    """Write `data` over the bytes an existing file of exactly that size already has: no new block."""
    fd = os.open(path, os.O_WRONLY)
    try:
        if os.fstat(fd).st_size != len(data):
            raise OSError(errno.EINVAL, f"{path} is not a pre-allocated status file of {len(data)} bytes")
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(errno.EIO, f"short write to {path}")
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_output(files: ActionFiles) -> str:
    try:
        with open(files.out, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            head = b""
            if size > OUTPUT_LIMIT * 4:     # a background child may keep writing here: read both ends only
                f.seek(0)
                head = f.read(OUTPUT_LIMIT) + b"\n...\n"
                f.seek(size - OUTPUT_LIMIT * 2)
            else:
                f.seek(0)
            return _truncate(head + f.read())
    except OSError:
        return ""


def _alive_wrapper(pid: int, files: ActionFiles) -> bool:
    """pid is a live wrapper of THIS action (not a recycled pid): its command line names our status file."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(files.status).encode() in cmdline.split(b"\0")     # one whole argument, not a substring


def _read_status(files: ActionFiles) -> tuple[ActionResult | None, str]:
    """(the result in the status file, '') or (None, '') while there is none (no file, the placeholder)
    or (None, why) when it cannot be read (a result being written in place is read half-way too)."""
    try:
        status = json.loads(files.status.read_text())
        if status["result"] == RUNNING:
            return None, ""
        code = status.get("exit_code")
        return ActionResult(str(status["result"]), int(code) if code is not None else None,
                            _read_output(files) + str(status.get("note", ""))), ""
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, repr(exc)


def collect(files: ActionFiles) -> ActionResult | None:
    """The outcome of an action started by (possibly) another process: its result when the wrapper has
    written it; None while the wrapper still runs; UNKNOWN when it is gone without writing one."""
    result, _ = _read_status(files)
    if result is not None:
        return result
    try:
        pid = int(files.pid.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid and _alive_wrapper(pid, files):
        return None
    result, problem = _read_status(files)      # it finished between our two reads
    if result is not None:
        return result
    if problem:
        return ActionResult(UNKNOWN, None, f"unreadable status {files.status}: {problem}")
    return ActionResult(UNKNOWN, None, _read_output(files) + "\n[the action's wrapper is gone without an exit status]")


def run_action(argv: Sequence[str], timeout: float, env: dict[str, str] | None = None, *,
               folder: Path | None = None, key: str = "action") -> ActionResult:
    """Run argv through the wrapper and wait for it (at most timeout + WAIT_GRACE). With a `folder`,
    its files stay there for `collect` by a later authority (removed by the caller once recorded)."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="llm-health-action-") as tmp:
            return run_action(argv, timeout, env, folder=Path(tmp), key=key)
    folder.mkdir(parents=True, exist_ok=True)
    files = ActionFiles(folder, key)
    # files left under this key by an earlier state file (moved away after a failed integrity check,
    # restored from a backup: action ids start again) would be collected as THIS action's result
    files.remove()
    full_env = dict(os.environ)
    full_env.update(env or {})
    wrapper = [sys.executable, "-m", "llm_health.remediator.action", "--timeout", f"{timeout:g}",
               "--pid-file", str(files.pid), "--status", str(files.status), "--", *argv]
    try:
        with open(files.out, "wb") as out:
            proc = subprocess.Popen(wrapper, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=full_env, start_new_session=True, shell=False)
    except OSError as exc:
        return ActionResult(FAILED, None, f"cannot start the action wrapper: {exc.strerror or exc}")
    try:
        proc.wait(timeout=timeout + WAIT_GRACE)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.wait()
    result = collect(files)
    if result is None:       # cannot happen once the wrapper was reaped; say so rather than guess
        result = ActionResult(UNKNOWN, None, "[the action's wrapper did not report]")
    return result


def kill_group(pgid: int) -> None:
    """SIGKILL to a process group (one started with start_new_session); gone already is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# -- the wrapper (runs in its own session; outlives the authority) -------------------------------------
def _padded(doc: dict[str, object]) -> str:
    text = json.dumps(doc)
    if len(text.encode()) > STATUS_SIZE:                # only a note can be long: the result must fit
        text = json.dumps({**doc, "note": "[note too long for the status file]"})
    return text + " " * (STATUS_SIZE - len(text.encode()))


def _placeholder(path: Path) -> None:
    """The status file's blocks, taken while there is room (a full disk later cannot lose the result)."""
    try:
        _write_atomic(path, _padded({"result": RUNNING, "exit_code": None, "note": ""}))
    except OSError:
        pass                              # no room now: the result is written the ordinary way, if it can be


def _status(path: Path, result: str, code: int | None, note: str = "") -> None:
    text = _padded({"result": result, "exit_code": code, "note": note})
    try:
        _write_atomic(path, text)
    except OSError as exc:                # a full disk: no block for a new file. The placeholder has its own
        try:
            _overwrite_in_place(path, text.encode())
        except OSError:
            raise exc from None


def main(args: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llm_health.remediator.action")
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--pid-file", type=Path, required=True)
    p.add_argument("--status", type=Path, required=True)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    ns = p.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    _write_atomic(ns.pid_file, str(os.getpid()))
    _placeholder(ns.status)               # after the pid: a placeholder always has a pid file beside it
    if not argv:
        _status(ns.status, FAILED, None, "no argv")
        return 2
    sys.stdout.flush()
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, shell=False)
    except OSError as exc:
        msg = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        print(msg, flush=True)
        _status(ns.status, FAILED, None)
        return 127
    try:
        code = child.wait(timeout=ns.timeout)     # the PROCESS: a background child holds nothing here
    except subprocess.TimeoutExpired:
        kill_group(child.pid)                    # only on timeout, only its own process group
        child.wait()
        _status(ns.status, TIMEOUT, None, f"\n[killed after {ns.timeout:g}s timeout]")
        return 124
    _status(ns.status, OK if code == 0 else FAILED, code)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
