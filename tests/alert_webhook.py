"""A webhook on 127.0.0.1 for the too-long-run alert's tests (http.server in a thread)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG_S = 3.0  # the hanging webhook's silence: longer than any timeout used below


class Webhook:
    """A local webhook server; ``mode``: ok, hang or 500. ``bodies``: what it received."""

    def __init__(self, mode: str):
        self.mode = mode
        self.bodies: list[dict] = []
        self.received_at: list[float] = []  # time.time() of each post
        self.hang_s = HANG_S
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                hook.received_at.append(time.time())
                length = int(self.headers.get("Content-Length", 0))
                hook.bodies.append(
                    {
                        "json": json.loads(self.rfile.read(length)),
                        "content_type": self.headers.get("Content-Type"),
                        "path": self.path,
                    }
                )
                if hook.mode == "hang":
                    hook.release.wait(hook.hang_s)
                code = 500 if hook.mode == "500" else 200
                try:
                    self.send_response(code)
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out first: what the hanging webhook is for

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T0/B0/secret-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
