"""Fixtures for the bench tests: a tiny streaming upstream (for the capture proxy) that runs
in-process on a free loopback port."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kit.serving import serving


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
    with serving(srv):
        yield srv


# ---------------------------------------------------------------- the simulated vLLM server

import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@dataclass
class SimServer:
    url: str
    name: str
    prefill_tps: float
    decode_tps: float
    alpha: float
    proc: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_sim(name: str, *, prefill_tps: float, decode_tps: float, alpha: float = 0.04,
               speculative: str | None = None, accept_rate: float | None = None,
               log_dir: Path, max_model_len: int = 32768) -> SimServer:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "B70SIM_BOOT_SECONDS": "0.1",
           "B70SIM_PREFILL_TPS": str(prefill_tps), "B70SIM_DECODE_TPS": str(decode_tps),
           "B70SIM_BATCH_ALPHA": str(alpha)}
    if accept_rate is not None:
        env["B70SIM_SPEC_ACCEPT_RATE"] = str(accept_rate)
    argv = [sys.executable, "-m", "b70deploy.sim.server", "serve", "/models/Qwen3-30B-A3B-W4A16",
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", name,
            "--max-model-len", str(max_model_len), "--dtype", "float16", "--kv-cache-dtype", "fp8"]
    if speculative:
        argv += ["--speculative-config", speculative]
    log = open(log_dir / f"sim-{name}-{port}.log", "wb")  # noqa: SIM115  (closed when the process ends)
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sim exited {proc.returncode}: {(log_dir / log.name).read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("sim never became healthy")
    return SimServer(url, name, prefill_tps, decode_tps, alpha, proc)


@pytest.fixture
def sim_factory(tmp_path: Path) -> Iterator[Callable[..., SimServer]]:
    """Start sim servers as host processes on free loopback ports; all are stopped after the test."""
    started: list[SimServer] = []

    def start(name: str = "sim", **kw: Any) -> SimServer:
        s = _start_sim(name, log_dir=tmp_path, **kw)
        started.append(s)
        return s

    try:
        yield start
    finally:
        for s in started:
            s.proc.terminate()
            try:
                s.proc.wait(5)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait()
