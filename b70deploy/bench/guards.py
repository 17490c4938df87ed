"""Benchmarks the report says cannot run: refused before the first request, with its numbers.

Pure: the current deployment's stack document, the concurrency asked for and whether the node
is an XPU node in, one message out (None: go ahead).
"""

from __future__ import annotations

from typing import Any

# switch-model.sh's own production comment, quoted by the report: suffix decoding is tuned for
# low-concurrency interactive latency and "deadlocks on XPU at C≥16".
SUFFIX_DEADLOCK_C = 16


def suffix_deadlock(stack_doc: dict[str, Any] | None, concurrency: int, *, xpu: bool) -> str | None:
    """Why C requests in flight would hang a suffix-decoding stack on XPU, or None."""
    if not xpu or concurrency < SUFFIX_DEADLOCK_C or not isinstance(stack_doc, dict):
        return None
    spec = stack_doc.get("speculative")
    if not isinstance(spec, dict) or spec.get("method") != "suffix":
        return None
    name = stack_doc.get("name") or "the current stack"
    return (f"{name} uses suffix decoding, which deadlocks on XPU at C >= {SUFFIX_DEADLOCK_C} "
            f"(switch-model.sh's production comment, quoted in the report): C={concurrency} would hang the server")
