"""A gunicorn gthread worker that slow clients cannot starve.

gunicorn's gthread worker hands every accepted connection to a pool thread, which then blocks
reading the request: a client dripping its headers (or body) one byte at a time holds a thread for
as long as it likes, and `threads` such clients starve /webhook and /healthz (issue 12, finding 5).
Here every request must arrive whole (headers and a body up to `max_body_bytes`) within
`request_timeout` seconds of the thread picking the connection up; otherwise the connection is shut
down and the thread is free again. The body is read before the app runs, so the app itself is never
cut off. Together with enough threads (`remediator.threads`), a handful of slow or malicious
clients cost a few threads for a few seconds each.
"""

from __future__ import annotations

import io
import socket
import threading
from typing import Any

from gunicorn.http.body import Body
from gunicorn.workers.gthread import ThreadWorker


def _cut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class GuardedThreadWorker(ThreadWorker):
    request_timeout: float = 10.0      # set by the server before the workers fork
    max_body_bytes: int = 1_048_576

    def handle(self, conn: Any) -> Any:
        timer = threading.Timer(self.request_timeout, _cut, (conn.sock,))
        timer.daemon = True
        conn.llm_health_timer = timer
        timer.start()
        try:
            return super().handle(conn)
        finally:
            timer.cancel()

    def handle_request(self, req: Any, conn: Any) -> Any:
        timer = getattr(conn, "llm_health_timer", None)
        length = req.headers and next((v for k, v in req.headers if k == "CONTENT-LENGTH"), None)
        chunked = any(k == "TRANSFER-ENCODING" and "chunked" in v.lower() for k, v in req.headers)
        if chunked or (length and length.isdigit() and 0 < int(length) <= self.max_body_bytes):
            data = req.body.read(self.max_body_bytes + 1)   # under the deadline
            req.body = Body(io.BytesIO(data))
        if timer is not None:
            timer.cancel()                                 # the app may take its time
        return super().handle_request(req, conn)
