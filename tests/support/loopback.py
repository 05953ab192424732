"""A threaded HTTP server on 127.0.0.1 and a free port, for the tests that play a backend, a proxy or
a receiver. One place for the start and stop lines six test modules repeated."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Loopback:
    """Serves `handler` from a daemon thread until `stop()`; `url` is http://127.0.0.1:PORT."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], poll_interval: float = 0.05) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": poll_interval},
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
