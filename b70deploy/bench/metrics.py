"""Speculative-decoding acceptance from /metrics counter deltas.

vLLM exports counters of drafts, drafted tokens and accepted tokens. Over an interval:
mean acceptance length = 1 + accepted / drafts (tokens emitted per verification step), and
acceptance rate = accepted / drafted. Counters are global to the server, so the numbers
describe the interval, not one request, unless requests ran one at a time.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .client import Endpoint, get

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
WATCHED = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PROMPT_TOKENS, GENERATION_TOKENS)


def parse(text: str) -> dict[str, float]:
    """Totals of the watched counters (summed over labels), from Prometheus text."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names counter samples with their _total suffix; older exporters may not.
            name = sample.name if sample.name.endswith("_total") else sample.name + "_total"
            if name in WATCHED:
                totals[name] = totals.get(name, 0.0) + float(sample.value)
    return totals


def snapshot(endpoint: Endpoint) -> dict[str, float] | None:
    """The watched counters now; None when the server has no /metrics or it does not parse."""
    try:
        status, raw = get(endpoint, "/metrics")
    except (OSError, http.client.HTTPException):
        return None
    if status != 200:
        return None
    try:
        return parse(raw.decode("utf-8", "replace"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Acceptance:
    drafts: float
    draft_tokens: float
    accepted: float

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted,
                "mean_acceptance_length": self.mean_acceptance_length, "acceptance_rate": self.acceptance_rate}


def acceptance(before: dict[str, float] | None, after: dict[str, float] | None) -> Acceptance | None:
    """Acceptance over the interval; None when the server exposes no spec-decode counters."""
    if before is None or after is None or DRAFTS not in after:
        return None

    def delta(name: str) -> float:
        return max(0.0, after.get(name, 0.0) - before.get(name, 0.0))

    return Acceptance(delta(DRAFTS), delta(DRAFT_TOKENS), delta(ACCEPTED))


def token_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Prompt and generation tokens the server counted over the interval (a cross-check)."""
    if before is None or after is None:
        return None
    return {"prompt_tokens": after.get(PROMPT_TOKENS, 0.0) - before.get(PROMPT_TOKENS, 0.0),
            "generation_tokens": after.get(GENERATION_TOKENS, 0.0) - before.get(GENERATION_TOKENS, 0.0)}
