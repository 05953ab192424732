"""`llm-health readiness`: a sidecar in each vLLM pod whose /ready follows the remediator's lifecycle.

On Kubernetes the kubelet's readiness probe decides which pods a Service sends requests to. This
sidecar makes that probe say what the remediator says (GET /api/backends/<name>/readiness: READY and in
service), so a drain takes the pod out of the Service's endpoints and a restarted pod takes traffic
only after the warm-up gate. When the remediator cannot answer, the engine's own /health decides after
`--fallback-after` seconds: our outage never takes the fleet out.

`decision.py` (pure: what to answer), `watch.py` (the two pollers and the latest facts), `server.py`
(/ready, /healthz), `cli.py` (the subcommand). No web stack, like `llm-health healthcheck`.
"""
