"""Results files: one JSON document per run (a bench, a sweep or a replay).

    {"schema": "b70deploy.bench/1", "kind": "bench"|"sweep"|"replay",
     "environment": {endpoint, stack, revision, image_id, vllm_version, kv_tokens, model, date, note},
     "config": {...}, "result": {"metric", "value", "unit"}, "summary": {n, min, median, mean, max},
     "samples": [...], "acceptance": {...}|null, "interrupted": bool, ...}

A sweep holds one such result per concurrency under "points".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..state.fsio import write_atomic

SCHEMA = "b70deploy.bench/1"
KINDS = ("bench", "sweep", "replay")


def default_path(folder: Path, doc: dict[str, Any]) -> Path:
    """<folder>/<date>-<kind/metric>-<stack>-ctx<N>-c<C>.json, unique within the folder."""
    env = doc.get("environment") or {}
    cfg = doc.get("config") or {}
    # A file-name stamp, not now_iso(): sortable, and free of ':' and '+' in a path.
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    what = cfg.get("metric") or doc.get("kind", "bench")
    parts = [stamp, str(what), str(env.get("stack") or "unknown")]
    if cfg.get("ctx"):
        parts.append(f"ctx{cfg['ctx']}")
    conc = cfg.get("concurrency")
    if isinstance(conc, list):
        parts.append("c" + "-".join(str(c) for c in conc))
    elif conc:
        parts.append(f"c{conc}")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts))
    path = folder / f"{stem}.json"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    return path


def write(path: Path, doc: dict[str, Any]) -> Path:
    doc = {"schema": SCHEMA, **doc}
    write_atomic(path, (json.dumps(doc, indent=2, default=str) + "\n").encode())
    return path


def load(path: Path) -> dict[str, Any]:
    where = str(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError("no such results file", where=where, fix="give a file written by `b70deploy bench`") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UserError(f"not a readable JSON results file ({type(e).__name__})", where=where,
                        fix="give a file written by `b70deploy bench`, `bench sweep` or `replay`") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UserError(f"schema is not {SCHEMA}", where=f"{where}: schema",
                        fix="give a file written by `b70deploy bench`, `bench sweep` or `replay`")
    if doc.get("kind") not in KINDS:
        raise UserError(f"kind {doc.get('kind')!r} is not one of {', '.join(KINDS)}", where=f"{where}: kind",
                        fix="give a results file written by b70deploy")
    return doc


@dataclass(frozen=True)
class Row:
    """One comparable number: a metric at a context and concurrency."""

    metric: str
    ctx: int | None
    concurrency: int
    value: float | None
    accept: float | None = None  # mean acceptance length (1 + accepted / drafts), when measured
    accept_rate: float | None = None  # acceptance rate (accepted / drafted tokens)
    per_position: tuple[float, ...] | None = None  # per-position acceptance (accepted at i / drafts)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.metric, self.ctx or 0, self.concurrency)


def _accept_len(doc: dict[str, Any]) -> float | None:
    acc = doc.get("acceptance") or {}
    v = acc.get("mean_acceptance_length")
    return float(v) if isinstance(v, int | float) else None


def _acceptance(doc: dict[str, Any]) -> dict[str, Any]:
    """mean acceptance length, acceptance rate and per-position acceptance, as Row fields."""
    acc = doc.get("acceptance") or {}
    rate = acc.get("acceptance_rate")
    pos = acc.get("per_position_acceptance")
    return {"accept": _accept_len(doc), "accept_rate": float(rate) if isinstance(rate, int | float) else None,
            "per_position": tuple(float(x) for x in pos) if isinstance(pos, list) and pos else None}


def rows(doc: dict[str, Any]) -> list[Row]:
    """The comparable numbers of a results document."""
    kind = doc.get("kind")
    cfg = doc.get("config") or {}
    if kind == "sweep":
        out: list[Row] = []
        for p in doc.get("points") or []:
            res = p.get("result") or {}
            out.append(Row(str(res.get("metric", "aggregate")), cfg.get("ctx"), int(p.get("concurrency", 1)),
                           res.get("value"), **_acceptance(p)))
        return out
    res = doc.get("result") or {}
    metric = str(res.get("metric") or cfg.get("metric") or kind)
    ctx = None if kind == "replay" else cfg.get("ctx")
    return [Row(metric, ctx, int(cfg.get("concurrency") or 1), res.get("value"), **_acceptance(doc))]


def label(doc: dict[str, Any], path: Path) -> str:
    """A short name for a results file in tables and charts: stack, plus the note if any."""
    env = doc.get("environment") or {}
    name = str(env.get("stack") or path.stem)
    note = env.get("note")
    return f"{name} ({note})" if note else name
