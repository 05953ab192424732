"""The one base for the small stdlib HTTP servers (the simulator, the benchmarks' page servers, the
tests' stand-ins): no access log, and an answer is always whole (status, headers, length, body).

`QuietHandler.reply()` writes the Content-Length of the body it sends, so keep-alive clients
(`protocol_version = "HTTP/1.1"`) never wait for a close, and a HEAD request gets the headers of the
GET without the body. A client that goes away before its answer is written is no error of the server's:
nothing is printed (the stdlib server printed a traceback for each, into the logs of passing test runs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler without the access log, with `reply()` and `reply_json()`."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        return

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True      # the client left before its answer: nobody to answer

    def reply(self, status: int, body: bytes | str = b"", content_type: str | None = None,
              headers: Mapping[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def reply_json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        self.reply(status, json.dumps(payload).encode(), "application/json", headers)
