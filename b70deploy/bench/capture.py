"""A fail-open capture proxy for /v1: tee each request body (and response metadata) to disk,
always forward.

Never break production for a measurement: the capture path runs on its own thread behind a
bounded queue, every error in it is logged and counted, and the request goes through
regardless. Responses stream through unbuffered (each piece is written to the client as it
arrives from upstream). Disk use is bounded: JSONL segments rotate at a size, and the oldest
segments are deleted past a total.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ipaddress
import json
import logging
import queue
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import UserError
from .client import Endpoint

log = logging.getLogger("b70deploy.capture")

SEGMENT_PREFIX = "capture-"
SEGMENT_SUFFIX = ".jsonl"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length"}
# Request headers worth keeping with a capture; credentials never are.
KEPT_REQUEST_HEADERS = ("content-type", "user-agent", "accept")
TAIL_BYTES = 16384


def parse_listen(text: str) -> tuple[str, int]:
    """'PORT' or 'HOST:PORT'; a bare port binds loopback."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
        ipaddress.ip_address(host)
    except ValueError:
        raise UserError(f"{text!r} is not HOST:PORT with an IP address", where="--listen",
                        fix="e.g. 127.0.0.1:8010") from None
    if not 0 <= p <= 65535:
        raise UserError(f"port {p} is out of range", where="--listen", fix="e.g. 127.0.0.1:8010")
    return host, p


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


