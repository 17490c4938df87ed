"""Reading the node's secrets env file (e.g. HF_TOKEN) without ever echoing it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dotenv import dotenv_values

from ..errors import UserError
from .schema import ENV_KEY_RE


def load_secrets(path: Path | None) -> tuple[dict[str, str], list[str]]:
    """(values, warnings). The file must exist if configured; lax modes are a warning."""
    if path is None:
        return {}, []
    if not path.is_file():
        raise UserError("secrets_env_file not found", where=str(path),
                        fix="create it (mode 0600) or remove secrets_env_file from the node config")
    warnings = []
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        warnings.append(f"{path} is mode {mode:o}: others can read your tokens; chmod 600 it")
    values: dict[str, str] = {}
    for key, value in dotenv_values(path).items():
        if not ENV_KEY_RE.match(key):
            raise UserError(f"key {key!r} is not a variable name", where=str(path), fix="use NAME=value lines")
        if value is None:
            raise UserError(f"{key} has no value", where=str(path), fix=f"write {key}=<value>")
        if any(c in value for c in "\n\r\x00"):
            # Compose env files hold one value per line; a multi-line value would be cut.
            raise UserError(f"{key} has a multi-line value", where=str(path), fix=f"write {key} on one line")
        values[key] = value
    return values, warnings
