"""A real uvicorn server on 127.0.0.1 (random free port) in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CountingApp:
    """ASGI wrapper counting HTTP requests per path, so tests can assert how often a client called."""

    def __init__(self, app):
        self.app = app
        self.calls: dict[str, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.calls[scope["path"]] = self.calls.get(scope["path"], 0) + 1
        await self.app(scope, receive, send)


@contextmanager
def serve(app, port: int | None = None):
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="on"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not t.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)


@contextmanager
def silent_server():
    """Accepts connections and never answers: a hung service."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    conns = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(sock.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in conns:
            c.close()
        sock.close()
