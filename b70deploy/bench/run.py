"""A bench run: warm-up, calibration, N measured requests at concurrency C, summary.

Definitions (the post's, separated rather than conflated):
- prefill tok/s = prompt tokens / time to first token
- decode tok/s  = (completion tokens - 1) / (time from first to last token)
- aggregate tok/s = completion tokens of all requests / wall time, at concurrency C
The headline of prefill and decode amortizes over the prompts (sum of tokens over sum of
times); the summary gives the per-request spread.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from ..errors import OperationError, UserError
from ..ui.output import note
from . import metrics, prompts, stats
from .client import Cancel, Endpoint, Timing, post_json, stream
from .progress import Progress

METRICS = ("prefill", "decode", "aggregate")
APIS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
DEFAULT_MAX_TOKENS = {"prefill": 1, "decode": 128, "aggregate": 200}
TOKEN_TOLERANCE = 0.01  # the server's prompt_tokens must be within 1% of the target


@dataclass
class BenchConfig:
    metric: str
    ctx: int
    n_prompts: int
    concurrency: int = 1
    max_tokens: int | None = None
    api: str = "completions"
    model: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    timeout: float = 1800.0
    warmup: bool = True

    def check(self) -> None:
        if self.metric not in METRICS:
            raise UserError(f"unknown metric {self.metric!r}", where="--metric", fix="use prefill, decode or aggregate")
        if self.api not in APIS:
            raise UserError(f"unknown api {self.api!r}", where="--api", fix="use completions or chat")
        if self.ctx < 16:
            raise UserError(f"context {self.ctx} is too small", where="--ctx", fix="give at least 16 tokens")
        if not 1 <= self.concurrency <= 256:
            raise UserError(f"concurrency {self.concurrency} is out of range", where="--concurrency",
                            fix="give 1 to 256")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UserError("max tokens must be at least 1", where="--max-tokens", fix="e.g. --max-tokens 128")
        if self.metric == "decode" and (self.max_tokens or 2) < 2:
            raise UserError("decode needs at least 2 completion tokens", where="--max-tokens",
                            fix="e.g. --max-tokens 128")

    @property
    def tokens(self) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS[self.metric]

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "ctx": self.ctx, "n_prompts": self.n_prompts, "concurrency": self.concurrency,
                "max_tokens": self.tokens, "api": self.api, "model": self.model, "ignore_eos": self.ignore_eos,
                "temperature": self.temperature}


def request_body(cfg: BenchConfig, text: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": cfg.model, "max_tokens": max_tokens, "temperature": cfg.temperature}
    if cfg.ignore_eos:
        body["ignore_eos"] = True  # vLLM extension: generate exactly max_tokens, so runs compare
    if cfg.api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def resolve_model(endpoint: Endpoint, model: str | None, served: list[str]) -> str:
    if model:
        return model
    if not served:
        raise OperationError(f"{endpoint.url}/v1/models lists no model (is the server up?)",
                             fix="give --model ALIAS or check the endpoint")
    return served[0]


def make_probe(endpoint: Endpoint, cfg: BenchConfig) -> prompts.Probe:
    """usage.prompt_tokens for a text, from a one-token request."""

    def probe(text: str) -> int:
        body = request_body(cfg, text, 1)
        body.pop("ignore_eos", None)
        try:
            status, doc, raw = post_json(endpoint, APIS[cfg.api], body, timeout=cfg.timeout)
        except OSError as e:
            raise OperationError(f"calibration request to {endpoint.url} failed: {e}") from None
        usage = (doc or {}).get("usage") or {}
        if status != 200 or not isinstance(usage.get("prompt_tokens"), int):
            detail = raw[:200].decode("utf-8", "replace")
            raise OperationError(f"calibration request got HTTP {status} without usage.prompt_tokens: {detail}")
        return int(usage["prompt_tokens"])

    return probe


def sample_dict(index: int, kind: str | None, target: int | None, t: Timing) -> dict[str, Any]:
    d: dict[str, Any] = {"index": index, "kind": kind, **t.as_dict()}
    d["prefill_tps"] = (t.prompt_tokens / t.ttft_s) if t.ok and t.prompt_tokens and t.ttft_s else None
    ctoks = t.completion_tokens or 0
    d["decode_tps"] = ((ctoks - 1) / t.first_to_last_s) if t.ok and ctoks > 1 and t.first_to_last_s else None
    d["target_tokens"] = target
    d["token_off"] = prompts.off_by(t.prompt_tokens, target) if target and t.prompt_tokens is not None else None
    return d


@dataclass
class Volley:
    """What one `fire` sent and got back: each request's sample, the wall time, Ctrl-C or not."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    interrupted: bool = False


