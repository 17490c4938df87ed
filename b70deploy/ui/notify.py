"""Delivering events to the node's receivers, fail-open.

Each receiver (a webhook, the command) has its own queue and thread, so events reach it in
order and a receiver that hangs delays no other receiver and no deploy step. An attempt is
bounded by notify.timeout; tenacity retries a failed attempt notify.retries times. `close`
waits for the queues at most notify.timeout in all: that is the most a receiver can add to a
command. Whatever failed or was still unsent is written to the audit log, never raised.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
from tenacity import Retrying, stop_after_attempt, wait_exponential

from ..config.node import Node
from ..config.schema import Notify
from ..state.audit import AuditLog

Deliver = Callable[[dict[str, Any]], None]  # one attempt; raises on failure
_STOP = object()


class DeliveryFailed(Exception):
    pass


def webhook(url: str, timeout: float) -> Deliver:
    def post(body: dict[str, Any]) -> None:
        try:
            resp = requests.post(url, json=body, timeout=timeout)
        except requests.Timeout:
            raise DeliveryFailed(f"no answer in {timeout:g} s") from None
        except requests.RequestException as e:  # its text names the URL, which may hold a token
            raise DeliveryFailed(type(e).__name__) from None
        if resp.status_code >= 300:
            raise DeliveryFailed(f"HTTP {resp.status_code}")
    return post


def command(argv: list[str], timeout: float) -> Deliver:
    def run(body: dict[str, Any]) -> None:
        try:
            done = subprocess.run(argv, input=json.dumps(body).encode(), capture_output=True,  # noqa: S603 - argv list
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise DeliveryFailed(f"did not finish in {timeout:g} s") from None
        except OSError as e:
            raise DeliveryFailed(f"cannot run it: {e.strerror}") from None
        if done.returncode != 0:
            raise DeliveryFailed(f"exit {done.returncode}")
    return run


def receiver_name(url: str) -> str:
    """A webhook as the audit log names it: scheme and host only (the path may be a token)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


@dataclass
class Receiver:
    name: str
    deliver: Deliver
    retries: int
    audit: AuditLog
    queue: queue.Queue[Any] = field(default_factory=queue.Queue)
    unsent: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    def put(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.unsent.append(str(event.get("event")))
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name=f"notify {self.name}", daemon=True)
            self.thread.start()
        self.queue.put(event)

    def _work(self) -> None:
        while (event := self.queue.get()) is not _STOP:
            try:
                Retrying(stop=stop_after_attempt(self.retries + 1), wait=wait_exponential(multiplier=0.2, max=2),
                         reraise=True)(self.deliver, event)
            except Exception as e:
                self.audit.record("notify", "failed", event=event.get("event"), receiver=self.name,
                                  error=str(e)[:300])
            with self.lock:
                self.unsent.remove(str(event.get("event")))

    def finish(self, deadline: float) -> None:
        if self.thread is None:
            return
        self.queue.put(_STOP)
        self.thread.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            left = list(self.unsent)
        if left:
            self.audit.record("notify", "gave up", receiver=self.name, events=left,
                              error="the receiver did not finish within notify.timeout")


class Notifier:
    """The node's receivers; `send` never blocks, `close` waits at most notify.timeout."""

    def __init__(self, cfg: Notify, audit: AuditLog) -> None:
        self.cfg = cfg
        self.receivers = [Receiver(receiver_name(url), webhook(url, cfg.timeout), cfg.retries, audit)
                          for url in cfg.webhooks]
        if cfg.command:
            self.receivers.append(Receiver(os.path.basename(cfg.command[0]), command(cfg.command, cfg.timeout),
                                           cfg.retries, audit))

    @classmethod
    def of(cls, node: Node) -> Notifier:
        return cls(node.config.notify, AuditLog(node.state_dir))

    def send(self, event: dict[str, Any]) -> None:
        for r in self.receivers:
            r.put(event)

    def close(self) -> None:
        deadline = time.monotonic() + self.cfg.timeout
        for r in self.receivers:
            r.finish(deadline)
