"""Backends from the targets Prometheus already scrapes (optional, beside the static list).

    discovery:
      prometheus_url: http://127.0.0.1:9090
      selector: 'job="vllm", __meta_kubernetes_namespace="llm"'
      name_label: backend
      name_from: __meta_kubernetes_pod_name
      restart: ["kubectl", "delete", "pod", "-n", "{namespace}", "{pod}"]
      placeholders: {namespace: __meta_kubernetes_namespace, pod: __meta_kubernetes_pod_name}

Source: `GET /api/v1/targets?state=active`. It lists every target Prometheus scrapes, with the labels
it puts on the series (after relabelling), the labels service discovery gave it (`discoveredLabels`,
before relabelling) and the final scrape URL, whether or not the last scrape worked: a target that is
down is still a backend, to be judged "down" by the exporter, not silently forgotten (principle 3).
Series or metadata queries would lose exactly those targets, so they are not used. The API has no
label filter, so the selector is applied here.

Trust (principle 7, docs/discovery.md): a target's `labels` are whatever relabelling made them, and
whoever may create a PodMonitor, ServiceMonitor or scrape config writes the relabelling. Its
`discoveredLabels` come from the service discovery itself (`__meta_kubernetes_pod_name` is the pod's
name as the API server says). So what a restart acts on (placeholders), the host (the per-host
restart mutex) and the check that a backend's name is what it restarts read discovered labels only;
a name claimed by two targets restarts neither; URLs at link-local addresses, with userinfo, or
outside the operator's allow-lists are refused.

Pure parts (unit-tested): `parse_selector`, `backends_from_targets` (one answer -> backends and the
reasons targets were refused), `url_refusal`, `expand_argv` (placeholders filled only with DNS-1123
names). `Discovery` is the I/O edge: it refreshes on a monotonic clock (and, asked to, once more at
most every `extra_refresh_every` seconds), keeps the last good list when an answer is bad, removes a
vanished backend only after `grace` seconds, and merges with the static backends (static ones always
stay and win a name clash). `LiveBackends` is the sequence the exporter and remediator read their
fleet from.

The package, one job a module: selector.py (the selector), placeholders.py (restart argv templates),
urls.py (which URLs may be used), targets.py (one answer -> backends, pure), refresher.py (Discovery,
LiveBackends), collector.py (its metrics; imported from there, it needs prometheus_client).
"""

from llm_health.discovery.placeholders import PlaceholderError, dns1123, expand_argv, template_placeholders
from llm_health.discovery.refresher import Discovery, LiveBackends, Status, fetch_targets, status_document
from llm_health.discovery.selector import Matcher, parse_selector, selects
from llm_health.discovery.targets import Discovered, Duplicate, Refusal, backends_from_targets, parse_answer
from llm_health.discovery.urls import RefusalKind, url_refusal

__all__ = [
    "Discovered", "Discovery", "Duplicate", "LiveBackends", "Matcher", "PlaceholderError", "Refusal", "RefusalKind",
    "Status", "backends_from_targets", "dns1123", "expand_argv", "fetch_targets", "parse_answer", "parse_selector",
    "selects", "status_document", "template_placeholders", "url_refusal",
]
