"""Speculative-decoding acceptance from /metrics counter deltas.

vLLM exports counters of drafts, drafted tokens, accepted tokens and accepted tokens per
draft position (vllm/v1/spec_decode/metrics.py, SpecDecodingProm: `vllm:spec_decode_num_drafts`,
`vllm:spec_decode_num_draft_tokens`, `vllm:spec_decode_num_accepted_tokens`, and
`vllm:spec_decode_num_accepted_tokens_per_pos` with labelnames + ["position"], one counter per
position 0..num_speculative_tokens-1; Prometheus text gives each a `_total` sample). Over an
interval, as vLLM's own SpecDecodingLogging computes them:

- mean acceptance length = 1 + accepted / drafts: tokens emitted per verification step,
  the bonus token included (`Mean acceptance length: 1.81`);
- accepted tokens per draft = accepted / drafts: the same without the bonus token (the
  report's "mean accepted tokens/step" table: 1.3-1.6, 0.44, 0.00);
- acceptance rate = accepted / drafted tokens (`Avg Draft acceptance rate: 40.0%`);
- per-position acceptance = accepted at position i / drafts (`Per-position acceptance
  rate: 0.620, 0.410, 0.260`): they add up to accepted tokens per draft.

Counters are global to the server, so the numbers describe the interval, not one request,
unless requests ran one at a time.
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
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label `position`
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
WATCHED = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PROMPT_TOKENS, GENERATION_TOKENS)


def per_pos_key(position: int) -> str:
    return f'{ACCEPTED_PER_POS}{{position="{position}"}}'


def parse(text: str) -> dict[str, float]:
    """Totals of the watched counters (summed over the other labels, e.g. engines), from
    Prometheus text; the per-position counter keeps its position: `per_pos_key(i)`."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # the counter's creation time, not a count
            # The parser names counter samples with their _total suffix; older exporters may not.
            name = sample.name if sample.name.endswith("_total") else sample.name + "_total"
            if name == ACCEPTED_PER_POS:
                pos = str(sample.labels.get("position", ""))
                if pos.isdigit():
                    key = per_pos_key(int(pos))
                    totals[key] = totals.get(key, 0.0) + float(sample.value)
            elif name in WATCHED:
                totals[name] = totals.get(name, 0.0) + float(sample.value)
    return totals


def finished_requests(text: str) -> dict[str, float]:
    """Finished requests by `finished_reason` (stop, length, abort, error, ...), from vLLM's
    `vllm:request_success_total` counter (one sample per finished_reason, per engine: a real
    0.21 exports stop, length, abort, error, repetition; tests/fixtures/vllm-0.21.0-cpu/metrics.txt),
    summed over the other labels: watch's error rate is error / all."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == REQUEST_SUCCESS:
                reason = str(sample.labels.get("finished_reason", ""))
                counts[reason] = counts.get(reason, 0.0) + float(sample.value)
    return counts


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
    accepted_per_position: tuple[float, ...] = ()  # accepted tokens at draft position 0, 1, ...

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens per verification step, the bonus token included."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def accepted_tokens_per_draft(self) -> float | None:
        """accepted / drafts: the draft tokens kept per step (mean acceptance length - 1)."""
        return self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted tokens."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def per_position_acceptance(self) -> list[float] | None:
        """accepted at position i / drafts, as vLLM logs `Per-position acceptance rate`."""
        if self.drafts <= 0 or not self.accepted_per_position:
            return None
        return [n / self.drafts for n in self.accepted_per_position]

    def as_dict(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted,
                "accepted_per_position": list(self.accepted_per_position),
                "mean_acceptance_length": self.mean_acceptance_length,
                "accepted_tokens_per_draft": self.accepted_tokens_per_draft,
                "acceptance_rate": self.acceptance_rate,
                "per_position_acceptance": self.per_position_acceptance}


def fmt_per_position(rates: list[float] | None) -> str:
    """`0.620/0.410/0.260`, vLLM's three decimals; `-` when not measured."""
    return "/".join(f"{r:.3f}" for r in rates) if rates else "-"


def describe(acc: dict[str, Any] | None) -> str | None:
    """One line naming each figure for what it is, from an `Acceptance.as_dict()`."""
    if not acc or acc.get("mean_acceptance_length") is None:
        return None
    parts = [f"mean acceptance length {acc['mean_acceptance_length']:.2f}"]
    if acc.get("accepted_tokens_per_draft") is not None:
        parts.append(f"accepted tokens per draft {acc['accepted_tokens_per_draft']:.2f}")
    if acc.get("acceptance_rate") is not None:
        parts.append(f"acceptance rate {acc['acceptance_rate'] * 100:.1f}%")
    if acc.get("per_position_acceptance"):
        parts.append(f"per-position acceptance {fmt_per_position(acc['per_position_acceptance'])}")
    return ", ".join(parts)


def acceptance(before: dict[str, float] | None, after: dict[str, float] | None) -> Acceptance | None:
    """Acceptance over the interval; None when the server exposes no spec-decode counters."""
    if before is None or after is None or DRAFTS not in after:
        return None

    def delta(name: str) -> float:
        return max(0.0, after.get(name, 0.0) - before.get(name, 0.0))

    positions = sorted(int(k.split('"')[1]) for k in after if k.startswith(ACCEPTED_PER_POS))
    per_pos = tuple(delta(per_pos_key(i)) for i in range(positions[-1] + 1)) if positions else ()
    return Acceptance(delta(DRAFTS), delta(DRAFT_TOKENS), delta(ACCEPTED), per_pos)


def token_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Prompt and generation tokens the server counted over the interval (a cross-check)."""
    if before is None or after is None:
        return None
    return {"prompt_tokens": after.get(PROMPT_TOKENS, 0.0) - before.get(PROMPT_TOKENS, 0.0),
            "generation_tokens": after.get(GENERATION_TOKENS, 0.0) - before.get(GENERATION_TOKENS, 0.0)}
