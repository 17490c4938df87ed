"""One OpenAI-compatible request, timed.

http.client rather than a higher-level client: each SSE line is read as soon as it arrives
(no read-ahead buffer waiting for more bytes), which is what makes time to first token
and the first-to-last token interval trustworthy.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..errors import UserError

USER_AGENT = "b70deploy-bench"


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    base_path: str  # without a trailing slash and without /v1
    # The key vLLM asks /v1 requests for (--api-key or VLLM_API_KEY): sent, never shown or written.
    api_key: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, url: str, api_key: str | None = None) -> Endpoint:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"{url!r} is not an http(s) URL", where="--endpoint", fix="e.g. http://127.0.0.1:8001")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise UserError(f"{url!r} has a bad port", where="--endpoint", fix="e.g. http://127.0.0.1:8001") from None
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[:-3]
        return cls(parts.scheme, parts.hostname, port, path, api_key or None)

    @property
    def auth(self) -> dict[str, str]:
        """vLLM answers 401 to a /v1 request without it (vllm/entrypoints/openai/server_utils.py:32-77, 387dcddc)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base_path}"

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)


class Cancel:
    """In-flight connections, so Ctrl-C can cut them instead of waiting for long generations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: set[http.client.HTTPConnection] = set()
        self.cancelled = False

    def add(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self.cancelled:
                raise InterruptedError("cancelled")
            self._conns.add(conn)

    def discard(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def cancel_all(self) -> None:
        with self._lock:
            self.cancelled = True
            conns = list(self._conns)
        for c in conns:
            if c.sock is not None:
                with contextlib.suppress(OSError):
                    c.sock.shutdown(socket.SHUT_RDWR)


@dataclass
class Timing:
    """What one request did. Times are seconds; t_* are offsets from the run's clock zero."""

    ok: bool = False
    status: int | None = None
    error: str | None = None
    t_start: float = 0.0
    ttft_s: float | None = None
    first_to_last_s: float | None = None
    total_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    content_chunks: int = 0
    finish_reason: str | None = None
    text: str = field(default="", repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("text")
        return d


def _delta_text(choice: dict[str, Any]) -> str:
    """The generated text of one streamed choice, completions or chat (content, reasoning, tool calls)."""
    if isinstance(choice.get("text"), str):
        return str(choice["text"])
    delta = choice.get("delta") or {}
    parts: list[str] = []
    for key in ("content", "reasoning_content", "reasoning"):
        v = delta.get(key)
        if isinstance(v, str):
            parts.append(v)
    for call in delta.get("tool_calls") or []:
        fn = call.get("function") or {}
        parts.append(str(fn.get("name") or "") + str(fn.get("arguments") or ""))
    return "".join(parts)


def stream(endpoint: Endpoint, path: str, body: dict[str, Any], *, clock_zero: float, timeout: float = 600.0,
           cancel: Cancel | None = None, keep_text: bool = False,
           headers: dict[str, str] | None = None) -> Timing:
    """POST `body` with stream=true and usage requested; time the token stream."""
    body = dict(body)
    body["stream"] = True
    opts = dict(body.get("stream_options") or {})
    opts["include_usage"] = True
    body["stream_options"] = opts
    payload = json.dumps(body).encode()
    t = Timing()
    conn = endpoint.connect(timeout)
    text: list[str] = []
    try:
        if cancel is not None:
            cancel.add(conn)
        conn.connect()
        start = time.perf_counter()
        t.t_start = start - clock_zero
        hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream", "User-Agent": USER_AGENT,
                **endpoint.auth}
        hdrs.update(headers or {})
        conn.request("POST", endpoint.base_path + path, body=payload, headers=hdrs)
        resp = conn.getresponse()
        t.status = resp.status
        if resp.status != 200:
            detail = resp.read(8000).decode("utf-8", "replace").strip().replace("\n", " ")
            t.error = f"HTTP {resp.status}: {detail}"  # whole: vLLM's 400 says the numbers the fix needs
            return t
        first: float | None = None
        last: float | None = None
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = time.perf_counter()
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if "error" in chunk and not chunk.get("choices"):
                t.error = f"server error in stream: {str(chunk['error'])[:300]}"
                return t
            for choice in chunk.get("choices") or []:
                piece = _delta_text(choice)
                if piece:
                    if first is None:
                        first = now
                    last = now
                    t.content_chunks += 1
                    if keep_text:
                        text.append(piece)
                if choice.get("finish_reason"):
                    t.finish_reason = choice["finish_reason"]
            usage = chunk.get("usage")
            if usage:
                t.prompt_tokens = usage.get("prompt_tokens")
                t.completion_tokens = usage.get("completion_tokens")
        end = time.perf_counter()
        t.total_s = end - start
        if first is None:
            t.error = "the stream carried no tokens"
            return t
        t.ttft_s = first - start
        t.first_to_last_s = (last or first) - first
        if t.completion_tokens is None:
            # No usage chunk: a chunk per token is the best guess (an undercount under speculative
            # decoding, where a chunk carries a whole step).
            t.completion_tokens = t.content_chunks
        t.ok = True
        return t
    except (OSError, http.client.HTTPException, InterruptedError) as e:
        t.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return t
    finally:
        t.text = "".join(text)
        if cancel is not None:
            cancel.discard(conn)
        conn.close()


def post_json(endpoint: Endpoint, path: str, body: dict[str, Any], *, timeout: float = 600.0,
              headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | None, bytes]:
    """A plain POST; returns (status, parsed JSON or None, raw body)."""
    conn = endpoint.connect(timeout)
    try:
        hdrs = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **endpoint.auth}
        hdrs.update(headers or {})
        conn.request("POST", endpoint.base_path + path, body=json.dumps(body).encode(), headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        return resp.status, parsed if isinstance(parsed, dict) else None, raw
    finally:
        conn.close()


def get(endpoint: Endpoint, path: str, *, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = endpoint.connect(timeout)
    try:
        conn.request("GET", endpoint.base_path + path, headers={"User-Agent": USER_AGENT, **endpoint.auth})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def get_json(endpoint: Endpoint, path: str, *, timeout: float = 10.0) -> Any:
    """GET a JSON document; None when unreachable, not 200 or not JSON."""
    try:
        status, raw = get(endpoint, path, timeout=timeout)
    except (OSError, http.client.HTTPException):
        return None
    if status != 200:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None
