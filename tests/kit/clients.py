"""Clients of a node's port: a few threads asking for completions in a loop, counting the answers and
what failed (an HTTP status, or the exception's name), as an operator's clients would see a switch."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Clients:
    """A few clients asking the node's port for completions in a loop until stopped."""

    port: int
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ask(self) -> tuple[bool, str]:
        # Connection: close, so the server closes first: no client socket lingers in FIN_WAIT2
        # on the node's port for verify to count (the door-off switch must get past verify).
        body = json.dumps({"model": "qwen3-30b-a3b-w4a16", "prompt": "The capital of France is", "max_tokens": 4})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json", "Connection": "close"})
            status = conn.getresponse().status
            return status == 200, f"HTTP {status}"
        except (OSError, http.client.HTTPException) as e:
            return False, type(e).__name__
        finally:
            conn.close()

    def loop(self) -> None:
        while not self.stop.is_set():
            good, why = self.ask()
            with self.lock:
                if good:
                    self.ok += 1
                else:
                    self.failed.append(why)

    def answered(self, n: int, timeout: float = 30) -> None:
        """Until `n` requests in all were answered (the clients saw the node, not a fixed wait)."""
        deadline = time.monotonic() + timeout
        while self.ok < n:
            assert time.monotonic() < deadline, (self.ok, self.failed[:5])
            time.sleep(0.05)

    def during(self, work: Callable[[], Any], n: int = 3) -> None:
        threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        try:
            work()
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=150)
