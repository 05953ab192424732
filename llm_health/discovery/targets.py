"""One answer of Prometheus' targets API -> backends and the reasons targets were refused. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from llm_health import groups
from llm_health.config import NAME_RE, Backend, DiscoverySettings
from llm_health.discovery.placeholders import PlaceholderError, expand_argv
from llm_health.discovery.selector import SCRAPE_POOL, Matcher, selects
from llm_health.discovery.urls import RefusalKind, url_refusal


@dataclass(frozen=True)
class Refusal:
    """A target that did not become a backend, or a backend that may not be restarted, and why."""

    backend: str          # "" when no name could be read
    target: str           # its scrape URL (or address)
    reason: str
    restart_only: bool = False   # the backend is watched; only its restart is refused
    kind: RefusalKind = RefusalKind.URL


@dataclass(frozen=True)
class Duplicate:
    """A backend name claimed by more than one target (e.g. a rogue monitor copying a real pod's name)."""

    name: str
    targets: tuple[str, ...]      # their scrape URLs (or addresses), sorted
    urls: tuple[str, ...] = ()    # the backend URLs among them that would be acceptable


@dataclass(frozen=True)
class Discovered:
    backends: tuple[Backend, ...]
    refusals: tuple[Refusal, ...]
    targets: int          # targets that matched the selector
    duplicates: tuple[Duplicate, ...] = ()


def _base_url(target: Mapping[str, Any]) -> str:
    """scheme://host:port[/prefix] of a target: its scrapeUrl minus the `/metrics` path (or, without a
    scrapeUrl, __scheme__ and __address__ from discoveredLabels). "" when it cannot be told."""
    scrape = target.get("scrapeUrl")
    if isinstance(scrape, str) and scrape:
        p = urlparse(scrape)
        path = p.path.rstrip("/")
        if not path.endswith("/metrics"):
            return ""
        prefix = path[: -len("/metrics")]
        return f"{p.scheme}://{p.netloc}{prefix}" if p.scheme in ("http", "https") and p.hostname else ""
    disc = target.get("discoveredLabels") or {}
    scheme, address = disc.get("__scheme__", "http"), disc.get("__address__", "")
    path = disc.get("__metrics_path__", "/metrics")
    if scheme not in ("http", "https") or not address or path.rstrip("/") != "/metrics":
        return ""
    return f"{scheme}://{address}"


def _str_labels(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, str)}


def discovered_labels(target: Mapping[str, Any]) -> dict[str, str]:
    """A target's discoveredLabels, plus its scrape pool as `__scrape_pool__`."""
    out = _str_labels(target.get("discoveredLabels"))
    pool = target.get("scrapePool")
    if isinstance(pool, str):
        out[SCRAPE_POOL] = pool
    else:
        out.pop(SCRAPE_POOL, None)      # never taken from the answer's labels
    return out


def _restart_of(name: str, discovered: Mapping[str, str], settings: DiscoverySettings,
                where: str) -> tuple[tuple[str, ...], Refusal | None]:
    """The restart argv of backend `name`, filled from its discovered labels only, or why it has none."""
    if not settings.restart:
        return (), None
    if not settings.name_from:
        return (), Refusal(name, where, "no restart: discovery.name_from is not set, so nothing ties the name to "
                           "what the restart acts on", True, RefusalKind.NAME_MISMATCH)
    real = discovered.get(settings.name_from)
    if real != name:
        shown = "missing" if real is None else repr(real if len(real) <= 80 else real[:80] + "...")
        return (), Refusal(name, where, f"no restart: its name {name!r} (label {settings.name_label}) is not its "
                           f"discovered {settings.name_from} ({shown}): what the restart would act on is not this "
                           "backend", True, RefusalKind.NAME_MISMATCH)
    sources = settings.placeholder_labels
    values = {p: discovered[label] for p, label in sources.items() if label in discovered}
    values["backend"] = name            # equal to the discovered name_from label (checked above)
    try:
        return expand_argv(settings.restart, values, sources), None
    except PlaceholderError as exc:
        return (), Refusal(name, where, f"no restart: {exc}", True, RefusalKind.PLACEHOLDER)


#: controllers whose pods come back under a new name when deleted (a Deployment's ReplicaSet); a
#: StatefulSet (and a LeaderWorkerSet's leaders, which are StatefulSet pods) keeps the name
REPLACES_PODS = frozenset({"ReplicaSet"})


