"""`llm_health_build_info{version, revision, python}` = 1 on the exporter's and the remediator's /metrics
(the `*_build_info` convention of Prometheus' own programs: join on it to see what runs where).

`revision` is the source's commit when it is known: from the installer's record of a VCS install
(`pip install git+...`: direct_url.json), else from LLM_HEALTH_REVISION in the environment (set it when
building an image: `docker build --build-arg ...` passed on as ENV); '' when neither says.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterator
from functools import cache
from importlib import metadata

from prometheus_client.core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_health import __version__

REVISION_ENV = "LLM_HEALTH_REVISION"


@cache
def installed_revision() -> str:
    """The commit pip recorded for a VCS install of llm-health, or ''."""
    try:
        text = metadata.distribution("llm-health").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return ""
    try:
        commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id", "")
    except (ValueError, AttributeError):
        return ""
    return commit if isinstance(commit, str) else ""


def revision() -> str:
    return installed_revision() or os.environ.get(REVISION_ENV, "").strip()[:64]


class BuildInfoCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        # an info family: `llm_health_build_info ... 1` as a gauge in the text format, type `info` in OpenMetrics
        yield InfoMetricFamily("llm_health_build", "The llm-health version (and source revision, when known) and "
                               "the Python running this process.",
                               value={"version": __version__, "revision": revision(),
                                      "python": platform.python_version()})
