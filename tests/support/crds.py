"""prometheus-operator's objects validated offline against the operator's CRD schemas.

The schemas come as the pydantic models that `cloudcoil-models-prometheus-operator` generates from
prometheus-operator's CRDs (the package's version is the operator's: 0.80.1.0 = v0.80.1; test extra).
A model checks types, enums, required fields and bounds, but ignores unknown fields, which the API
server prunes silently: a misspelt field would be lost without a word. So an object is also dumped back
and must come out as it went in. Nested routes of an AlertmanagerConfig are free-form in the CRD
(x-kubernetes-preserve-unknown-fields), and the operator reads them as routes: they are checked as routes.

The package registers a pytest plugin that can start kind/k3d clusters; pyproject's addopts disable it
(-p no:cloudcoil), and the test extra has the filelock it imports, for pytest runs without those addopts.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel

#: the CRDs' (apiVersion, kind); their models are built on first use: importing the generated models builds
#: about 4 000 pydantic classes, 2.5 to 5 s of CPU, and every pytest-xdist worker imports every test module to
#: collect it, also the workers that never validate an object
CRDS = (("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"), ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"))
KINDS = {kind for _, kind in CRDS}


@functools.cache
def models() -> dict[tuple[str, str], type[BaseModel]]:
    from cloudcoil.models.prometheus_operator import v1, v1alpha1

    return {(version, kind): getattr(v1 if version.endswith("/v1") else v1alpha1, kind) for version, kind in CRDS}


class SchemaError(AssertionError):
    pass


def _unknown(given: Any, kept: Any, where: str) -> list[str]:
    """Paths in `given` that the model did not keep."""
    if isinstance(given, dict) and isinstance(kept, dict):
        out = [f"{where}/{k}" for k in given if k not in kept]
        return out + [p for k in given if k in kept for p in _unknown(given[k], kept[k], f"{where}/{k}")]
    if isinstance(given, list) and isinstance(kept, list):
        return [p for i, (a, b) in enumerate(zip(given, kept, strict=False)) for p in _unknown(a, b, f"{where}[{i}]")]
    return [] if given == kept else [f"{where} ({given!r} became {kept!r})"]


def _check(model: type[BaseModel], obj: dict[str, Any], where: str) -> None:
    try:
        parsed = model.model_validate(obj)
    except ValueError as exc:  # pydantic.ValidationError
        raise SchemaError(f"{where}: {exc}") from None
    problems = _unknown(obj, parsed.model_dump(by_alias=True, exclude_unset=True, mode="json"), where)
    if problems:
        raise SchemaError(f"not in the CRD schema: {problems}")


def _routes(route: dict[str, Any], where: str) -> None:
    from cloudcoil.models.prometheus_operator import v1alpha1

    for i, child in enumerate(route.get("routes") or []):
        _check(v1alpha1.Route, child, f"{where}/routes[{i}]")
        _routes(child, f"{where}/routes[{i}]")


def validate(obj: dict[str, Any]) -> None:
    """SchemaError unless `obj` is valid for its CRD and holds no field the CRD lacks."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in CRDS:
        raise SchemaError(f"no CRD schema for {key}")
    name = obj.get("metadata", {}).get("name", "?")
    _check(models()[key], obj, f"{key[1]}/{name}")
    if key[1] == "AlertmanagerConfig" and obj.get("spec", {}).get("route"):
        _routes(obj["spec"]["route"], f"AlertmanagerConfig/{name}/spec/route")
