"""Fixtures for the bench tests: a tiny streaming upstream (for the capture proxy) that runs
in-process on a free loopback port."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    chunk_delay = 0.005

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "m1", "object": "model"}]})
        elif self.path == "/legacy":
            # HTTP/1.0-style body delimited by closing the connection
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"close-delimited body\n")
            self.close_connection = True
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.server.seen.append({"path": self.path, "body": body, "headers": dict(self.headers)})  # type: ignore[attr-defined]
        n = int(body.get("max_tokens", 5))
        if not body.get("stream"):
            self._json(200, {"id": "x", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "tok " * n}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        for i in range(n):
            c = {"id": "x", "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
            chunk(b"data: " + json.dumps(c).encode() + b"\n\n")
            time.sleep(float(body.get("delay", self.chunk_delay)))
        chunk(b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d,"total_tokens":%d}}\n\n'
              % (n, n + 7))
        chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _json(self, code: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def sse_upstream() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    srv.daemon_threads = True
    srv.seen = []  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
