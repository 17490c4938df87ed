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


def context_fit(ctx: int, tokens: int, max_model_len: int | None, *, given: bool) -> tuple[int, str | None]:
    """The context to bench at, and what to tell the operator. vLLM refuses a request whose prompt and
    completion exceed max_model_len with a 400 ("This model's maximum context length is N tokens. However,
    you requested M tokens ..."): the default --ctx is lowered to fit (said in a note); a --ctx the
    operator gave that cannot fit is refused before the first request (the note is then the error)."""
    if max_model_len is None or ctx + tokens <= max_model_len:
        return ctx, None
    fits = max_model_len - tokens
    if given:
        return ctx, (f"--ctx {ctx:,} + {tokens:,} completion tokens exceeds the model's max_model_len "
                     f"{max_model_len:,} (/v1/models): vLLM would answer 400 to every request")
    return fits, (f"context lowered to {fits:,} tokens: the default {ctx:,} + {tokens:,} completion tokens "
                  f"exceeds the model's max_model_len {max_model_len:,} (/v1/models)")
