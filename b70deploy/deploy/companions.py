"""Which companions a stop-first drain stops, and which keep running through it.

The drain stops the companions so that no client of vLLM sends it a request while it is swapped:
the idle check after it (steps.py `_verify`) counts live connections on vLLM's port, and a client
companion left running would hold them or fail its users mid-request. A companion that cannot be a
client has no reason to stop, and stopping it costs: naptha-node's LiteLLM waits for its Postgres
(`depends_on: condition: service_healthy`, a `pg_isready` check every 30 s), so every switch and
rollback that restarts the database adds its health interval to the router's outage (issue 35).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dotenv import dotenv_values

from ..config.compose_folder import env_files_of, mount_of, parse_compose, references
from ..render.files import COMPOSE_FILE

_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_VALUE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ENV = ".env"


def kept_running(new: Mapping[str, bytes], old: Mapping[str, bytes] | None, *, compose_files: Sequence[str],
                 vllm: str, companions: Sequence[str]) -> tuple[str, ...]:
    """The companions a drain leaves running, decided from the deploy dir's compose files alone (the
    new revision's, `new`, and what runs now, `old`), conservatively: when in doubt a companion stops.

    A companion keeps running only if, in both files:
    - another companion `depends_on` it (a backing service others wait for: a database, a queue), and
      everything it depends on keeps running too (so never vllm, directly or through others);
    - nothing it is made of names vllm or the door in front of it (their service names, container_name,
      hostname, network aliases; case-insensitive, as a host name) nor their ports after a colon
      (":8000"): its whole service definition (command, entrypoint, environment, healthcheck, links,
      network_mode, every key but `image`: the engine pulls it, the container never reaches it), the .env
      values of the variables it uses, and the bytes of every file it reads (env_file, binds);
    - every file it reads is one the deploy dir holds (a bind or env_file elsewhere, `configs`, `secrets`
      or a `build` could name vllm unseen), and every variable it uses is in the .env;
    - its definition and what it reads are the same bytes in both: a changed one stops and is started
      from the new files, as today.
    Everything else stops as before: a client of vllm (open-webui, LiteLLM, a router, a UI, a bot) is
    depended on by nothing or names vllm or depends on it, so it stops.
    """
    if old is None:
        return ()
    a, b = _Project(new, compose_files), _Project(old, compose_files)
    keep = [c for c in companions if c in a.services and c in b.services and a.facts(c) == b.facts(c)]
    while True:  # a companion that fails lets go of the ones that needed it to stay: repeat until stable
        still = [c for c in keep if a.may_stay(c, keep, vllm, companions) and b.may_stay(c, keep, vllm, companions)]
        if still == keep:
            return tuple(still)
        keep = still


class _Project:
    """The services of a deploy dir's compose files (in -f order), read as plain YAML."""

    def __init__(self, files: Mapping[str, bytes], compose_files: Sequence[str]) -> None:
        self.files = files
        names = [n for n in compose_files if n in files] or [COMPOSE_FILE]
        self.docs = [parse_compose(files.get(n, b"")) for n in names]
        self.texts = [files.get(n, b"") for n in names]
        self.env = {k: v for k, v in dotenv_values(stream=io.StringIO(files.get(_ENV, b"").decode(
            errors="replace"))).items() if v is not None}
        self.services: dict[str, list[dict[str, Any]]] = {}
        for doc in self.docs:
            for name, spec in (doc.get("services") or {}).items():
                if isinstance(spec, dict):
                    self.services.setdefault(str(name), []).append(spec)

    def facts(self, service: str) -> tuple[str, ...]:
        """What the service is made of here: its definitions, the variables' values, the files it reads."""
        specs = self.services[service]
        used = sorted({m.group(1) for s in _strings(specs) for m in _VARIABLE.finditer(s)})
        read = sorted(self._reads(service))
        return (repr(specs), *(f"{k}={self.env.get(k)}" for k in used),
                *(f"{n}:{self.files.get(n, b'')!r}" for n in read))

    def _reads(self, service: str) -> set[str]:
        return {r.name for text in self.texts for r in references(text) if r.service == service}

    def names(self, service: str) -> set[str]:
        """The names a client reaches the service by."""
        out = {service}
        for spec in self.services.get(service, []):
            out |= {str(spec[k]) for k in ("container_name", "hostname") if spec.get(k)}
            networks = spec.get("networks")
            if isinstance(networks, dict):
                out |= {str(a) for n in networks.values() if isinstance(n, dict) for a in n.get("aliases") or []}
        return out

    def ports(self, service: str) -> set[str]:
        """The ports (host and container) a client reaches the service on."""
        out: set[str] = set()
        for spec in self.services.get(service, []):
            for entry in [*(spec.get("ports") or []), *(spec.get("expose") or [])]:
                if isinstance(entry, dict):
                    out |= {str(entry[k]) for k in ("target", "published") if entry.get(k)}
                else:  # [IP:][HOST:]CONTAINER[/PROTO], variables as the .env gives them: the parts that are numbers
                    text = _VALUE.sub(lambda m: self.env.get(m.group(1) or m.group(2), ""), str(entry))
                    out |= {p for p in (x.split("/")[0] for x in text.split(":")) if p.isdigit()}
        return out

    def may_stay(self, c: str, keep: Sequence[str], vllm: str, companions: Sequence[str]) -> bool:
        specs = self.services[c]
        if not any(c in _depends_on(self.services.get(o, [])) for o in companions if o != c):
            return False  # nothing waits for it: stopping it costs no one a health interval
        if not _depends_on(specs) <= set(keep):
            return False
        if any(k in s for s in specs for k in ("configs", "secrets", "build")):
            return False
        refs = [r for text in self.texts for r in references(text) if r.service == c]
        binds = [b for spec in specs for b in map(mount_of, spec.get("volumes") or []) if b is not None]
        env_files = [f for spec in specs for f in env_files_of(spec.get("env_file") or [])]
        if len([r for r in refs if r.kind == "mount"]) < len(binds) or \
                len([r for r in refs if r.kind == "env_file"]) < len(env_files):
            return False  # a file outside the deploy dir (or named by a variable): its bytes are not here
        reads = {r.name for r in refs}
        if any(r not in self.files for r in reads):
            return False  # a folder, or a file the revision does not hold
        used = {m.group(1) for s in _strings(specs) for m in _VARIABLE.finditer(s)}
        if not used <= set(self.env):
            return False
        names = {n.lower() for s in (vllm, "door") for n in self.names(s)}
        ports = {p for s in (vllm, "door") for p in self.ports(s)}
        own = [{k: v for k, v in spec.items() if k != "image"} for spec in specs]  # the engine pulls it, not the box
        text = "\n".join([*_strings(own), *(self.env[k] for k in sorted(used)),
                          *(self.files[r].decode(errors="replace") for r in sorted(reads))])
        return not any(_names(text, n) for n in names) and not any(re.search(rf":{p}(?!\d)", text) for p in ports)


def _names(text: str, name: str) -> bool:
    """`name` as a host name in `text` (not a part of a longer name: `vllm` is not in `VLLM_API_KEY`)."""
    return re.search(rf"(?<![A-Za-z0-9_-]){re.escape(name)}(?![A-Za-z0-9_-])", text, re.IGNORECASE) is not None


def _depends_on(specs: list[dict[str, Any]]) -> set[str]:
    out: set[str] = set()
    for spec in specs:
        deps = spec.get("depends_on") or []
        out |= {str(d) for d in (deps if isinstance(deps, (list, dict)) else [])}
        out |= {str(link).split(":", 1)[0] for link in spec.get("links") or []}
    return out


def _strings(value: Any) -> Iterator[str]:
    """Every key and scalar in a YAML value, as text."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif value is not None:
        yield str(value)

