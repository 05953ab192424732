"""Prometheus /api/v1/targets entries for the discovery tests: plain targets, Kubernetes pods, rogue monitors."""

from __future__ import annotations

from typing import Any

from llm_health.config import DiscoverySettings

K8S = {"namespace": "__meta_kubernetes_namespace", "pod": "__meta_kubernetes_pod_name"}


SETTINGS = DiscoverySettings(prometheus_url="http://127.0.0.1:9", selector='job="vllm"',
                             name_from="__meta_kubernetes_pod_name", placeholders=tuple(K8S.items()),
                             restart=("kubectl", "delete", "pod", "-n", "{namespace}", "{pod}"))


def target(name: str, address: str = "10.0.0.5:8000", job: str = "vllm", meta: dict[str, str] | None = None,
           **labels: str) -> dict[str, Any]:
    """One entry of /api/v1/targets: `labels` after relabelling (anyone writing a monitor sets them),
    `meta` the discovered labels service discovery gave it (relabelling cannot change those)."""
    return {
        "discoveredLabels": {"__address__": address, "__scheme__": "http", "__metrics_path__": "/metrics",
                             "job": job, **(meta or {})},
        "labels": {"job": job, "instance": address, "backend": name, **labels},
        "scrapePool": job, "scrapeUrl": f"http://{address}/metrics", "health": "up",
    }


def pod(name: str, address: str = "10.0.0.5:8000", namespace: str = "llm", node: str = "", pool: str = "vllm",
        **labels: str) -> dict[str, Any]:
    """A Kubernetes pod target as our PodMonitor makes it: backend, namespace, pod and node relabelled from
    the pod's discovered labels (`labels` may forge them, as a rogue monitor's relabelling can)."""
    meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": name,
            "__meta_kubernetes_pod_node_name": node}
    t = target(name, address, meta=meta, **{"namespace": namespace, "pod": name, "node": node, **labels})
    t["scrapePool"] = pool
    return t


class Answers:
    """What Prometheus says next: a list of targets, or an exception."""

    def __init__(self) -> None:
        self.next: Any = []

    def __call__(self) -> list[Any]:
        if isinstance(self.next, Exception):
            raise self.next
        return list(self.next)


def rogue(name: str, forged_pod: str, address: str = "10.9.9.9:8000", **labels: str) -> dict[str, Any]:
    """A target from a rogue monitor in namespace `evil`: its own pod `vllm-evil`, target labels forged."""
    t = pod("vllm-evil", address, namespace="evil", node="evil-node", pool="podMonitor/evil/rogue/0")
    t["labels"].update({"backend": name, "namespace": "llm", "pod": forged_pod, **labels})
    return t
