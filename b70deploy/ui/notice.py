"""What a notification says: one event as a flat JSON object, secrets masked.

    event       switch.started, switch.succeeded, switch.failed, switch.rolled-back,
                rollback.started, rollback.succeeded, rollback.failed,
                watch.rolled-back, watch.alert, watch.drift
    node, stack, revision, outcome (the summary line), diagnosis, logs (the command that
    prints the revision's container log), time
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from ..config.node import Node
from ..config.secrets_file import load_secrets
from ..errors import UserError
from ..render.masking import mask, mask_env_text
from ..state.stamps import now_iso

# KEY=value inside free text (a log line, an error): the value of a secret-looking key is masked.
_INLINE_ENV_RE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


def make_event(node: Node, event: str, *, stack: str | None, revision: int | None, outcome: str,
               diagnosis: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event": event, "node": node.name or node.project, "stack": stack, "revision": revision,
        "outcome": outcome, "diagnosis": diagnosis,
        "logs": f"b70deploy logs {revision}" if revision is not None else None, "time": now_iso(), **extra}
    return masked(body, node_secrets(node))


def node_secrets(node: Node) -> list[str]:
    """The values of the node's secrets env file: masked wherever they appear in an event."""
    try:
        values, _ = load_secrets(node.secrets_env_file)
    except UserError:
        return []  # a missing secrets file is the switch's error to report, not the notifier's
    return [v for v in values.values() if len(v) >= 4]


def masked(body: dict[str, Any], secrets: Collection[str]) -> dict[str, Any]:
    return {k: _mask_text(v, secrets) if isinstance(v, str) else v for k, v in body.items()}


def _mask_text(text: str, secrets: Collection[str]) -> str:
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, mask(value))
    text = _INLINE_ENV_RE.sub(lambda m: mask_env_text(m.group(0)), text)
    return text
