# One image for every llm-health part: `llm-health sim | exporter | remediator | check | busy ...`.
# Used by docker-compose.yml (image llm-health:local). The docker CLI is copied in so the remediator of
# the compose `gpu` profile can run its restart action `docker restart vllm-a` through the mounted
# /var/run/docker.sock; nothing else uses it.
FROM docker:27-cli AS docker-cli

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY llm_health ./llm_health
COPY exporter ./exporter
COPY remediator ./remediator
COPY simulator ./simulator
RUN pip install . && mkdir -p /var/lib/llm-health/busy
COPY --from=docker-cli /usr/local/bin/docker /usr/local/bin/docker
ENTRYPOINT ["llm-health"]
CMD ["--help"]
