"""A test's HTTP server answering on loopback from a thread, shut down and closed on exit
(also when the test fails)."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[int]:
    """`server` serving in a daemon thread; yields its port."""
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    try:
        yield int(server.server_address[1])  # type: ignore[index]
    finally:
        server.shutdown()
        server.server_close()
