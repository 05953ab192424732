# One image for every llm-health part: `llm-health sim | exporter | remediator | check | busy ...`.
# Used by docker-compose.yml (image llm-health:local, built by compose) and deploy/kubernetes (image llm-health:
# build and push it to your registry, then set it in your overlay's images:). No image is published.
# - Runs as the unprivileged user llm-health (uid/gid 10001); state in /var/lib/llm-health (owned by it).
# - HEALTHCHECK: `llm-health healthcheck` GETs $LLM_HEALTH_HEALTHCHECK_URL (default: the remediator's
#   /healthz); compose sets it per service. Docker never restarts a container for being unhealthy.
# - The docker CLI is copied in so the remediator of the compose `gpu` profile can run its restart action
#   `docker restart vllm-a` through the mounted /var/run/docker.sock (that service adds the socket's
#   group); kubectl so the Kubernetes remediator can run `kubectl delete pod ...` (deploy/kubernetes).
FROM docker:27-cli AS docker-cli
FROM registry.k8s.io/kubectl:v1.31.4 AS kubectl

FROM python:3.11-slim
# OCI image annotations (docs/install.md, "The container image"): pass the version, the commit and the build
# time when building, e.g.
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#       --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" -t registry.example.com/llm-health:0.1.0 .
# No source/url/documentation label: there is no public repository or site to point at.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="llm-health" \
      org.opencontainers.image.description="Health verdicts and one restart authority for self-hosted LLM model servers (vLLM first)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE ./
COPY llm_health ./llm_health
COPY exporter ./exporter
COPY remediator ./remediator
COPY simulator ./simulator
COPY dashboards ./dashboards
COPY rules ./rules
COPY docs/runbooks.md ./docs/runbooks.md
RUN pip install '.[postgresql]' \
    && groupadd --system --gid 10001 llm-health \
    && useradd --system --uid 10001 --gid llm-health --home-dir /var/lib/llm-health --shell /usr/sbin/nologin llm-health \
    && install -d -o llm-health -g llm-health -m 0750 /var/lib/llm-health /var/lib/llm-health/busy
COPY --from=docker-cli /usr/local/bin/docker /usr/local/bin/docker
COPY --from=kubectl /bin/kubectl /usr/local/bin/kubectl
USER 10001:10001
WORKDIR /var/lib/llm-health
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 CMD ["llm-health", "healthcheck"]
ENTRYPOINT ["llm-health"]
CMD ["--help"]
