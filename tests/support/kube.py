"""deploy/kubernetes/ as objects: the kustomize base's resources, by kind and name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

BASE = REPO / "deploy" / "kubernetes"
DASHBOARDS = BASE / "dashboards"   # a kustomization of its own: Grafana's namespace
EXAMPLES = BASE / "examples"


def kustomization(folder: Path = BASE) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def base_objects(folder: Path = BASE) -> list[dict[str, Any]]:
    return [obj for name in kustomization(folder)["resources"] for obj in load(folder / name)]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    return obj
