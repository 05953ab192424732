"""Generate deploy/compose/alertmanager.yml from the production example deploy/alertmanager/alertmanager.yml.

    python scripts/compose_alertmanager.py            # rewrite the compose file
    python scripts/compose_alertmanager.py --check    # exit 1 when it is stale

Routes, grouping, inhibitions and receivers stay the production ones; only what the compose network
needs changes: the remediator's webhook URL (the compose service name), its token (COMPOSE_TOKEN_FILE;
None = no Authorization header, the compose remediator then runs without a token), and the gpu
profile's second stack: a receiver for remediator-gpu and a child route sending its backends (vllm-*)
there. tests/deploy/test_compose.py checks that nothing else differs and that both pass amtool.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
COMPOSE = ROOT / "deploy" / "compose" / "alertmanager.yml"
RECEIVER = "llm-health-remediator"
GPU_RECEIVER = "llm-health-remediator-gpu"
URLS = {RECEIVER: "http://remediator:9411/webhook", GPU_RECEIVER: "http://remediator-gpu:9411/webhook"}
GPU_BACKENDS = 'backend=~"vllm-.*"'
RESTART = 'remediation="restart"'    # the restart route gets the gpu child (the Watchdog goes to the first stack)
COMPOSE_TOKEN_FILE: str | None = "/run/llm-health-token/token"
HEADER = """\
# Alertmanager for the docker compose stack (mounted at /etc/alertmanager/alertmanager.yml).
# GENERATED from deploy/alertmanager/alertmanager.yml by scripts/compose_alertmanager.py: edit that file
# (its comments explain every route and inhibition) and regenerate. Differences: the remediator's URL
# is the compose service, the token (see COMPOSE_TOKEN_FILE in the script), and the gpu profile's
# backends (vllm-*) go to remediator-gpu.
"""


def _set_token(hook: dict[str, Any]) -> None:
    if COMPOSE_TOKEN_FILE is None:
        hook.pop("http_config", None)
    else:
        hook.setdefault("http_config", {})["authorization"] = {"type": "Bearer", "credentials_file": COMPOSE_TOKEN_FILE}


def compose_config(production: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(production)
    receivers = config["receivers"]
    index = next(i for i, r in enumerate(receivers) if r["name"] == RECEIVER)
    remediator = receivers[index]
    (hook,) = remediator["webhook_configs"]
    hook["url"] = URLS[RECEIVER]
    _set_token(hook)
    gpu = copy.deepcopy(remediator)
    gpu["name"] = GPU_RECEIVER
    gpu["webhook_configs"][0]["url"] = URLS[GPU_RECEIVER]
    receivers.insert(index + 1, gpu)
    routes = [r for r in config["route"]["routes"] if r["receiver"] == RECEIVER and RESTART in r.get("matchers", [])]
    if len(routes) != 1:
        raise SystemExit(f"expected one route of {RESTART} to {RECEIVER} in {PRODUCTION}, found {len(routes)}")
    routes[0].setdefault("routes", []).insert(0, {"receiver": GPU_RECEIVER, "matchers": [GPU_BACKENDS]})
    return config


def render(production_text: str) -> str:
    return HEADER + yaml.safe_dump(compose_config(yaml.safe_load(production_text)), sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    text = render(PRODUCTION.read_text())
    if argv[1:] == ["--check"]:
        if COMPOSE.read_text() != text:
            print(f"{COMPOSE} is stale: python scripts/compose_alertmanager.py", file=sys.stderr)
            return 1
        return 0
    COMPOSE.write_text(text)
    print(f"wrote {COMPOSE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
