"""GET /health through urllib (docker/probe.py): what requests.get(...).status_code gave, or None."""

from __future__ import annotations

import http.server
import socket
from collections.abc import Iterator

import pytest
from kit.serving import serving

from b70deploy.docker.probe import probe_health


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        codes = {"/health": 200, "/starting": 503, "/moved": 302}
        code = codes.get(self.path, 404)
        self.send_response(code)
        if code == 302:
            self.send_header("Location", "/health")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)) as port:
        yield f"http://127.0.0.1:{port}"


def test_the_status_code_of_any_answer(server: str) -> None:
    assert probe_health(f"{server}/health") == 200
    assert probe_health(f"{server}/starting") == 503  # vLLM while it boots: an answer, not None
    assert probe_health(f"{server}/nope") == 404
    assert probe_health(f"{server}/moved") == 200  # redirects followed, as requests.get does


def test_none_when_nothing_answers_http() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert probe_health(f"http://127.0.0.1:{port}/health") is None  # bound, not listening: refused
        s.listen()
        assert probe_health(f"http://127.0.0.1:{port}/health", timeout=0.3) is None  # never answers
    assert probe_health("not a url") is None
