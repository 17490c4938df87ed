"""Compare results files: one row per (metric, context, concurrency), one column per file,
and the ratio of each file to the first (new/old), like the post's bench matrix."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..ui.output import warn
from . import metrics, results, stats


@dataclass(frozen=True)
class Matrix:
    labels: list[str]
    keys: list[tuple[str, int, int]]
    values: dict[tuple[str, int, int], list[float | None]]
    accept: dict[tuple[str, int, int], list[float | None]]  # mean acceptance length
    accept_rate: dict[tuple[str, int, int], list[float | None]] = field(default_factory=dict)
    per_position: dict[tuple[str, int, int], list[tuple[float, ...] | None]] = field(default_factory=dict)

    def ratio(self, key: tuple[str, int, int], col: int) -> float | None:
        vals = self.values[key]
        return stats.ratio(vals[col], vals[0])

    @property
    def has_accept(self) -> bool:
        return any(v is not None for vs in self.accept.values() for v in vs)


METRIC_ORDER = {"prefill": 0, "decode": 1, "aggregate": 2, "replay": 3}


def build(docs: list[tuple[str, dict[str, Any]]]) -> Matrix:
    """Columns are the distinct labels in order of first appearance: the files of one stack
    (prefill at 8K, decode at 32K, a sweep...) fill one column together. Where two files of
    one label give the same cell, the later file wins and a warning says so."""
    labels: list[str] = []
    for name, _ in docs:
        if name not in labels:
            labels.append(name)
    if len(labels) < 2:
        raise UserError("compare needs results from at least two stacks (or notes)", where="compare",
                        fix="give files of two stacks, or tell runs of one stack apart with --note")
    values: dict[tuple[str, int, int], list[float | None]] = {}
    accept: dict[tuple[str, int, int], list[float | None]] = {}
    rate: dict[tuple[str, int, int], list[float | None]] = {}
    per_pos: dict[tuple[str, int, int], list[tuple[float, ...] | None]] = {}
    seen: set[tuple[str, tuple[str, int, int]]] = set()
    for name, doc in docs:
        col = labels.index(name)
        for row in results.rows(doc):
            if (name, row.key) in seen:
                warn(f"{name}: two files give {row.metric} ctx={row.ctx} C={row.concurrency}; the later one is shown")
            seen.add((name, row.key))
            values.setdefault(row.key, [None] * len(labels))[col] = row.value
            accept.setdefault(row.key, [None] * len(labels))[col] = row.accept
            rate.setdefault(row.key, [None] * len(labels))[col] = row.accept_rate
            per_pos.setdefault(row.key, [None] * len(labels))[col] = row.per_position
    keys = sorted(values, key=lambda k: (METRIC_ORDER.get(k[0], 9), k[0], k[1], k[2]))
    return Matrix(labels, keys, values, accept, rate, per_pos)


def load_all(paths: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in paths:
        doc = results.load(p)
        out.append((results.label(doc, p), doc))
    return out


def headers(m: Matrix) -> list[str]:
    hs = ["metric", "ctx", "C"] + [f"{lab} (tok/s)" for lab in m.labels]
    hs += [f"{lab}/{m.labels[0]}" for lab in m.labels[1:]]
    if m.has_accept:  # each named for what it is: the report prints all three
        hs += [f"mean accept len {lab}" for lab in m.labels]
        hs += [f"accept rate {lab}" for lab in m.labels]
        hs += [f"per-position {lab}" for lab in m.labels]
    return hs


def table_rows(m: Matrix) -> list[list[str]]:
    out: list[list[str]] = []
    for key in m.keys:
        metric, ctx, conc = key
        row = [metric, f"{ctx:,}" if ctx else "-", str(conc)]
        row += [stats.fmt_rate(v) for v in m.values[key]]
        row += [stats.fmt_ratio(m.ratio(key, c)) for c in range(1, len(m.labels))]
        if m.has_accept:
            n = len(m.labels)
            row += [f"{a:.2f}" if a is not None else "-" for a in m.accept[key]]
            row += [f"{r * 100:.1f}%" if r is not None else "-" for r in m.accept_rate.get(key, [None] * n)]
            row += [metrics.fmt_per_position(list(p) if p else None) for p in m.per_position.get(key, [None] * n)]
        out.append(row)
    return out


def as_json(m: Matrix) -> list[dict[str, Any]]:
    return [{"metric": k[0], "ctx": k[1] or None, "concurrency": k[2],
             "values": dict(zip(m.labels, m.values[k], strict=True)),
             "ratios": {lab: m.ratio(k, c) for c, lab in enumerate(m.labels) if c > 0},
             "mean_acceptance_length": dict(zip(m.labels, m.accept[k], strict=True)),
             "acceptance_rate": dict(zip(m.labels, m.accept_rate.get(k, [None] * len(m.labels)), strict=True)),
             "per_position_acceptance": {lab: list(p) if p else None for lab, p in
                                         zip(m.labels, m.per_position.get(k, [None] * len(m.labels)), strict=True)}}
            for k in m.keys]
