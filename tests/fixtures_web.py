"""The dashboard served for a test: a real uvicorn server on a free loopback port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fixtures_cluster import free_port

from harness.web.app import create_app

LOOPBACK = "127.0.0.1"


@contextmanager
def serving(url: str, token: str | None = None) -> Iterator[str]:
    """The dashboard of ``url`` on a free loopback port, served by uvicorn in a thread."""
    port = free_port(LOOPBACK)
    server = uvicorn.Server(uvicorn.Config(create_app(url, token), host=LOOPBACK, port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
