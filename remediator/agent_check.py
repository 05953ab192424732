"""HAProxy agent-check endpoint: tells the load balancer, per backend, ready / drain / down and a weight.

One TCP listener serves every backend. Each HAProxy server line carries
`agent-check agent-port P agent-send "<backend-name>\\n"`; HAProxy sends that string verbatim, we read
one line, look the name up through the injected `status_for(name)` and answer one line:

| status                                        | reply               |
|-----------------------------------------------|---------------------|
| READY and healthy; or kept up (`keep_up`)     | `ready up W%`       |
| DRAINING                                      | `drain`             |
| drained by an operator (READY / not READY)    | `up drain #<why>` / `down drain #<why>` |
| retired by an operator                        | `maint #<why>`      |
| READY but unhealthy (stalled/down verdict)    | `down #<reason>`    |
| INITIALIZING, STOPPED, ERROR                  | `down #<reason>`    |
| name unknown / not a valid name               | `down #unknown backend` |

Weight W from the KV-cache usage (0..1): 100% up to 0.85, then linear down to 10% at 1.0 (and above).
Unknown KV usage (None/NaN) gives 100%: we do not punish a backend for a missing reading, HAProxy's own
health check still guards it. The weight is relative to the server's configured weight.

`ready` cancels a drain/maint set by the agent and `up` cancels an agent `down`, so a READY backend
always comes back. `#` must start a word in HAProxy's parser, so the reason is sanitised to
`[A-Za-z0-9 _.:/=+-]` and follows `#` after a space. If `status_for` raises, we close the connection
without a reply: HAProxy treats an agent that does not answer as "no change" (not as a failure).
"""

from __future__ import annotations

import logging
import math
import re
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass

from llm_health.config import NAME_RE, ConfigError
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.store.rows import AdminState

log = logging.getLogger(__name__)

KV_FULL_WEIGHT_BELOW = 0.85   # at or below this KV usage: full weight
KV_FLOOR_WEIGHT = 10          # weight (percent) at KV usage 1.0 and above
MAX_NAME_BYTES = 256
READ_TIMEOUT = 2.0
MAX_REASON_CHARS = 120

_UNSAFE = re.compile(r"[^A-Za-z0-9 _.:/=+-]+")


@dataclass(frozen=True)
class AgentStatus:
    state: LifecycleState
    kv_usage: float | None = None   # 0..1, None = unknown
    reason: str = ""
    healthy: bool = True            # False when the exporter's verdict is stalled or down
    keep_up: bool = False           # answer `ready up W%` (dry run; a READY backend kept by the min_ready floor)
    admin: AdminState = AdminState.IN_SERVICE   # an operator's hold wins over everything else
    weight_cap: int = 100           # percent: a rollout's soaking canary is held at a reduced weight


StatusFor = Callable[[str], AgentStatus | None]


def weight_percent(kv_usage: float | None) -> int:
    """100 at KV usage <= 0.85, linear to KV_FLOOR_WEIGHT at 1.0, never below the floor."""
    if kv_usage is None or math.isnan(kv_usage) or kv_usage <= KV_FULL_WEIGHT_BELOW:
        return 100
    if kv_usage >= 1.0:
        return KV_FLOOR_WEIGHT
    frac = (kv_usage - KV_FULL_WEIGHT_BELOW) / (1.0 - KV_FULL_WEIGHT_BELOW)
    return max(KV_FLOOR_WEIGHT, round(100 - frac * (100 - KV_FLOOR_WEIGHT)))


def sanitize_reason(reason: str) -> str:
    """Only characters HAProxy keeps as plain text; never empty; no line breaks or word separators."""
    text = _UNSAFE.sub(" ", reason or "")
    text = " ".join(text.split())[:MAX_REASON_CHARS].strip()
    return text or "no reason given"


def takes_traffic(status: AgentStatus | None) -> bool:
    """Whether the backend should get new requests: the one rule, for HAProxy (`ready up W%`) and for
    Kubernetes readiness (GET /api/backends/<name>/readiness). In service, and READY and healthy or kept
    up (dry run, the min_ready floor); never an unknown backend."""
    if status is None or status.admin != AdminState.IN_SERVICE:
        return False
    return status.keep_up or (LifecycleState(status.state) == LifecycleState.READY and status.healthy)


def agent_reply(status: AgentStatus | None) -> str:
    """The one-line answer (without the newline) for a backend's status; None = unknown backend."""
    if status is None:
        return "down #unknown backend"
    state = LifecycleState(status.state)
    if status.admin == AdminState.RETIRED:
        return f"maint #{sanitize_reason(status.reason or 'retired')}"
    if status.admin == AdminState.DRAINED:
        operational = "up" if state == LifecycleState.READY and status.healthy else "down"
        return f"{operational} drain #{sanitize_reason(status.reason or 'drained')}"
    if takes_traffic(status):
        return f"ready up {min(weight_percent(status.kv_usage), max(1, status.weight_cap))}%"
    if state == LifecycleState.DRAINING:
        return "drain"
    default = "unhealthy" if state == LifecycleState.READY else state.value
    return f"down #{sanitize_reason(status.reason or default)}"


def reply_for_request(line: bytes, status_for: StatusFor) -> str:
    """Parse what HAProxy sent (the agent-send string) and build the answer."""
    name = line.decode("ascii", errors="replace").strip()
    if not NAME_RE.match(name):
        return agent_reply(None)
    return agent_reply(status_for(name))


class _Handler(socketserver.BaseRequestHandler):
    server: _AgentTCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(READ_TIMEOUT)
        data = b""
        try:
            while b"\n" not in data and len(data) < MAX_NAME_BYTES:
                chunk = sock.recv(MAX_NAME_BYTES)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pass  # answer with what we have (nothing sent = unknown backend)
        except OSError:
            return
        line = data.split(b"\n", 1)[0].split(b"\r", 1)[0]
        try:
            reply = reply_for_request(line, self.server.status_for)
        except Exception:  # noqa: BLE001 - never answer a guess: no reply = no change in HAProxy
            log.exception("agent-check: status lookup failed for %r", line[:64])
            return
        try:
            sock.sendall(reply.encode("ascii") + b"\n")
        except OSError:
            pass


class _AgentTCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], status_for: StatusFor) -> None:
        self.status_for = status_for
        super().__init__(address, _Handler)


class AgentCheckServer:
    """The listener, in a background thread. `port=0` picks a free port (see `.port`)."""

    def __init__(self, host: str, port: int, status_for: StatusFor) -> None:
        self._server = _AgentTCPServer((host, port), status_for)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> AgentCheckServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="agent-check", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> AgentCheckServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parse_listen(spec: str) -> tuple[str, int]:
    """`host:port` (the `remediator.agent_listen` setting) -> (host, port)."""
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"remediator.agent_listen: expected host:port, got {spec!r}")
    return host.strip("[]"), int(port)
