"""Which environment values are secret, and how they are shown (never in clear)."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..state.fsio import file_mode
from .filenames import COMPOSE_FILE

ENV_LINE_RE = re.compile(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)(\s*=\s*)(.*)$")
_PARTS = re.compile(r"[^A-Z0-9]+")
# Whole words of a name (HF_TOKEN, --api-key): a count of tokens (MAX_NUM_BATCHED_TOKENS,
# --enable-prompt-tokens-details) or a flag about tokens (--return-tokens-as-token-ids) is no secret.
_SECRET_WORDS = frozenset({"PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY",
                           # A proxy's basic or digest auth users (Traefik's `...basicauth.users=user:$$apr1$$...`,
                           # caddy-docker-proxy's `caddy.basicauth.bob`): password hashes, under any last word.
                           "BASICAUTH", "DIGESTAUTH"})
_SECRET_LAST = frozenset({"TOKEN", "AUTH"})        # HF_TOKEN, GITHUB_TOKEN, BASIC_AUTH; not TOKEN_IDS
_SECRET_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"), ("BASIC", "AUTH"),
                           ("DIGEST", "AUTH")})


def is_secret(key: str) -> bool:
    """Whether a variable or flag name (VLLM_API_KEY, hf_token, --api-key) holds a secret: its
    words, split at `_`, `-` and `.`, end in TOKEN or AUTH, include a password, credential,
    API/access/private key or basic/digest auth, or any word contains SECRET (CLIENT_SECRET,
    SECRETKEY)."""
    words = [w for w in _PARTS.split(key.upper()) if w]
    if not words:
        return False
    return (words[-1] in _SECRET_LAST or any(w in _SECRET_WORDS or "SECRET" in w for w in words)
            or any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words)))


def mask(value: str) -> str:
    """A stand-in that shows whether two secrets differ without revealing either: the sha256 of
    the value as the program reads it (unquoted), so one value has one fingerprint everywhere."""
    return mask_bytes(value.encode())


def mask_bytes(data: bytes) -> str:
    """mask() of a whole file's bytes (a private key), text or not."""
    return f"****(sha256:{hashlib.sha256(data).hexdigest()[:8]})"


_ESCAPED = re.compile(r"\\(.)")
_REFERENCE = re.compile(r"\$\{[^}]*\}")
# `KEY: value` in YAML (a compose file's environment or labels map), `- KEY=value` in their list
# form; a label's key is dotted (traefik.http.middlewares.auth.basicauth.users).
_YAML_MAP_RE = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_.-]*)(:[ \t]+)(\S.*?)\s*$")
_YAML_ITEM_RE = re.compile(r"^(\s*-\s+)([\"']?)([A-Za-z_][A-Za-z0-9_.-]*)(=)(.*?)(\2)\s*$")
# KEY=value inside free text (a log line, an error, an argv, a label): the value of a secret key is masked.
_INLINE_ENV_RE = re.compile(r"(?<![A-Za-z0-9_.-])((?:--)?[A-Za-z_][A-Za-z0-9_.-]*)=(\S+)")
MIN_VALUE = 6  # shorter values (a port, "true") would mask half of any text they stand in


def unquote(value: str) -> str:
    """An env-file or YAML value as the program reads it: 'single' is literal, "double" undoes
    its backslash escapes (render/files._env_q writes both); a bare value is stripped."""
    v = value.strip()
    if len(v) >= 2 and v[0] == v[-1] == "'":
        return v[1:-1].replace("''", "'") if "''" in v[1:-1] else v[1:-1]
    if len(v) >= 2 and v[0] == v[-1] == '"':
        return _ESCAPED.sub(lambda m: m.group(1), v[1:-1])
    return v


def is_reference(value: str) -> bool:
    """A value holding a `${VAR}` reference says where a secret is, not the secret: it stays in
    the compose file as the operator wrote it, and is shown as written."""
    return _REFERENCE.search(value) is not None


