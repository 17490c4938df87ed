"""Preflight lint: every failure in the post caught before a 4-minute boot.

`lint_stack(ctx)` is pure (rules.py over a LintContext); `gather.build_context` reads what
docker/produce.py rendered and the engine said (image, `docker compose config`, port owner,
patch results, GPU access), and works without Docker for the pure rules.
"""

from __future__ import annotations

from .findings import Finding, LintContext, Severity
from .rules import RULES, applies

__all__ = ["RULES", "Finding", "LintContext", "Severity", "has_errors", "lint_stack"]


def lint_stack(ctx: LintContext) -> list[Finding]:
    """Every finding for one stack, errors first, in rule order: the rules of the node's platform,
    but for those the stack ignores (`lint: {ignore: {RULE: why}}`; gather lists each in skipped)."""
    out: list[Finding] = []
    platform = ctx.node.config.platform
    ignored = ctx.stack.lint.ignore
    for ids, fn in RULES:
        if applies(ids, platform):
            out.extend(f for f in fn(ctx) if f.id not in ignored)
    return sorted(out, key=lambda f: 0 if f.severity == "error" else 1)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
