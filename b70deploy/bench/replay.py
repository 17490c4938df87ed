"""Replay captured traffic through a stack, verbatim, and report per-request outcome, tok/s
and speculative acceptance.

Verbatim means the captured body as sent (messages, response_format / guided_json,
temperatures, max_tokens); the only changes are stream=true with usage (so tokens can be
timed) and, when asked, the model alias. At concurrency 1 the /metrics deltas around each
request are that request's acceptance; at higher concurrency only the run's total is.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from . import metrics, stats
from .capture import segments
from .client import Cancel, Endpoint, Timing, stream
from .run import Item, Volley, fire

REPLAYABLE = ("/v1/chat/completions", "/v1/completions")


def load_captures(folder: Path) -> list[dict[str, Any]]:
    """Captured POSTs to the completion APIs, oldest first; unreadable lines are skipped."""
    if not folder.is_dir():
        raise UserError("not a capture folder", where=str(folder), fix="give the --dir that `b70deploy capture` wrote")
    out: list[dict[str, Any]] = []
    for seg in segments(folder):
        for line in seg.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn last line (proxy killed mid-write) is not worth failing over
            path = str(rec.get("path", "")).split("?")[0]
            if rec.get("method") == "POST" and path in REPLAYABLE and isinstance(rec.get("body"), dict):
                out.append(rec)
    if not out:
        raise UserError("no replayable requests (POST /v1/chat/completions or /v1/completions) found",
                        where=str(folder), fix="capture some traffic first: b70deploy capture --dir DIR ...")
    return out


def select(records: list[dict[str, Any]], sample: int | None, seed: int) -> list[dict[str, Any]]:
    """A deterministic random sample, kept in capture order."""
    if sample is None or sample >= len(records):
        return records
    if sample < 1:
        raise UserError(f"sample {sample} is too small", where="--sample", fix="give at least 1")
    keep = sorted(random.Random(seed).sample(range(len(records)), sample))
    return [records[i] for i in keep]


def wants_json(body: dict[str, Any]) -> bool:
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
        return True
    return body.get("guided_json") is not None or (body.get("structured_outputs") or {}).get("json") is not None


def replay_body(rec: dict[str, Any], model: str | None) -> dict[str, Any]:
    body = dict(rec["body"])
    if model:
        body["model"] = model
    return body


@dataclass
class ReplayTiming(Timing):
    outcome: str = ""
    acceptance: dict[str, Any] | None = None


def _make_sender(endpoint: Endpoint, per_request_acceptance: bool) -> Any:
    def send(ep: Endpoint, path: str, body: dict[str, Any], *, clock_zero: float, timeout: float,
             cancel: Cancel) -> ReplayTiming:
        before = metrics.snapshot(endpoint) if per_request_acceptance else None
        t = stream(ep, path, body, clock_zero=clock_zero, timeout=timeout, cancel=cancel, keep_text=True)
        after = metrics.snapshot(endpoint) if per_request_acceptance else None
        rt = ReplayTiming(**{k: getattr(t, k) for k in Timing.__dataclass_fields__})
        acc = metrics.acceptance(before, after)
        rt.acceptance = acc.as_dict() if acc else None
        if not t.ok:
            rt.outcome = f"HTTP {t.status}" if t.status and t.status != 200 else "error"
        elif wants_json(body):
            try:
                json.loads(t.text)
                rt.outcome = "ok"
            except ValueError:
                rt.outcome = "bad-json"
        else:
            rt.outcome = "ok"
        return rt

    return send


def run_replay(endpoint: Endpoint, records: list[dict[str, Any]], env: dict[str, Any], *, concurrency: int = 1,
               model: str | None = None, timeout: float = 1800.0, show_progress: bool = True,
               source: str = "") -> dict[str, Any]:
    if not 1 <= concurrency <= 256:
        raise UserError(f"concurrency {concurrency} is out of range", where="--concurrency", fix="give 1 to 256")
    items: list[Item] = []
    for i, rec in enumerate(records):
        body = replay_body(rec, model)
        kind = "json" if wants_json(body) else "text"
        items.append((i, kind, None, str(rec["path"]).split("?")[0], body))
    sender = _make_sender(endpoint, concurrency == 1)
    before = metrics.snapshot(endpoint)
    volley: Volley = fire(endpoint, items, concurrency=concurrency, label=f"replay C={concurrency}",
                            show_progress=show_progress, timeout=timeout, sender=sender)
    after = metrics.snapshot(endpoint) if not volley.interrupted else None
    acc = metrics.acceptance(before, after)
    for s in volley.samples:
        s["capture_id"] = records[s["index"]].get("id")
    ok = [s for s in volley.samples if s["ok"]]
    toks = sum(s["completion_tokens"] or 0 for s in ok)
    outcomes: dict[str, int] = {}
    for s in volley.samples:
        outcomes[s["outcome"]] = outcomes.get(s["outcome"], 0) + 1
    return {
        "kind": "replay", "environment": env,
        "config": {"source": source, "requests": len(records), "concurrency": concurrency, "model": model},
        "result": {"metric": "replay", "value": toks / volley.wall_s if volley.wall_s > 0 else None,
                   "unit": "tok/s"},
        "summary": stats.summary(s["decode_tps"] for s in ok),
        "outcomes": outcomes,
        "wall_s": volley.wall_s,
        "completion_tokens": toks,
        "acceptance": acc.as_dict() if acc else None,
        "samples": volley.samples,
        "interrupted": volley.interrupted,
    }


def table_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Per request: index, outcome, prompt and completion tokens, TTFT, decode tok/s, acceptance."""
    rows = []
    for s in doc.get("samples") or []:
        a = s.get("acceptance") or {}
        acc, rate = a.get("mean_acceptance_length"), a.get("acceptance_rate")
        rows.append([str(s["index"]), s.get("outcome", ""), str(s.get("prompt_tokens") or "-"),
                     str(s.get("completion_tokens") or "-"),
                     f"{s['ttft_s'] * 1000:.0f}" if s.get("ttft_s") is not None else "-",
                     stats.fmt_rate(s.get("decode_tps")), f"{acc:.2f}" if acc is not None else "-",
                     f"{rate * 100:.1f}%" if rate is not None else "-"])
    return rows


REPLAY_HEADERS = ["#", "outcome", "prompt tok", "completion tok", "TTFT ms", "decode tok/s", "mean accept len",
                  "accept rate"]