def workload_of(discovered: Mapping[str, str]) -> str:
    """`ReplicaSet/<namespace>/<name>` for a pod its controller replaces under a new name, else "". From
    discovered labels only (relabelling cannot forge them)."""
    kind = discovered.get("__meta_kubernetes_pod_controller_kind", "")
    name = discovered.get("__meta_kubernetes_pod_controller_name", "")
    if kind not in REPLACES_PODS or not name:
        return ""
    return f"{kind}/{discovered.get('__meta_kubernetes_namespace', '')}/{name}"


def backends_from_targets(targets: Sequence[Any], settings: DiscoverySettings,
                          matchers: Sequence[Matcher], reserved: Sequence[str] = ()) -> Discovered:
    """Active targets (`data.activeTargets` of /api/v1/targets) -> backends, pure.

    A target matching the selector becomes a backend named by its `name_label` (which must pass the
    backend naming rule), at the URL it is scraped from (`url_refusal` must pass), on the host named by
    its discovered label `host_from`. Its restart argv is `settings.restart` with placeholders filled
    from its discovered labels (`settings.placeholders`; `{backend}` is its name), and only when its name
    equals its discovered `name_from` label; otherwise, or when a value is not a DNS-1123 name, it is
    watched without a restart (a `restart_only` refusal). Names in `reserved` (the static backends) are
    refused. A name claimed by two or more targets is refused for all of them (a `Duplicate`): which
    one is real cannot be told, so neither gets a restart. The outcome does not depend on answer order."""
    refusals: list[Refusal] = []
    claims: dict[str, list[tuple[str, dict[str, str], dict[str, str], Mapping[str, Any]]]] = {}
    matched = 0
    reserved_names = set(reserved)
    rows = [t for t in targets if isinstance(t, dict)]
    rows.sort(key=lambda t: str(t.get("scrapeUrl", "")))
    for t in rows:
        labels = _str_labels(t.get("labels"))
        discovered = discovered_labels(t)
        if not selects(matchers, labels, discovered):
            continue
        matched += 1
        where = str(t.get("scrapeUrl") or discovered.get("__address__", "?"))
        name = labels.get(settings.name_label, "")
        if not name or NAME_RE.fullmatch(name) is None:
            refusals.append(Refusal("", where, f"label {settings.name_label}={name!r} is not a valid backend "
                                    f"name ({NAME_RE.pattern})", kind=RefusalKind.NAME))
            continue
        if name in reserved_names:
            refusals.append(Refusal(name, where, "a static backend has this name; the static one is used",
                                    kind=RefusalKind.STATIC))
            continue
        claims.setdefault(name, []).append((where, labels, discovered, t))
    chosen: list[Backend] = []
    duplicates: list[Duplicate] = []
    for name in sorted(claims):
        claimants = claims[name]
        if len(claimants) > 1:
            wheres = tuple(sorted(c[0] for c in claimants))
            urls = tuple(sorted({u for c in claimants if (u := _base_url(c[3])) and url_refusal(u, settings) is None}))
            duplicates.append(Duplicate(name, wheres, urls))
            for where, *_ in claimants:
                refusals.append(Refusal(name, where, f"duplicate: {len(claimants)} targets claim this name "
                                        f"({', '.join(wheres)}); none is restarted while this lasts",
                                        kind=RefusalKind.DUPLICATE))
            continue
        ((where, labels, discovered, t),) = claimants
        url = _base_url(t)
        if not url:
            refusals.append(Refusal(name, where, "cannot tell its URL (scheme must be http(s) and the "
                                    "metrics path /metrics)", kind=RefusalKind.URL))
            continue
        bad = url_refusal(url, settings)
        if bad is not None:
            refusals.append(Refusal(name, where, bad[1], kind=bad[0]))
            continue
        restart, refused = _restart_of(name, discovered, settings, where)
        if refused is not None:
            refusals.append(refused)
        host = discovered.get(settings.host_from, "") if settings.host_from else ""
        chosen.append(Backend(name=name, url=url, host=host, model=labels.get(settings.model_label, "")
                              if settings.model_label else "", restart=restart,
                              labels=groups.from_target(labels, settings.group_labels),
                              workload=workload_of(discovered)))
    return Discovered(tuple(chosen), tuple(refusals), matched, tuple(duplicates))


def parse_answer(body: bytes) -> list[Any]:
    """`data.activeTargets` of a /api/v1/targets answer; ValueError for anything else."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise ValueError(f"status {doc.get('status') if isinstance(doc, dict) else '?'!r}: "
                         f"{doc.get('error', '') if isinstance(doc, dict) else ''}")
    data = doc.get("data")
    targets = data.get("activeTargets") if isinstance(data, dict) else None
    if not isinstance(targets, list):
        raise ValueError("no data.activeTargets list in the answer")
    return targets
