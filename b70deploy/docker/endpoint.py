"""Which Docker Engine the current work talks to.

A node of an inventory may live behind ssh://, tcp:// with TLS, a unix socket or a Docker
context. Its endpoint is a small environment (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH
or DOCKER_CONTEXT) that `proc.run` adds to every subprocess (so `docker compose` targets it)
and that `engine.client()` reads (so the SDK does). It is a context variable rather than an
argument threaded through every call, so a rolling switch can work on several nodes at once,
one thread per node, each with its own endpoint; a thread starts with none (the local engine).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

_active: ContextVar[Mapping[str, str] | None] = ContextVar("b70deploy_docker_endpoint", default=None)


def current() -> dict[str, str]:
    """The endpoint environment in force here; empty for the local default engine."""
    return dict(_active.get() or {})


@contextmanager
def use(env: Mapping[str, str]) -> Iterator[None]:
    """Within the block, subprocesses and SDK clients target the engine `env` names."""
    token = _active.set(dict(env))
    try:
        yield
    finally:
        _active.reset(token)


def activate(env: Mapping[str, str]) -> None:
    """For the rest of this thread's context (a CLI process acting on one node)."""
    _active.set(dict(env) if env else None)