@dataclass(frozen=True)
class Secrets:
    """What is secret on a node beyond the name rule: keys marked secret whatever their name
    (the node's secrets file, a companion's `secrets:`) and the values they hold, masked
    wherever they stand in a text."""

    keys: frozenset[str] = frozenset()
    values: frozenset[str] = frozenset()

    def __or__(self, other: Secrets) -> Secrets:
        return Secrets(self.keys | other.keys, self.values | other.values)

    def is_secret(self, key: str) -> bool:
        return is_secret(key) or key in self.keys

    def text(self, text: str) -> str:
        """`text` fit to print: every known secret value, the value of every secret key in an
        env file's `KEY=value`, a compose file's `KEY: value` or `- KEY=value`, and free text's
        `KEY=value`, each as mask() of the unquoted value."""
        return "".join(self._line(line) for line in self.values_in(text).splitlines(keepends=True))

    def values_in(self, text: str) -> str:
        """`text` with every known secret value masked (what the CLI's streams pass through)."""
        for value in sorted((v for v in self.values if len(v) >= MIN_VALUE), key=len, reverse=True):
            if value in text:
                text = text.replace(value, mask(value))
        return text

    def tree(self, data: Any) -> Any:
        """A JSON document fit to print: every string in it through text()."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {k: mask(unquote(v)) if isinstance(v, str) and self._env_key(str(k)) and not _masked(v)
                    and not is_reference(v) else self.tree(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return [self.tree(v) for v in data]
        return data

    def _env_key(self, key: str) -> bool:
        """A document's key that is a secret variable's name (HF_TOKEN), not a setting about
        secrets (secrets_env_file)."""
        return key in self.keys or (key.isupper() and is_secret(key))

    def keys_in(self, text: str) -> list[str]:
        """The keys whose values text() masks in `text`, in order, each once."""
        keys: list[str] = []
        for line in text.splitlines():
            found = self._secret_at(line)
            named = [found[0]] if found else [m.group(1) for m in _INLINE_ENV_RE.finditer(line)
                                              if self._inline(m) != m.group(0)]
            keys += [k.lstrip("-") for k in named if k.lstrip("-") not in keys]
        return keys

    def _secret_at(self, body: str) -> tuple[str, re.Match[str], int] | None:
        """(key, match, value group) of a `KEY=value`, `- KEY=value` or `KEY: value` line whose
        key is secret and whose value is a clear one (not masked, not a `${VAR}` reference)."""
        for rx, key_at, value_at in ((ENV_LINE_RE, 2, 4), (_YAML_ITEM_RE, 3, 5), (_YAML_MAP_RE, 2, 4)):
            m = rx.match(body)
            if m and self.is_secret(m.group(key_at)):
                value = m.group(value_at)
                if _masked(value) or is_reference(unquote(value)) or value.startswith(("#", "|", ">")):
                    return None
                return m.group(key_at), m, value_at
        return None

    def _line(self, line: str) -> str:
        body = line.rstrip("\r\n")
        end = line[len(body):]
        found = self._secret_at(body)
        if found is not None:
            _key, m, at = found
            return body[:m.start(at)] + mask(unquote(m.group(at))) + body[m.end(at):] + end
        return _INLINE_ENV_RE.sub(self._inline, body) + end

    def _inline(self, m: re.Match[str]) -> str:
        key, value = m.group(1), m.group(2)
        if not self.is_secret(key.lstrip("-")) or _masked(value) or is_reference(unquote(value)):
            return m.group(0)
        return f"{key}={mask(unquote(value))}"


NONE = Secrets()


def secret_variables(environment: Mapping[str, str], marked: Collection[str] = (),
                     values: Collection[str] = ()) -> dict[str, str]:
    """The variables of an environment that hold a secret in clear: a secret name, a key
    `marked` secret, or a value holding one of `values`; never a `${VAR}` reference."""
    known = Secrets(keys=frozenset(marked))
    inside = [s for s in values if len(s) >= MIN_VALUE]
    return {k: v for k, v in environment.items() if not is_reference(v)
            and (known.is_secret(k) or any(s in v for s in inside))}


def _masked(value: str) -> bool:
    return unquote(value).startswith("****(sha256:")


def mask_env_text(text: str, secret_keys: Collection[str] = ()) -> str:
    """Mask, line by line, the values of secret-looking keys and of `secret_keys` (every key
    that came from the node's secrets file, whatever its name)."""
    return Secrets(keys=frozenset(secret_keys)).text(text)


def holds_secret(data: bytes, secrets: Secrets = NONE) -> bool:
    """Whether a file's bytes hold a secret in clear: what masking would change."""
    text = data.decode(errors="replace")
    return secrets.text(text) != text


def private_mode(name: str, data: bytes, source: int | None = None) -> int:
    """A deployed or stored file's mode: state.fsio.file_mode's by name (env files 0600), 0600 for a
    compose file that holds a secret in clear (a hand-made one with a password inline), and 0600 for
    a file whose `source` (the mode of the operator's file it was read from, or the one a revision
    recorded) lets others not read it (0600, 0400, 0640): a private key bound into a companion is the
    operator's secret whatever its name, and a copy is never more readable than its source. A
    bind-mounted file otherwise stays readable (the container's user must read it), and keeps its
    owner's execute bit (a script the container runs)."""
    compose = name.endswith((".yml", ".yaml"))
    private = source is not None and not source & 0o004
    mode = 0o600 if private or file_mode(name) == 0o600 or (compose and holds_secret(data)) else file_mode(name)
    return mode | (mode & 0o444) >> 2 if source is not None and source & 0o100 else mode


def opaque(*modes: Mapping[str, int], compose_files: Collection[str] = ()) -> frozenset[str]:
    """The files an output shows by fingerprint only, never a line of: those any of `modes` says
    others may not read (an operator's key kept 0600), but env files and compose files, whose
    secret values masking finds by their keys (a diff of them still shows which key changed)."""
    return frozenset(n for m in modes for n, mode in m.items() if not mode & 0o004 and not n.endswith(".env")
                     and n != COMPOSE_FILE and n not in compose_files)


def modes(files: Mapping[str, bytes], sources: Mapping[str, int] | None = None) -> dict[str, int]:
    """private_mode of each file, from its source's mode where `sources` has one."""
    return {name: private_mode(name, data, (sources or {}).get(name)) for name, data in files.items()}
