"""Which environment values are secret, and how they are shown (never in clear)."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Collection

ENV_LINE_RE = re.compile(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)(\s*=\s*)(.*)$")
_PARTS = re.compile(r"[^A-Z0-9]+")
# Whole words of a name (HF_TOKEN, --api-key): a count of tokens (MAX_NUM_BATCHED_TOKENS,
# --enable-prompt-tokens-details) or a flag about tokens (--return-tokens-as-token-ids) is no secret.
_SECRET_WORDS = frozenset({"PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY"})
_SECRET_LAST = frozenset({"TOKEN", "AUTH"})        # HF_TOKEN, GITHUB_TOKEN, BASIC_AUTH; not TOKEN_IDS
_SECRET_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY")})


def is_secret(key: str) -> bool:
    """Whether a variable or flag name (VLLM_API_KEY, hf_token, --api-key) holds a secret: its
    words, split at `_`, `-` and `.`, end in TOKEN or AUTH, include a password, credential or
    API/access/private key, or any word contains SECRET (CLIENT_SECRET, SECRETKEY)."""
    words = [w for w in _PARTS.split(key.upper()) if w]
    if not words:
        return False
    return (words[-1] in _SECRET_LAST or any(w in _SECRET_WORDS or "SECRET" in w for w in words)
            or any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words)))


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
