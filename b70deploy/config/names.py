"""Names that come from users and later become file names or compose project names."""

from __future__ import annotations

import re

from ..errors import UserError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# A Compose service's name as Compose takes it (compose-go schema/compose-spec.json at 00356255:
# `^[a-zA-Z0-9._-]+$`), with a letter or digit first: naptha-node's vLLM service is `Qwen2.5-7B-Instruct`.
SERVICE_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$")
MAX_NAME = 63


def is_valid_name(name: str) -> bool:
    return bool(NAME_RE.match(name)) and len(name) <= MAX_NAME and ".." not in name


def check_name(name: str, *, what: str = "name", where: str = "") -> str:
    """Return `name` if it is safe to use as a path component, else raise UserError."""
    if not is_valid_name(name):
        raise UserError(
            f"{what} {name!r} is not allowed",
            where=where,
            fix=f"use lowercase letters, digits, '.', '_' or '-', starting with a letter or "
            f"digit, at most {MAX_NAME} characters",
        )
    return name
