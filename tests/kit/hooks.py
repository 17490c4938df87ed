"""A webhook receiver on loopback for notification tests: records the JSON bodies it is sent,
and answers 200, answers 500, or hangs (until the test ends) depending on the path."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kit.serving import serving


@dataclass
class Hooks:
    port: int
    bodies: list[dict[str, Any]] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def url(self, mode: str) -> str:
        """mode: ok (200), fail (500) or hang (never answers)."""
        return f"http://127.0.0.1:{self.port}/{mode}/token-in-the-path"

    def events(self) -> list[str]:
        with self.arrived:
            return [str(b.get("event")) for b in self.bodies]

    def wait_for(self, event: str, timeout: float) -> dict[str, Any]:
        with self.arrived:
            ok = self.arrived.wait_for(lambda: any(b.get("event") == event for b in self.bodies), timeout)
            assert ok, f"no {event} in {timeout} s; got {[b.get('event') for b in self.bodies]}"
            return next(b for b in self.bodies if b.get("event") == event)


@contextmanager
def receiver() -> Iterator[Hooks]:
    hooks: Hooks

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            mode = self.path.strip("/").split("/", 1)[0]
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with hooks.arrived:
                hooks.hits[mode] = hooks.hits.get(mode, 0) + 1
                if mode == "ok":
                    hooks.bodies.append(json.loads(body))
                hooks.arrived.notify_all()
            if mode == "hang":
                hooks.done.wait()
                return
            self.send_response(200 if mode == "ok" else 500)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with serving(server) as port:
        hooks = Hooks(port=port)
        try:
            yield hooks
        finally:
            hooks.done.set()  # a hanging answer ends, so the server can shut down
