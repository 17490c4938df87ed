"""Preflight lint: every failure in the post caught before a 4-minute boot.

`lint_stack(ctx)` is pure (rules.py over a LintContext); `gather.build_context` collects
the facts that need Docker (image, `docker compose config`, port owner, patch results) and
works without Docker for the pure rules.
"""

from __future__ import annotations

from .findings import Finding, LintContext, Severity
from .rules import RULES

__all__ = ["RULES", "Finding", "LintContext", "Severity", "has_errors", "lint_stack"]


def lint_stack(ctx: LintContext) -> list[Finding]:
    """Every finding for one stack, errors first, in rule order."""
    out: list[Finding] = []
    for _ids, fn in RULES:
        out.extend(fn(ctx))
    return sorted(out, key=lambda f: 0 if f.severity == "error" else 1)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
