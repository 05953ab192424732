"""Where the shipped files are: dashboards JSON, rendered rules, runbooks.

An installed wheel carries them under llm_health/data/ (copied there at build time, see setup.py);
a checkout (editable install, tests) has them in the repository's own folders dashboards/, rules/
and docs/. `folder(name)` returns whichever exists, so every command reads the same files either way.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

FOLDERS = ("dashboards", "rules", "docs")
_PACKAGE_ROOT = Path(__file__).resolve().parent
_CHECKOUT_ROOT = _PACKAGE_ROOT.parent


class AssetError(RuntimeError):
    """A shipped file is missing: a broken install, not bad user input."""


def folder(name: str) -> Path:
    if name not in FOLDERS:
        raise ValueError(f"unknown asset folder {name!r} (one of {', '.join(FOLDERS)})")
    installed = Path(str(resources.files("llm_health").joinpath("data", name)))
    if installed.is_dir():
        return installed
    checkout = _CHECKOUT_ROOT / name
    if checkout.is_dir() and (_CHECKOUT_ROOT / "pyproject.toml").is_file():
        return checkout
    raise AssetError(f"llm_health/data/{name} is missing from this install (reinstall llm-health)")


def runbooks_markdown() -> str:
    path = folder("docs") / "runbooks.md"
    if not path.is_file():
        raise AssetError(f"{path} is missing (reinstall llm-health)")
    return path.read_text(encoding="utf-8")


def dashboard_files() -> list[Path]:
    files = sorted(folder("dashboards").glob("*.json"))
    if not files:
        raise AssetError("no dashboard JSON shipped (reinstall llm-health)")
    return files
