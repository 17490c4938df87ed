"""What a notification says: one event as a flat JSON object, secrets masked.

    event       switch.started, switch.succeeded, switch.failed, switch.rolled-back,
                rollback.started, rollback.succeeded, rollback.failed,
                watch.rolled-back, watch.alert, watch.drift
    node, stack, revision, outcome (the summary line), diagnosis, logs (the command that
    prints the revision's container log), time
"""

from __future__ import annotations

import contextlib
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..config.node import Node
from ..errors import UserError
from ..render.filenames import DOTENV_FILE
from ..render.masking import MIN_VALUE, Secrets, is_secret, secret_variables
from ..state.stamps import now_iso


def make_event(node: Node, event: str, *, stack: str | None, revision: int | None, outcome: str,
               diagnosis: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event": event, "node": node.name or node.project, "stack": stack, "revision": revision,
        "outcome": outcome, "diagnosis": diagnosis,
        "logs": f"b70deploy logs {revision}" if revision is not None else None, "time": now_iso(), **extra}
    return masked(body, node_secrets(node))


def node_secrets(node: Node) -> Secrets:
    """Every secret the node config knows of: its secrets env file's keys and values, each
    companion's secret variables (by name or marked in its `secrets:`), and its secret_variables
    with the values its variables: and the deploy dir's .env give them. Masked in every output."""
    values: dict[str, str] = {}
    if node.secrets_env_file is not None:
        from ..config.secrets_file import load_secrets  # here: python-dotenv, only for a node with the file

        with contextlib.suppress(UserError):  # a missing secrets file is the switch's error to report
            values, _ = load_secrets(node.secrets_env_file)
    found = Secrets(keys=frozenset(values), values=frozenset(values.values()))
    for c in node.config.companions if node.settings.companion_env else ():
        found |= Secrets(keys=frozenset(c.secrets),
                         values=frozenset(secret_variables(c.environment, c.secrets).values())
                         | frozenset(secret_variables(c.variables, c.secrets).values()))
    names = node.settings.secret_variables
    if names:
        found |= Secrets(values=frozenset(secret_variables(node.config.variables, names).values()))
        from dotenv import dotenv_values

        given: dict[str, str | None] = {}
        with contextlib.suppress(OSError):  # a deploy dir this user cannot read: the names still mask .env lines
            given = dotenv_values(node.deploy_dir / DOTENV_FILE)
        found |= Secrets(keys=frozenset(names), values=frozenset(v for k, v in given.items() if k in names and v))
    return found


def exposed_config(path: Path | None) -> str | None:
    """What to say when the hand-written node config at `path` holds a secret in clear (a
    companion's password, an API key, a token in a webhook's URL) and others may read it: the file,
    the keys and the fix, in one line; None when it is private or holds none. A private file costs
    a stat; one others may read is parsed again."""
    if path is None:
        return None
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None  # load_node reports a file it cannot read
    if not mode & 0o077:
        return None
    from ..config.yamlfile import read_yaml  # here: only for a file others may read

    try:
        doc = read_yaml(path)  # the node config's own bounded reader (aliases, depth, size)
    except UserError:
        return None  # load_node reports a file it cannot read or parse
    keys = _clear_keys(doc, Secrets(keys=frozenset(_marked_keys(doc))))
    if not keys:
        return None
    return (f"{path} holds secrets ({', '.join(dict.fromkeys(keys))}) and is mode {mode:o}: others can read "
            f"them; chmod 600 {path}")


def _marked_keys(doc: Any) -> list[str]:
    """Every companion's `secrets:` keys, in the config and in each node of an inventory."""
    if not isinstance(doc, dict):
        return []
    found = [str(k) for c in doc.get("companions") or [] if isinstance(c, dict) for k in c.get("secrets") or []]
    return found + [k for member in (doc.get("nodes") or {}).values() for k in _marked_keys(member)]


def _clear_keys(doc: Any, secrets: Secrets, key: str = "") -> list[str]:
    """The keys whose values masking would change: each holds a secret in clear."""
    if isinstance(doc, dict):
        return [k for name, value in doc.items() for k in _clear_keys(value, secrets, str(name))]
    if isinstance(doc, list):
        return [k for value in doc for k in _clear_keys(value, secrets, key)]
    if isinstance(doc, str) and secrets.tree({key: doc}) != {key: doc}:
        return [key]
    return []


def marked_values(paths: Iterable[Path]) -> frozenset[str]:
    """The values env files mark secret: each value of a file only its owner can read (mode
    0600: the operator's mark), and a secret name's value in any. Short values (a port, `true`)
    mark nothing; a file that cannot be read marks nothing."""
    from dotenv import dotenv_values

    found: set[str] = set()
    for path in paths:
        try:
            private = not stat.S_IMODE(path.stat().st_mode) & 0o077
            values = dotenv_values(path)
        except OSError:
            continue  # another host's path (docker_host), or another user's file
        found |= {v for k, v in values.items() if v and len(v) >= MIN_VALUE and (private or is_secret(k))}
    return frozenset(found)


def masked(body: dict[str, Any], secrets: Secrets) -> dict[str, Any]:
    return {k: secrets.text(v) if isinstance(v, str) else v for k, v in body.items()}
