"""What a switch checks besides /health: the diagnosis catalogue while it waits, boot facts
against the stack's expectations after it is up, and lint before anything stops."""

from __future__ import annotations

from typing import Any

from ..bootlog import check_expectations, parse_boot_facts
from ..deployment import Deployment
from ..diagnosis import diagnose


def boot_checks(d: Deployment, lines: list[str]) -> tuple[dict[str, Any], list[str]]:
    facts = parse_boot_facts(lines)
    recorded = {k: v for k, v in facts.to_dict().items() if v not in (None, [], False)}
    problems = check_expectations(facts, d.stack.expect)
    for key in ("attention_backend", "kv_cache_dtype", "moe_method", "kv_cache_tokens"):
        if recorded.get(key) is not None:
            d.reporter.info(f"boot: {key} = {recorded[key]}")
    return recorded, problems


def wire(d: Deployment) -> None:
    d.diagnose = diagnose
    d.check_boot = boot_checks
