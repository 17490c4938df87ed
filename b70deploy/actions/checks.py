"""What a switch checks besides /health: the diagnosis catalogue while it waits, boot facts
against the stack's expectations after it is up, and lint before anything stops."""

from __future__ import annotations

from typing import Any

from ..config.node import Node
from ..config.schema import Stack
from ..deploy.steps import Deployment
from ..errors import UserError
from ..ui.progress import Reporter
from ..vllmlog.bootlog import check_expectations, parse_boot_facts
from ..vllmlog.diagnosis import diagnose


def boot_checks(d: Deployment, lines: list[str]) -> tuple[dict[str, Any], list[str]]:
    facts = parse_boot_facts(lines)
    recorded = {k: v for k, v in facts.to_dict().items() if v not in (None, [], False)}
    problems = check_expectations(facts, d.stack.expect)
    for key in ("attention_backend", "kv_cache_dtype", "moe_method", "kv_cache_tokens"):
        if recorded.get(key) is not None:
            d.reporter.info(f"boot: {key} = {recorded[key]}")
    return recorded, problems


def lint_gate(d: Deployment) -> list[str]:
    """The preflight step of a switch: lint errors stop it before anything is drained."""
    errors = [f for f in d.findings if f.severity == "error"]
    if errors:
        lines = "\n  ".join(f.one_line() for f in errors)
        raise UserError(f"lint found {len(errors)} error(s) in {d.stack.name}:\n  {lines}",
                        fix=f"`b70deploy lint {d.stack.name}` explains each; nothing was changed")
    ensure_draft(d.node, d.stack, d.reporter)
    return [f.one_line() for f in d.findings]


def ensure_draft(node: Node, stack: Stack, reporter: Reporter) -> None:
    """The post's EAGLE-3 fix: serve a copy of the draft whose max_position_embeddings is raised."""
    spec = stack.speculative
    if spec is None or spec.model is None or spec.draft_max_position_embeddings is None:
        return
    from ..render.draft import ensure_draft_copy

    rel = ensure_draft_copy(node.models_dir, spec.model, spec.draft_max_position_embeddings)
    reporter.info(f"draft copy {rel}: max_position_embeddings {spec.draft_max_position_embeddings}")


def wire(d: Deployment) -> None:
    d.diagnose = diagnose
    d.check_boot = boot_checks
    if d.kind == "switch":
        d.preflight = lint_gate
