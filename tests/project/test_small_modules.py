"""One small module per job: no module of the remediator grows past about 300 lines.

A module that outgrows it has taken a second job (the house's rule, docs/design.md's map): split it by job
before it becomes another room that does everything.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import REPO

#: "about 300": the most lines a module of remediator/ may have
MOST_LINES = 340


def long_modules(root: Path, most: int) -> dict[str, int]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > most:
            out[str(path.relative_to(root.parent))] = n
    return out


def test_the_scan_counts_lines(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 12)
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 11)
    assert long_modules(tmp_path / "pkg", 11) == {"pkg/long.py": 12}


def test_no_module_of_the_remediator_is_over_about_300_lines() -> None:
    assert long_modules(REPO / "remediator", MOST_LINES) == {}
