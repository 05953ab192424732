"""The repository stands alone: no tracked file reads or points at a path outside the clone.

Users have only the clone. A test that globs a folder of the development machine collects nothing
elsewhere, and a comment that points at one leaves the reader with nothing. So every tracked file's
text is checked for absolute paths of a particular machine and for relative `../` paths that climb out
of the repository.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.support.paths import REPO

# Absolute paths that only exist on somebody's machine (the development machine's work folders, home
# folders) and the team's private notes folder. Operators' paths such as /etc/llm-health or
# /var/lib/llm-health are deployment locations the docs tell users to create; they are not listed.
MACHINE_PATHS = re.compile(r"(?<![\w.])(/work/|/home/[a-z_][\w-]*/|/Users/|/tmp/bash_jobs|shared/reference)")
CLIMB = re.compile(r"(?:\.\./)+[\w.-]*")

# Strings that climb on purpose: attack inputs that the code under test must refuse.
ATTACK_INPUTS = {
    ("tests/unit/remediator/test_silence.py", "../status"),
    ("tests/unit/remediator/test_agent_check.py", "../../etc"),
    ("tests/project/test_stands_alone.py", "../"),
}


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=30)
        return [p for p in out.stdout.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        # Not a git checkout (an unpacked archive): every file but build and cache folders.
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "build"}
        return [
            str(Path(d, f).relative_to(REPO))
            for d, dirs, files in os.walk(REPO)
            if not (dirs.__setitem__(slice(None), [x for x in dirs if x not in skip]))
            for f in files
        ]


def _text(rel: str) -> str | None:
    data = (REPO / rel).read_bytes()
    if b"\0" in data:
        return None  # binary (images)
    return data.decode("utf-8", errors="replace")


def test_there_are_files_to_check() -> None:
    files = tracked_files()
    assert len(files) > 50 and "README.md" in files


def test_no_tracked_file_names_a_path_of_a_particular_machine() -> None:
    offenders = []
    for rel in tracked_files():
        if rel == "tests/project/test_stands_alone.py" or rel.startswith("tests/fixtures/"):
            continue  # the patterns themselves; verbatim captured pages (their label values are data)
        text = _text(rel)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            m = MACHINE_PATHS.search(line)
            if m:
                offenders.append(f"{rel}:{lineno}: {m.group(0)!r} in {line.strip()[:120]}")
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)


def test_no_relative_path_climbs_out_of_the_repository() -> None:
    offenders = []
    for rel in tracked_files():
        text = _text(rel)
        if text is None:
            continue
        base = (REPO / rel).parent
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in CLIMB.finditer(line):
                if any(rel == f and m.group(0).startswith(s) for f, s in ATTACK_INPUTS):
                    continue
                target = Path(os.path.normpath(base / m.group(0)))
                if not target.is_relative_to(REPO):
                    offenders.append(f"{rel}:{lineno}: {m.group(0)!r} leaves the repository")
    assert not offenders, "relative paths that climb out of the clone:\n" + "\n".join(offenders)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    # The patterns must match the two kinds of pointer this test exists for.
    assert MACHINE_PATHS.search('glob("/work/shared/reference/captures")')
    assert MACHINE_PATHS.search("see ../shared/reference/vllm-cpu-facts.md")
    assert not MACHINE_PATHS.search("token_file: /etc/llm-health/token")
    climb = CLIMB.search("see ../../../shared/notes.md").group(0)
    assert not Path(os.path.normpath(REPO / "docs" / climb)).is_relative_to(REPO)
