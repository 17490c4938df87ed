"""Which environment values are secret, and how they are shown (never in clear)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

SECRET_KEY_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE|CREDENTIAL|AUTH)",
                           re.IGNORECASE)
ENV_LINE_RE = re.compile(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)(\s*=\s*)(.*)$")


def is_secret(key: str) -> bool:
    return bool(SECRET_KEY_RE.search(key))


def mask(value: str) -> str:
    """A stand-in that shows whether two secrets differ without revealing either."""
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"****(sha256:{digest})"


def mask_env_text(text: str, secret_keys: Collection[str] = ()) -> str:
    """Mask, line by line, the values of secret-looking keys and of `secret_keys` (every key
    that came from the node's secrets file, whatever its name)."""
    out = []
    for line in text.splitlines(keepends=True):
        m = ENV_LINE_RE.match(line.rstrip("\n"))
        if m and (is_secret(m.group(2)) or m.group(2) in secret_keys):
            nl = "\n" if line.endswith("\n") else ""
            line = f"{m.group(1)}{m.group(2)}{m.group(3)}{mask(m.group(4))}{nl}"
        out.append(line)
    return "".join(out)