Item = tuple[int, str | None, int | None, str, dict[str, Any]]
"""index, kind, target prompt tokens, API path, request body"""


def fire(endpoint: Endpoint, items: list[Item], *, concurrency: int, label: str, show_progress: bool,
         timeout: float, sender: Callable[..., Timing] = stream) -> Volley:
    """Send items with `concurrency` in flight; Ctrl-C keeps what finished, cuts what is in
    flight, and marks the outcome interrupted."""
    out = Volley()
    cancel = Cancel()
    progress = Progress(label, len(items), enabled=show_progress)
    zero = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="b70bench")
    pending: dict[Future[Timing], tuple[int, str | None, int | None]] = {}
    try:
        for index, kind, target, path, body in items:
            fut = pool.submit(sender, endpoint, path, body, clock_zero=zero, timeout=timeout, cancel=cancel)
            pending[fut] = (index, kind, target)
        while pending:
            done, _ = wait(list(pending), timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                index, kind, target = pending.pop(fut)
                t = fut.result()
                out.samples.append(sample_dict(index, kind, target, t))
                progress.step(t.ok, "" if t.ok else (t.error or "")[:80])
    except KeyboardInterrupt:
        out.interrupted = True
        cancel.cancel_all()
        pool.shutdown(wait=False, cancel_futures=True)
    finally:
        progress.close()
        pool.shutdown(wait=not out.interrupted)
    ends = [s["t_start"] + s["total_s"] for s in out.samples if s["ok"]]
    starts = [s["t_start"] for s in out.samples if s["ok"]]
    out.wall_s = (max(ends) - min(starts)) if ends else 0.0
    out.samples.sort(key=lambda s: s["index"])
    return out


def headline(metric: str, samples: list[dict[str, Any]], wall_s: float) -> float | None:
    ok = [s for s in samples if s["ok"]]
    if metric == "prefill":
        ttft = sum(s["ttft_s"] for s in ok if s["prefill_tps"] is not None)
        toks = sum(s["prompt_tokens"] for s in ok if s["prefill_tps"] is not None)
        return toks / ttft if ttft > 0 else None
    if metric == "decode":
        span = sum(s["first_to_last_s"] for s in ok if s["decode_tps"] is not None)
        toks = sum(s["completion_tokens"] - 1 for s in ok if s["decode_tps"] is not None)
        return toks / span if span > 0 else None
    toks = sum(s["completion_tokens"] or 0 for s in ok)
    return toks / wall_s if wall_s > 0 else None


def per_request_values(metric: str, samples: list[dict[str, Any]]) -> list[float | None]:
    if metric == "prefill":
        return [s["prefill_tps"] for s in samples if s["ok"]]
    if metric == "decode":
        return [s["decode_tps"] for s in samples if s["ok"]]
    # aggregate: each request's own completion rate, over its whole life
    return [(s["completion_tokens"] or 0) / s["total_s"] for s in samples if s["ok"] and s["total_s"] > 0]


def token_check(samples: list[dict[str, Any]], target: int) -> dict[str, Any]:
    offs = [s["token_off"] for s in samples if s.get("token_off") is not None]
    worst = max(offs, key=abs) if offs else None
    bad = [s["index"] for s in samples if s.get("token_off") is not None and abs(s["token_off"]) > TOKEN_TOLERANCE]
    return {"target": target, "tolerance": TOKEN_TOLERANCE, "worst_off": worst, "outside": bad,
            "ok": bool(offs) and not bad}


@dataclass
class Calibrated:
    """What every measurement at one context shares: the model, the calibration, the warm-up."""

    cfg: BenchConfig
    calibration: prompts.Calibration
    warmup: dict[str, Any] | None


def prepare(endpoint: Endpoint, cfg: BenchConfig, *, show_progress: bool) -> Calibrated:
    """Calibrate the padding against the server's own token counts, then warm up at the
    target context (the first full request after a boot pays a one-time JIT tax: measured,
    reported, excluded). Calibrating first keeps the warm-up inside the context whatever the
    tokenizer: a guessed padding overflowed a 512-token model whose tokenizer prices a word
    at three tokens."""
    cal = prompts.calibrate(cfg.n_prompts, cfg.ctx, make_probe(endpoint, cfg), f"k{secrets.token_hex(4)}")
    warm: dict[str, Any] | None = None
    if cfg.warmup:
        first = prompts.materialize(cal, 1, cfg.ctx, f"w{secrets.token_hex(4)}")[0]
        body = request_body(cfg, first.text, cfg.tokens if cfg.metric != "prefill" else 1)
        t = stream(endpoint, APIS[cfg.api], body, clock_zero=time.perf_counter(), timeout=cfg.timeout)
        if not t.ok:
            raise OperationError(f"warm-up request to {endpoint.url} failed: {t.error}")
        warm = sample_dict(-1, first.kind, first.target_tokens, t)
    return Calibrated(cfg, cal, warm)


def measure(endpoint: Endpoint, prep: Calibrated, *, concurrency: int, n_prompts: int, show_progress: bool,
            label: str) -> dict[str, Any]:
    """One measured pass: fresh nonces, metrics before/after, samples and summary."""
    cfg = prep.cfg
    padded = prompts.materialize(prep.calibration, n_prompts, cfg.ctx, f"m{secrets.token_hex(4)}")
    items: list[Item] = [(p.index, p.kind, p.target_tokens, APIS[cfg.api], request_body(cfg, p.text, cfg.tokens))
                         for p in padded]
    before = metrics.snapshot(endpoint)
    outcome = fire(endpoint, items, concurrency=concurrency, label=label, show_progress=show_progress,
                   timeout=cfg.timeout)
    after = metrics.snapshot(endpoint) if not outcome.interrupted else None
    acc = metrics.acceptance(before, after)
    value = headline(cfg.metric, outcome.samples, outcome.wall_s)
    failed = [s for s in outcome.samples if not s["ok"]]
    return {
        "concurrency": concurrency,
        "result": {"metric": cfg.metric, "value": value, "unit": "tok/s"},
        "summary": stats.summary(per_request_values(cfg.metric, outcome.samples)),
        "wall_s": outcome.wall_s,
        "completion_tokens": sum(s["completion_tokens"] or 0 for s in outcome.samples if s["ok"]),
        "failed": len(failed),
        "acceptance": acc.as_dict() if acc else None,
        "server_token_deltas": metrics.token_deltas(before, after),
        "token_check": token_check(outcome.samples, cfg.ctx),
        "samples": outcome.samples,
        "interrupted": outcome.interrupted,
    }


def run_bench(endpoint: Endpoint, cfg: BenchConfig, env: dict[str, Any], *, show_progress: bool = True
              ) -> dict[str, Any]:
    """A whole bench run as a results document (kind "bench")."""
    cfg.check()
    if cfg.metric == "aggregate" and cfg.n_prompts < cfg.concurrency:
        note(f"aggregate at C={cfg.concurrency} needs at least {cfg.concurrency} requests; sending {cfg.concurrency}")
        cfg.n_prompts = cfg.concurrency
    prep = prepare(endpoint, cfg, show_progress=show_progress)
    point = measure(endpoint, prep, concurrency=cfg.concurrency, n_prompts=cfg.n_prompts,
                    show_progress=show_progress, label=f"{cfg.metric} ctx={cfg.ctx} C={cfg.concurrency}")
    return {"kind": "bench", "environment": env, "config": cfg.as_dict(),
            "calibration": {"tokens_per_filler_word": prep.calibration.rate, "probes": prep.calibration.probes},
            "warmup": prep.warmup, **point}
