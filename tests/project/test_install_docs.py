"""How to install is said exactly, and nothing claims a package, image or repository that does not exist."""

from __future__ import annotations

import re
import subprocess

from tests.support.paths import REPO

DOC = REPO / "docs" / "install.md"


def shipped_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [n for n in listed.splitlines() if not n.startswith(("tests/", "docs/reference/"))
            and (REPO / n).is_file()]


def test_install_doc_says_how_to_build_install_and_push() -> None:
    text = DOC.read_text()
    for needle in ("make dist", "twine check", "pip install ./llm_health-<version>-py3-none-any.whl",
                   "pip install .", "--no-index --find-links", "docker build", "docker push",
                   "org.opencontainers.image", "Zipkin", "remediator.listen"):
        assert needle in text, needle
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^dist: ", makefile, re.M) and "twine check --strict" in makefile
    assert "-m build --no-isolation" in makefile and ".[dist]" in makefile


def test_nothing_claims_a_published_package_or_a_repository() -> None:
    found = []
    for name in shipped_files():
        text = (REPO / name).read_text(errors="replace")
        if re.search(r"pip install llm-health\b(?![-\w./\[])", text) or "github.com/llm-health" in text:
            found.append(name)
        if re.search(r"^Documentation=", text, re.M) and "github.com" in text:
            found.append(name)
    assert found == [], found
    assert re.search(r"pip install llm-health\b(?![-\w./\[])", "pip install llm-health  # from PyPI")  # can fail
