"""A concurrency sweep: aggregate tok/s at each C, and the change per step.

The post's lesson: a config that wins at C=1 can lose at C=12 (ngram: +24% at C=1, -45% at
C=12), so measure across the concurrency the node really serves, not two round numbers.
"""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from . import metrics, stats
from .client import Endpoint
from .run import BenchConfig, measure, prepare


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UserError(f"{text!r} is not a list of integers", where="--concurrency", fix="e.g. 1,2,3,4,12") from None
    if not levels or any(not 1 <= c <= 256 for c in levels):
        raise UserError(f"{text!r}: each level must be 1 to 256", where="--concurrency", fix="e.g. 1,2,3,4,12")
    return sorted(set(levels))


def run_sweep(endpoint: Endpoint, cfg: BenchConfig, levels: list[int], env: dict[str, Any], *,
              waves: int = 1, show_progress: bool = True) -> dict[str, Any]:
    """Aggregate at each level; n requests per level = C x waves (at least --n-prompts).

    One warm-up and one calibration serve every level; each level gets fresh nonces.
    """
    cfg.metric = "aggregate"
    cfg.concurrency = max(levels)
    cfg.n_prompts = max(cfg.n_prompts, max(levels) * waves)
    cfg.check()
    prep = prepare(endpoint, cfg, show_progress=show_progress)
    points: list[dict[str, Any]] = []
    interrupted = False
    for c in levels:
        point = measure(endpoint, prep, concurrency=c, n_prompts=c * waves, show_progress=show_progress,
                        label=f"sweep C={c}")
        points.append(point)
        if point["interrupted"]:
            interrupted = True
            break
    config = cfg.as_dict()
    config["concurrency"] = levels
    config["waves"] = waves
    return {"kind": "sweep", "environment": env, "config": config,
            "calibration": {"tokens_per_filler_word": prep.calibration.rate, "probes": prep.calibration.probes},
            "warmup": prep.warmup, "points": points, "interrupted": interrupted}


def table_rows(doc: dict[str, Any]) -> list[list[str]]:
    """concurrency, tok/s, tok/s per stream, change vs the previous step, mean acceptance length,
    acceptance rate, per-position acceptance, failed."""
    out: list[list[str]] = []
    prev: float | None = None
    for p in doc.get("points") or []:
        v = (p.get("result") or {}).get("value")
        c = int(p.get("concurrency", 1))
        a = p.get("acceptance") or {}
        acc, rate = a.get("mean_acceptance_length"), a.get("acceptance_rate")
        out.append([f"C={c}", stats.fmt_rate(v), stats.fmt_rate(v / c if v is not None else None),
                    stats.fmt_change(stats.change(v, prev)), f"{acc:.2f}" if acc is not None else "-",
                    f"{rate * 100:.1f}%" if rate is not None else "-",
                    metrics.fmt_per_position(a.get("per_position_acceptance")), str(p.get("failed", 0))])
        prev = v
    return out


SWEEP_HEADERS = ["concurrency", "tok/s", "per stream", "change", "mean accept len", "accept rate", "per-position",
                 "failed"]
