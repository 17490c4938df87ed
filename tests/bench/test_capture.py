"""The capture proxy: transparent (byte-identical bodies, streaming unbuffered) and fail-open."""

from __future__ import annotations

import errno
import http.client
import http.server
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from kit.serving import serving

from b70deploy.bench.capture import CaptureWriter, make_server, parse_listen, segments
from b70deploy.bench.client import Endpoint
from b70deploy.errors import UserError


@contextmanager
def proxy(upstream: ThreadingHTTPServer, writer: CaptureWriter) -> Iterator[int]:
    host, port = upstream.server_address[:2]
    try:
        with serving(make_server(("127.0.0.1", 0), Endpoint.parse(f"http://{host}:{port}"), writer)) as proxy_port:
            yield proxy_port
    finally:
        writer.close()


def fetch(port: int, method: str, path: str, body: dict | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes, list[float]]:
    """Status, the whole body, and the arrival time of each piece (seconds from the request)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    t0 = time.perf_counter()
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    parts, times = [], []
    while True:
        piece = resp.read1(65536)
        if not piece:
            break
        parts.append(piece)
        times.append(time.perf_counter() - t0)
    conn.close()
    return resp.status, b"".join(parts), times


REQUESTS = [
    ("POST", "/v1/chat/completions", {"model": "m1", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 6, "stream": True, "temperature": 0.3,
                                      "response_format": {"type": "json_object"}}),
    ("POST", "/v1/chat/completions", {"model": "m1", "messages": [{"role": "user", "content": "yo"}],
                                      "max_tokens": 3}),
    ("GET", "/v1/models", None),
    ("GET", "/legacy", None),
]


def test_bodies_byte_identical_with_and_without_proxy(sse_upstream: ThreadingHTTPServer, tmp_path: Path) -> None:
    direct_port = int(sse_upstream.server_address[1])
    writer = CaptureWriter(tmp_path / "cap")
    with proxy(sse_upstream, writer) as port:
        for method, path, body in REQUESTS:
            s1, b1, _ = fetch(direct_port, method, path, body)
            s2, b2, _ = fetch(port, method, path, body)
            assert (s1, b1) == (s2, b2), path
            assert b2, path
        writer.flush()
    lines = [json.loads(x) for p in segments(tmp_path / "cap") for x in p.read_text().splitlines()]
    captured = [r for r in lines if r["method"] == "POST"]
    assert [r["body"] for r in captured] == [REQUESTS[0][2], REQUESTS[1][2]]
    stream_rec = next(r for r in captured if r["body"].get("stream"))
    assert stream_rec["body"] == REQUESTS[0][2]
    assert stream_rec["response"]["status"] == 200 and stream_rec["response"]["streamed"] is True
    assert stream_rec["response"]["usage"]["completion_tokens"] == 6
    plain = next(r for r in captured if not r["body"].get("stream"))
    assert plain["response"]["usage"]["completion_tokens"] == 3
    assert not any(r["path"] == "/legacy" for r in lines), "only /v1 is captured"


def test_streaming_passes_through_unbuffered(sse_upstream: ThreadingHTTPServer, tmp_path: Path) -> None:
    body = {"model": "m1", "messages": [], "max_tokens": 4, "stream": True, "delay": 0.3}
    with proxy(sse_upstream, CaptureWriter(tmp_path / "cap")) as port:
        status, data, times = fetch(port, "POST", "/v1/chat/completions", body)
    assert status == 200 and data.count(b"data: ") == 6
    # the first token arrives while upstream is still sleeping between tokens (4 x 0.3 s)
    assert times[0] < 0.25, times
    assert len(times) >= 4, "pieces arrive one by one, not as one buffered body"


def test_authorization_is_forwarded_but_never_stored(sse_upstream: ThreadingHTTPServer, tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path / "cap")
    with proxy(sse_upstream, writer) as port:
        fetch(port, "POST", "/v1/completions", {"model": "m1", "prompt": "x", "max_tokens": 1},
              headers={"Authorization": "Bearer sekrit"})
        writer.flush()
    assert sse_upstream.seen[-1]["headers"]["Authorization"] == "Bearer sekrit"  # type: ignore[attr-defined]
    text = "".join(p.read_text() for p in segments(tmp_path / "cap"))
    assert "sekrit" not in text and "/v1/completions" in text


class _DiskFull(CaptureWriter):
    """Disk-full stand-in: every write raises ENOSPC like a full filesystem would."""

    def _write_line(self, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("case", ["dir-under-a-file", "dir-is-a-file", "disk-full"])
def test_fail_open_every_request_is_forwarded(sse_upstream: ThreadingHTTPServer, tmp_path: Path, case: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    # Root ignores permission bits, so an unwritable capture dir is simulated by making it
    # impossible to create (its parent is a regular file: ENOTDIR) or a regular file itself
    # (mkdir: EEXIST); a full disk by a writer whose writes raise ENOSPC.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder\n")
    if case == "dir-under-a-file":
        writer = CaptureWriter(blocker / "cap")
    elif case == "dir-is-a-file":
        writer = CaptureWriter(blocker)
    else:
        writer = _DiskFull(tmp_path / "cap")
    direct_port = int(sse_upstream.server_address[1])
    n_before = len(sse_upstream.seen)  # type: ignore[attr-defined]
    with proxy(sse_upstream, writer) as port:
        for _ in range(3):
            for method, path, body in REQUESTS:
                assert fetch(port, method, path, body)[:2] == fetch(direct_port, method, path, body)[:2]
        # The proxy queues a record once it has sent the response: the client may be done first.
        deadline = time.monotonic() + 10
        while writer.errors + writer.written < 9 and time.monotonic() < deadline:
            time.sleep(0.01)
        writer.flush()
        assert writer.errors == 9 and writer.written == 0  # 3 x (2 POST + GET /v1/models)
    assert len(sse_upstream.seen) - n_before == 12  # type: ignore[attr-defined]  # 6 direct + 6 proxied POSTs
    assert "requests are still forwarded" in caplog.text


def test_rotation_bounds_disk_use(tmp_path: Path) -> None:
    folder = tmp_path / "cap"
    writer = CaptureWriter(folder, segment_bytes=2000, max_bytes=8000)
    for i in range(200):
        writer.record({"i": i, "pad": "x" * 200})
    writer.flush()
    writer.close()
    segs = segments(folder)
    total = sum(p.stat().st_size for p in segs)
    assert writer.written == 200 and writer.errors == 0
    assert total <= 8000 + 2000 + 300, total
    last = [json.loads(x)["i"] for x in segs[-1].read_text().splitlines()]
    assert last[-1] == 199, "the newest records are kept"


def test_upstream_down_is_a_502_not_a_hang(tmp_path: Path) -> None:
    dead = ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # type: ignore[attr-defined]
    port_dead = int(dead.server_address[1])
    dead.server_close()
    writer = CaptureWriter(tmp_path / "cap")
    try:
        with serving(make_server(("127.0.0.1", 0), Endpoint.parse(f"http://127.0.0.1:{port_dead}"), writer)) as port:
            status, body, _ = fetch(port, "POST", "/v1/completions", {"prompt": "x"})
    finally:
        writer.close()
    assert status == 502 and b"unreachable" in body


def test_listen_defaults_to_loopback() -> None:
    assert parse_listen("8010") == ("127.0.0.1", 8010)
    assert parse_listen("0.0.0.0:9000") == ("0.0.0.0", 9000)
    with pytest.raises(UserError):
        parse_listen("localhost:x")