class CaptureWriter:
    """Appends records as JSON lines to rotating segments. `record` never raises.

    Not state/fsio.append_jsonl: that opens, fsyncs and closes per line to make a state log
    crash-proof; a capture keeps one segment open and leaves flushing to the OS, so a busy
    proxy's writer keeps up (a capture lost to a power cut costs a few samples, not state).
    """

    def __init__(self, folder: Path, *, segment_bytes: int = 64 << 20, max_bytes: int = 1 << 30,
                 queue_size: int = 1000) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.written = 0
        self.errors = 0
        self.dropped = 0
        self._fh: BinaryIO | None = None
        self._size = 0
        self._seq = 0
        self._last_log = 0.0
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._drain, name="b70capture-writer", daemon=True)
        self._thread.start()

    # -- called from request threads: must be cheap and must not raise
    def record(self, rec: dict[str, Any]) -> None:
        try:
            self._q.put_nowait(rec)
        except queue.Full:
            self.dropped += 1
            self._complain("capture queue full (disk too slow?); record dropped")

    def close(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(queue.Full):
            self._q.put(None, timeout=timeout)
        self._thread.join(timeout)
        self._close_segment()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until queued records are written (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    # -- the writer thread
    def _drain(self) -> None:
        while True:
            rec = self._q.get()
            try:
                if rec is None:
                    return
                self._write_line((json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode())
                self.written += 1
            except Exception as e:  # fail open: whatever happens here, serving goes on
                self.errors += 1
                self._close_segment()
                self._complain(f"capture write failed: {type(e).__name__}: {e}")
            finally:
                self._q.task_done()

    def _complain(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_log >= 30.0 or self.errors + self.dropped <= 1:
            self._last_log = now
            log.warning("%s (errors so far: %d, dropped: %d); requests are still forwarded",
                        message, self.errors, self.dropped)

    def _write_line(self, data: bytes) -> None:
        if self._fh is None or self._size >= self.segment_bytes:
            self._open_segment()
        assert self._fh is not None
        self._fh.write(data)
        self._fh.flush()
        self._size += len(data)

    def _open_segment(self) -> None:
        self._close_segment()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        path = self.folder / f"{SEGMENT_PREFIX}{stamp}-{self._seq:06d}{SEGMENT_SUFFIX}"
        self._fh = open(path, "ab")  # noqa: SIM115  (held open across records; closed on rotation)
        self._size = 0
        self._enforce_budget(keep=path)

    def _close_segment(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None

    def _enforce_budget(self, keep: Path) -> None:
        """Delete the oldest segments until the folder is under max_bytes (the open one stays)."""
        segs = sorted(segments(self.folder), key=lambda p: (p.stat().st_mtime, p.name))
        total = sum(p.stat().st_size for p in segs)
        for p in segs:
            if total + self.segment_bytes <= self.max_bytes or p == keep:
                break
            size = p.stat().st_size
            p.unlink()
            total -= size
            log.info("capture rotation: removed %s (%d bytes) to stay under %d bytes", p.name, size, self.max_bytes)


def segments(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(SEGMENT_PREFIX) and p.name.endswith(SEGMENT_SUFFIX))


def _usage_from(content_type: str, tail: bytes, whole: bytes | None) -> dict[str, Any] | None:
    """usage from a JSON body, or from the last SSE chunk that carries it."""
    if whole is not None and "json" in content_type:
        doc = json.loads(whole)
        u = doc.get("usage") if isinstance(doc, dict) else None
        return u if isinstance(u, dict) else None
    for line in reversed(tail.split(b"\n")):
        line = line.strip()
        if line.startswith(b"data:") and b'"usage"' in line:
            with contextlib.suppress(ValueError):
                u = json.loads(line[5:]).get("usage")
                if isinstance(u, dict):
                    return u
    return None


@dataclass
class ProxyConfig:
    upstream: Endpoint
    writer: CaptureWriter
    timeout: float = 1800.0


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "b70deploy-capture"
    config: ProxyConfig  # set on a subclass by make_server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._proxy()

    def do_POST(self) -> None:
        self._proxy()

    def do_PUT(self) -> None:
        self._proxy()

    def do_DELETE(self) -> None:
        self._proxy()

    def do_HEAD(self) -> None:
        self._proxy()

    def do_OPTIONS(self) -> None:
        self._proxy()

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _proxy(self) -> None:
        cfg = self.config
        started = time.perf_counter()
        body = self._read_body()
        capture = self.path.startswith("/v1/") or self.path == "/v1"
        meta: dict[str, Any] = {"status": None, "content_type": None, "bytes": 0, "ttfb_s": None,
                                "duration_s": None, "streamed": False, "usage": None, "error": None}
        tail = b""
        whole: bytes | None = b""
        up = cfg.upstream.connect(cfg.timeout)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Host"] = f"{cfg.upstream.host}:{cfg.upstream.port}"
            headers["Content-Length"] = str(len(body))
            try:
                up.request(self.command, cfg.upstream.base_path + self.path, body=body, headers=headers)
                resp = up.getresponse()
            except (OSError, http.client.HTTPException) as e:
                meta["error"] = f"upstream: {type(e).__name__}: {e}"
                self._send_error(502, f"upstream {cfg.upstream.url} unreachable: {type(e).__name__}")
                meta["status"] = 502
                return
            meta["status"] = resp.status
            ctype = resp.getheader("Content-Type") or ""
            meta["content_type"] = ctype
            length = resp.getheader("Content-Length")
            chunked_out = length is None and self.request_version == "HTTP/1.1" and self.command != "HEAD"
            self.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            if length is not None:
                self.send_header("Content-Length", length)
            elif chunked_out:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            meta["streamed"] = length is None
            if self.command == "HEAD":
                return
            while True:
                piece = resp.read1(65536)
                if not piece:
                    break
                if meta["ttfb_s"] is None:
                    meta["ttfb_s"] = time.perf_counter() - started
                meta["bytes"] += len(piece)
                if chunked_out:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                else:
                    self.wfile.write(piece)
                self.wfile.flush()
                if capture:
                    tail = (tail + piece)[-TAIL_BYTES:]
                    if whole is not None:
                        whole = whole + piece if len(whole) + len(piece) <= (1 << 20) else None
            if chunked_out:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError) as e:
            meta["error"] = f"client went away: {type(e).__name__}"
            self.close_connection = True
        except (OSError, http.client.HTTPException) as e:
            meta["error"] = f"upstream: {type(e).__name__}: {e}"
            self.close_connection = True
        finally:
            up.close()
            meta["duration_s"] = time.perf_counter() - started
            if capture:
                self._tee(body, meta, tail, whole)

    def _send_error(self, code: int, message: str) -> None:
        data = json.dumps({"error": {"message": message, "type": "proxy_error", "code": code}}).encode()
        self.send_response_only(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _tee(self, body: bytes, meta: dict[str, Any], tail: bytes, whole: bytes | None) -> None:
        """Build the record and hand it to the writer; nothing here may break the request."""
        try:
            with contextlib.suppress(Exception):
                meta["usage"] = _usage_from(meta.get("content_type") or "", tail, whole)
            # UTC to the millisecond, not state/stamps.now_iso (seconds): many requests share a second.
            rec: dict[str, Any] = {
                "v": 1, "id": uuid.uuid4().hex, "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "method": self.command, "path": self.path,
                "headers": {k: self.headers[k] for k in KEPT_REQUEST_HEADERS if self.headers.get(k)},
                "response": meta,
            }
            try:
                rec["body"] = json.loads(body) if body else None
            except ValueError:
                rec["body_b64"] = base64.b64encode(body).decode()
            self.config.writer.record(rec)
        except Exception as e:  # fail open
            log.warning("capture of %s %s failed: %s; request was forwarded", self.command, self.path, e)


class CaptureServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up is routine for a proxy: one log line, no traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("client %s: %s", client_address, exc)
        else:
            log.warning("proxy error for %s: %s: %s", client_address, type(exc).__name__, exc)


def make_server(listen: tuple[str, int], upstream: Endpoint, writer: CaptureWriter, *,
                timeout: float = 1800.0) -> CaptureServer:
    handler = type("BoundProxyHandler", (ProxyHandler,), {"config": ProxyConfig(upstream, writer, timeout)})
    return CaptureServer(listen, handler)
