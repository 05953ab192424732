"""The wheel, built and installed into a fresh venv, works without the checkout and adds only llm_health.

Offline and deterministic: the wheel is built with the project venv's setuptools (--no-build-isolation,
no index) from a copy of the sources (the checkout gets no build/ folder), installed with --no-deps
--no-index into a venv made here, and the installed dependencies are borrowed from the project venv
through a .pth line (added after the site-packages listing is compared). Then `llm-health --version`,
`rules render`, `dashboards render` and the shipped runbooks are used from that venv, outside the repo.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import llm_health
from tests.support.paths import REPO

ROOT = REPO
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "LICENSE", "README.md",
           "llm_health", "exporter", "remediator", "simulator", "dashboards", "rules", "docs"]


@dataclass
class Installed:
    venv: Path
    site: Path
    wheel: Path
    added: set[str]

    def run(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "llm-health"), *args], cwd=cwd,
                              capture_output=True, text=True, timeout=120)


def _site_packages(prefix: Path) -> Path:
    found = list(prefix.glob("lib/python3*/site-packages"))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    dist = tmp / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(dist), str(src)],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("llm_health-*.whl")

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = _site_packages(env_dir)
    before = {p.name for p in site.iterdir()}
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "--no-deps",
         "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
        capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    added = {p.name for p in site.iterdir()} - before
    # dependencies (flask, jinja2, ...) from the project venv, after the wheel's own files
    (site / "zz_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield Installed(env_dir, site, wheel, added)


def test_only_llm_health_is_added_to_site_packages(installed: Installed) -> None:
    names = {n for n in installed.added if not n.endswith(".dist-info")}
    assert names == {"llm_health"}, installed.added
    assert len(installed.added) == 2
    for generic in ("exporter", "remediator", "simulator", "dashboards", "rules", "docs"):
        assert not (installed.site / generic).exists()


def test_wheel_carries_license_and_assets(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)
    metadata = zipfile.ZipFile(installed.wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    for asset in ("llm_health/data/docs/runbooks.md", "llm_health/data/rules/llm_health_alerts.yml",
                  "llm_health/data/rules/llm_health_records.yml",
                  "llm_health/render/templates/rules/llm_health_alerts.yml.j2",
                  "llm_health/exporter/verdict.py", "llm_health/remediator/templates/status.html"):
        assert asset in names
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("llm_health/data/dashboards/")}
    assert shipped == {p.name for p in (ROOT / "dashboards").glob("*.json")}
    assert not any(n.endswith("generate.py") for n in names)


def test_version(installed: Installed, tmp_path: Path) -> None:
    result = installed.run("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"llm-health {llm_health.__version__}"


def test_rules_render_from_the_wheel_matches_the_checked_in_rules(installed: Installed, tmp_path: Path) -> None:
    result = installed.run("rules", "render", "--out", str(tmp_path / "rules"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("llm_health_alerts.yml", "llm_health_records.yml"):
        assert (tmp_path / "rules" / name).read_text() == (ROOT / "rules" / name).read_text()
        assert (installed.site / "llm_health" / "data" / "rules" / name).read_text() == (ROOT / "rules" / name).read_text()


def test_dashboards_render_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    result = installed.run("dashboards", "render", "--out", str(tmp_path / "dash"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    expected = sorted((ROOT / "dashboards").glob("*.json"))
    assert expected
    for path in expected:
        assert (tmp_path / "dash" / path.name).read_text() == path.read_text()


def test_installed_code_reads_its_own_assets_not_the_checkout(installed: Installed, tmp_path: Path) -> None:
    code = ("import llm_health, llm_health.assets as a; print(llm_health.__file__); print(a.folder('docs')); "
            "print(len(a.runbooks_markdown()))")
    result = subprocess.run([str(installed.venv / "bin" / "python"), "-c", code], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    module_file, docs, size = result.stdout.split()
    assert Path(module_file).is_relative_to(installed.site)
    assert Path(docs) == installed.site / "llm_health" / "data" / "docs"
    assert int(size) == len((ROOT / "docs" / "runbooks.md").read_text())


def test_remediator_subcommand_loads_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    result = installed.run("remediator", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--config" in result.stdout
