"""Restart actions as real processes: the argv without a shell, failures, timeouts and truncated output;
actions that start the server in the background, and results that survive the authority.

Real processes: a restart script that ends in `nohup ... &` (the child inherits the action's stdout)
and one that uses `setsid`. The action is over when the SCRIPT exits: the authority is free again, the
child keeps running, the outcome is the script's exit code. The exit status goes to a file, so an
authority that did not live to see the end can still collect it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.drill.procs import wait_until
from llm_health.remediator import action

NOHUP = """#!/bin/sh
echo "starting the server in the background"
nohup "{py}" -c "import time; time.sleep(300)" &
echo $! > "{pidfile}"
exit {code}
"""

SETSID = """#!/bin/sh
echo "starting the server in its own session"
setsid "{py}" -c "import os, time; open('{pidfile}', 'w').write(str(os.getpid())); time.sleep(300)" &
while [ ! -s "{pidfile}" ]; do sleep 0.05; done
exit {code}
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                        # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Path]]:
    """pid files of the background children the scripts start; every one is killed afterwards."""
    files: list[Path] = []
    yield files
    for f in files:
        try:
            os.kill(int(f.read_text().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def script(tmp_path: Path, template: str, code: int, children: list[Path], name: str) -> tuple[Path, Path]:
    pidfile = tmp_path / f"{name}.child.pid"
    children.append(pidfile)
    path = tmp_path / f"{name}.sh"
    path.write_text(template.format(py=sys.executable, pidfile=pidfile, code=code))
    path.chmod(0o755)
    return path, pidfile


@pytest.mark.parametrize("template", [NOHUP, SETSID], ids=["nohup", "setsid"])
@pytest.mark.timeout(120)
def test_background_child_neither_holds_the_action_nor_dies(tmp_path: Path, children: list[Path],
                                                            template: str) -> None:
    path, pidfile = script(tmp_path, template, 0, children, "ok")
    # the child lives 300 s, far past the 60 s timeout: waiting for pipes would end in TIMEOUT (and,
    # for setsid, never return); waiting for the script's process ends with its exit code
    r = action.run_action([str(path)], timeout=60, folder=tmp_path / "actions", key="1")
    assert r.result == action.OK and r.exit_code == 0, r
    assert "starting the server" in r.output
    child = int(pidfile.read_text().strip())
    assert alive(child), "the server the action started on purpose was killed"


@pytest.mark.parametrize("template", [NOHUP, SETSID], ids=["nohup", "setsid"])
@pytest.mark.timeout(120)
def test_outcome_is_the_scripts_exit_code(tmp_path: Path, children: list[Path], template: str) -> None:
    path, pidfile = script(tmp_path, template, 3, children, "fails")
    r = action.run_action([str(path)], timeout=60, folder=tmp_path / "actions", key="2")
    assert r.result == action.FAILED and r.exit_code == 3 and not r.outcome_unknown
    assert alive(int(pidfile.read_text().strip()))          # exited non-zero: still never killed by us


@pytest.mark.timeout(60)
def test_timeout_kills_the_actions_process_group_only(tmp_path: Path) -> None:
    r = action.run_action([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                          timeout=1, folder=tmp_path / "actions", key="3")
    assert r.result == action.TIMEOUT and r.outcome_unknown and "up" in r.output


@pytest.mark.timeout(60)
def test_status_survives_the_caller_and_is_collected(tmp_path: Path) -> None:
    """The wrapper runs on when whoever started it is gone, and leaves the exit status in a file."""
    folder = tmp_path / "actions"
    folder.mkdir()
    files = action.ActionFiles(folder, "7")
    gate = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\nprint('done')"
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "llm_health.remediator.action", "--timeout", "30", "--pid-file", str(files.pid),
         "--status", str(files.status), "--", sys.executable, "-c", code],
        stdout=open(files.out, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: files.pid.exists(), timeout=20, what="wrapper pid file")
        assert action.collect(files) is None                 # still running: not "interrupted"
        gate.write_text("")
        wait_until(lambda: action.collect(files) is not None, timeout=20, what="exit status")
        r = action.collect(files)
        assert r is not None and r.result == action.OK and r.exit_code == 0 and "done" in r.output
    finally:
        wrapper.kill()
        wrapper.wait()


def test_a_vanished_wrapper_is_unknown_never_ok(tmp_path: Path) -> None:
    files = action.ActionFiles(tmp_path, "9")
    files.pid.write_text("999999999")                        # no such process, no status file
    r = action.collect(files)
    assert r is not None and r.result == action.UNKNOWN and r.outcome_unknown


@pytest.mark.timeout(60)
def test_files_left_by_an_earlier_state_are_never_this_actions_result(tmp_path: Path) -> None:
    """Action ids start again with a new state file (the old one moved away or restored from a backup)
    while the action folder keeps the old files: a stale `<id>.status` saying ok must not be collected
    (by a later authority's recover or watch_action) as the result of the action now running."""
    import threading

    folder = tmp_path / "actions"
    folder.mkdir()
    files = action.ActionFiles(folder, "1")
    files.status.write_text('{"result": "ok", "exit_code": 0, "note": ""}')
    files.pid.write_text("999999999")
    gate = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\nprint('done')"
    out: list[action.ActionResult] = []
    t = threading.Thread(target=lambda: out.append(action.run_action([sys.executable, "-c", code], 30,
                                                                     folder=folder, key="1")), daemon=True)
    t.start()
    try:
        wait_until(lambda: files.pid.exists() and files.pid.read_text().strip() not in ("", "999999999"),
                   timeout=20, what="the new wrapper's pid file")
        assert action.collect(files) is None                 # running: not the stale "ok"
    finally:
        gate.write_text("")
        t.join(timeout=30)
    assert out and out[0].result == action.OK and "done" in out[0].output


def test_a_recycled_pid_whose_command_line_only_contains_the_path_is_not_the_wrapper(tmp_path: Path) -> None:
    """pid reuse check: a process whose arguments merely CONTAIN the status path (e.g. `x/1.status.bak`)
    is not this action's wrapper."""
    files = action.ActionFiles(tmp_path, "1")
    proc = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(30)", str(files.status) + ".bak"])
    try:
        files.pid.write_text(str(proc.pid))
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        wait_until(lambda: str(files.status).encode() in cmdline.read_bytes(), timeout=20, what="its command line")
        r = action.collect(files)
        assert r is not None and r.result == action.UNKNOWN
    finally:
        proc.kill()
        proc.wait()


FILL_THE_DISK = """
import errno, sys
with open(sys.argv[1], "wb", buffering=0) as f:
    try:
        while True:
            f.write(b"x" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of the test's own: a real ENOSPC, nobody else's disk filled."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                           capture_output=True, text=True, timeout=30)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


@pytest.mark.parametrize("code", [0, 3])
@pytest.mark.timeout(60)
def test_the_exit_status_survives_a_full_disk(small_disk: Path, code: int) -> None:
    """The restart fills the disk the action folder is on, then exits: its exit status is still recorded
    (it used to be lost: no room for the status file, so the authority called the restart `interrupted`)."""
    folder = small_disk / "state.db.actions"
    filler = small_disk / "filler"
    r = action.run_action([sys.executable, "-c", FILL_THE_DISK, str(filler), str(code)], timeout=30,
                          folder=folder, key="5")
    assert os.statvfs(small_disk).f_bavail == 0 and filler.stat().st_size > 0      # it really was full
    with pytest.raises(OSError, match="No space left"):
        (small_disk / "one-more").write_bytes(b"x" * 4096)
    assert (r.result, r.exit_code) == ((action.OK, 0) if code == 0 else (action.FAILED, 3)), r
    files = action.ActionFiles(folder, "5")
    assert json.loads(files.status.read_text())["exit_code"] == code            # a later authority collects it
    assert files.status.stat().st_size == action.STATUS_SIZE and not (folder / "5.status.tmp").exists()
    assert action.collect(files) == r


def test_a_placeholder_left_by_a_dead_wrapper_is_unknown(tmp_path: Path) -> None:
    """The placeholder the wrapper writes first is no result: running while the wrapper lives, UNKNOWN after."""
    files = action.ActionFiles(tmp_path, "8")
    action._placeholder(files.status)
    assert files.status.stat().st_size == action.STATUS_SIZE
    files.pid.write_text("999999999")
    r = action.collect(files)
    assert r is not None and r.result == action.UNKNOWN and "without an exit status" in r.output


def test_action_runs_argv_without_shell(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = f"import sys, os; open({str(out)!r}, 'w').write(repr(sys.argv[1:]) + os.environ['LLM_HEALTH_BACKEND'])"
    r = action.run_action([sys.executable, "-c", code, "$(id)", "; rm -rf /"], timeout=10,
                          env={"LLM_HEALTH_BACKEND": "gpu-a"})
    assert r.result == action.OK and r.exit_code == 0
    assert out.read_text() == "['$(id)', '; rm -rf /']gpu-a"


def test_action_failure_timeout_and_output_truncation() -> None:
    r = action.run_action([sys.executable, "-c", "import sys; print('x' * 10000); sys.exit(4)"], timeout=10)
    assert r.result == action.FAILED and r.exit_code == 4
    assert len(r.output) < 4100 and "[truncated]" in r.output
    r = action.run_action([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"],
                          timeout=0.5)
    assert r.result == action.TIMEOUT and r.outcome_unknown and "started" in r.output
    r = action.run_action(["/nonexistent/restart-me"], timeout=1)
    assert r.result == action.FAILED and r.exit_code is None and "cannot start" in r.output
