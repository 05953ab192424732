"""Build step for the shipped assets; everything else is in pyproject.toml.

The wheel carries what an operator needs without a checkout, under llm_health/data/:
dashboards/*.json (Grafana), rules/llm_health_*.yml (every rule file rendered with default settings) and
docs/runbooks.md (served by the remediator at /runbooks). The repository keeps its top-level
dashboards/, rules/ and docs/ folders; this copies from them at build time. A checkout (editable
install) reads the same files in place (llm_health/assets.py).
"""

from __future__ import annotations

import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py

# folder under llm_health/data -> files of the repository copied there
ASSETS = {
    "dashboards": ["dashboards/*.json"],
    "rules": ["rules/llm_health_*.yml"],   # every rendered rule file: records, alerts, self
    "docs": ["docs/runbooks.md"],
}


class BuildWithAssets(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the repository's folders in place
        for folder, patterns in ASSETS.items():
            sources = sorted({path for pattern in patterns for path in glob.glob(pattern)})
            if not sources:
                raise SystemExit(f"build: no file matches {patterns} (run from the repository root)")
            target = os.path.join(self.build_lib, "llm_health", "data", folder)
            self.mkpath(target)
            for source in sources:
                self.copy_file(source, os.path.join(target, os.path.basename(source)))


setup(cmdclass={"build_py": BuildWithAssets})
