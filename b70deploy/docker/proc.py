"""Running argv lists (never a shell string) and turning failures into OperationErrors."""

from __future__ import annotations

import os
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
        raise OperationError(f"{' '.join(argv[:3])} {' '.join(argv[-3:])} failed (exit {result.returncode}): "
                             f"{last_line(result.stderr)}",
                             fix="run that docker command by hand for its full output")
    return result


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"
