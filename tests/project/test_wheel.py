"""`make dist` builds the sdist and the wheel (from the sdist) and passes twine check; the wheel, installed
into a fresh venv, works without the checkout, adds only llm_health and carries every shipped asset.

Offline and deterministic: `make dist` runs in a copy of the sources (the checkout gets no build/ or dist/
folder) with this venv's build, twine and setuptools (--no-isolation, no index; the Makefile's venv stamps
point at a file made here, so it installs nothing into this venv). The wheel is installed with --no-deps
--no-index into a venv made here, and the installed dependencies are borrowed from the project venv
through a .pth line (added after the site-packages listing is compared). Then `llm-health --help`,
`--version`, `rules render`, `dashboards render` and the shipped runbooks are used from that venv,
outside the repo.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import llm_health
from tests.support.paths import REPO

ROOT = REPO
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "LICENSE", "README.md", "Makefile",
           "llm_health", "exporter", "remediator", "simulator", "dashboards", "rules", "docs"]
MAKE = shutil.which("make")


def shipped_assets() -> dict[str, Path]:
    """Path in the wheel -> the repository file it must equal: every rendered rule file, dashboard,
    template, and the runbooks."""
    assets = {f"llm_health/data/rules/{p.name}": p for p in sorted((ROOT / "rules").glob("llm_health_*.yml"))}
    assets |= {f"llm_health/data/dashboards/{p.name}": p for p in sorted((ROOT / "dashboards").glob("*.json"))}
    assets["llm_health/data/docs/runbooks.md"] = ROOT / "docs" / "runbooks.md"
    for folder, package in ((ROOT / "llm_health" / "render" / "templates", "llm_health/render/templates"),
                            (ROOT / "remediator" / "templates", "llm_health/remediator/templates")):
        assets |= {f"{package}/{p.relative_to(folder)}": p for p in sorted(folder.rglob("*")) if p.is_file()}
    return assets


@dataclass
class Installed:
    venv: Path
    site: Path
    wheel: Path
    sdist: Path
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
    if MAKE is None:
        pytest.skip("make not installed")
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
    stamp = tmp / "stamp"            # the Makefile's venv stamps: up to date, so it installs nothing
    stamp.touch()
    build = subprocess.run(
        [MAKE, "-C", str(src), "dist", f"VENV={sys.prefix}", f"STAMP={stamp}", f"DIST_STAMP={stamp}",
         f"DIST={dist}"], capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout + build.stderr
    assert build.stdout.count("PASSED") == 2, build.stdout                     # twine check: wheel and sdist
    (wheel,) = dist.glob("llm_health-*.whl")
    (sdist,) = dist.glob("llm_health-*.tar.gz")

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
    yield Installed(env_dir, site, wheel, sdist, added)


def test_only_llm_health_is_added_to_site_packages(installed: Installed) -> None:
    names = {n for n in installed.added if not n.endswith(".dist-info")}
    assert names == {"llm_health"}, installed.added
    assert len(installed.added) == 2
    for generic in ("exporter", "remediator", "simulator", "dashboards", "rules", "docs"):
        assert not (installed.site / generic).exists()


def test_wheel_carries_license_and_every_shipped_asset(installed: Installed) -> None:
    wheel = zipfile.ZipFile(installed.wheel)
    names = set(wheel.namelist())
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)
    assets = shipped_assets()
    assert "llm_health/data/rules/llm_health_self.yml" in assets and len(assets) >= 10
    missing = sorted(set(assets) - names)
    assert missing == [], f"not in the wheel: {missing}"
    for name, source in assets.items():
        assert wheel.read(name) == source.read_bytes(), name
    shipped = {n for n in names if n.startswith("llm_health/data/")}
    assert shipped == {n for n in assets if n.startswith("llm_health/data/")}  # nothing stale either
    for code in ("llm_health/exporter/verdict.py", "llm_health/remediator/store/base.py", "llm_health/cli.py",
                 "llm_health/remediator/sidecar/cli.py"):
        assert code in names
    assert not any(n.endswith("generate.py") for n in names)


def test_every_package_folder_is_in_the_wheels_package_list() -> None:
    """pyproject.toml lists the packages by hand (the folders map onto llm_health.*): a new folder missing
    from it would be left out of the wheel and the image, and only fail where it is installed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for top, package in (("llm_health", "llm_health"), ("exporter", "llm_health.exporter"),
                         ("remediator", "llm_health.remediator"), ("simulator", "llm_health.simulator")):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((package, *parts)))
    assert found == listed, f"missing from pyproject.toml: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def test_metadata_claims_no_url_that_does_not_exist(installed: Installed) -> None:
    wheel = zipfile.ZipFile(installed.wheel)
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    headers = metadata.split("\n\n", 1)[0]
    assert "License-Expression: Apache-2.0" in headers and f"Version: {llm_health.__version__}" in headers
    assert "Project-URL" not in headers and "Home-page" not in headers and "Download-URL" not in headers
    assert "Requires-Python: >=3.11" in headers


def test_the_sdist_holds_what_builds_the_wheel(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for needed in ("pyproject.toml", "setup.py", "MANIFEST.in", "LICENSE", "README.md", "docs/runbooks.md"):
        assert needed in names, needed
    for source in shipped_assets().values():
        assert str(source.relative_to(ROOT)) in names, source


def test_help(installed: Installed, tmp_path: Path) -> None:
    result = installed.run("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for command in ("exporter", "remediator", "rules", "dashboards", "check", "healthcheck"):
        assert command in result.stdout, command


def test_version(installed: Installed, tmp_path: Path) -> None:
    result = installed.run("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"llm-health {llm_health.__version__}"


def test_rules_render_from_the_wheel_matches_the_checked_in_rules(installed: Installed, tmp_path: Path) -> None:
    result = installed.run("rules", "render", "--out", str(tmp_path / "rules"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("llm_health_alerts.yml", "llm_health_records.yml", "llm_health_self.yml"):
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
