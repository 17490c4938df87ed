"""Bench commands: bench (prefill | decode | aggregate), bench sweep, bench compare, bench cycle,
capture, replay."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..actions.bench_cycle import BenchCycle, CycleResult
from ..bench import compare as cmp
from ..bench import metrics, stats
from ..bench import replay as rp
from ..bench import sweep as sweep_mod
from ..bench.capture import CaptureWriter, is_loopback, make_server, parse_listen
from ..bench.client import Endpoint
from ..bench.deployment import current_deployment_info, deployment_key, environment, server_facts
from ..bench.guards import SUFFIX_DEADLOCK_C, context_fit, suffix_deadlock
from ..bench.plot import render
from ..bench.results import default_path, write
from ..bench.run import BenchConfig, resolve_model, run_bench
from ..errors import UserError
from ..state.stamps import now_iso
from ..ui.output import emit_json, note, table, warn
from . import options
from .base import Ctx, mutate, pass_ctx
from .complete import stack_names

BENCH_EPILOG = """\b
Examples:
  b70deploy bench --metric prefill --ctx 8192 --n-prompts 5
  b70deploy bench --metric decode --endpoint http://127.0.0.1:8001 --stack w4a16 --ctx 32768
  b70deploy bench --metric aggregate --ctx 8192 --concurrency 12 --max-tokens 200 --note nodraft,C12
  b70deploy bench sweep --concurrency 1,2,3,4,12 --ctx 8192
  b70deploy bench compare old.json new.json --plot compare.png

\b
prefill tok/s   = prompt tokens / time to first token
decode tok/s    = (completion tokens - 1) / time from first to last token
aggregate tok/s = completion tokens of all requests / wall time, at concurrency C
The first request (JIT warm-up) is measured, reported and excluded. Prompts come from a
built-in mixed set padded to --ctx; padding is calibrated against the server's own
usage.prompt_tokens and every request is checked to be within 1% of the target.
Ctrl-C keeps the samples gathered so far (written to the results file, exit 130)."""


def _common(f: Any) -> Any:
    """Options shared by `bench` and `bench sweep`."""
    opts = [
        click.option("--endpoint", metavar="URL", help="Server to bench (default: the node's current deployment)."),
        click.option("--model", metavar="ALIAS", help="Served model name (default: the first in /v1/models)."),
        click.option("--ctx", "ctx_tokens", type=int, default=8192, show_default=True,
                     help="Prompt tokens per request."),
        click.option("--n-prompts", type=int, default=5, show_default=True, help="Measured requests."),
        click.option("--max-tokens", type=int, help="Completion tokens (default: prefill 1, decode 128, "
                                                    "aggregate 200)."),
        click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
                     help="Which OpenAI API to call."),
        click.option("--stack", metavar="NAME", help="Label results with this stack name (for an explicit "
                                                     "--endpoint, e.g. a dark-port stack)."),
        click.option("--note", metavar="TEXT", help="Free text kept with the results (e.g. nodraft,C12)."),
        click.option("--output", metavar="FILE", help="Results file (default: <state_dir>/bench/<date>-....json)."),
        click.option("--no-warmup", is_flag=True, help="Skip the excluded warm-up request."),
        click.option("--no-ignore-eos", is_flag=True, help="Let the model stop early (default: generate exactly "
                                                          "--max-tokens, vLLM's ignore_eos)."),
        click.option("--strict", is_flag=True, help="Exit 1 when a prompt's token count is off the target by "
                                                   "more than 1%."),
        click.option("--timeout", type=float, default=1800.0, show_default=True, help="Seconds per request."),
        click.option("--quiet", "-q", is_flag=True, help="No progress lines."),
        options.as_json("the results document"),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _target(ctx: Ctx, endpoint: str | None, stack: str | None, note: str | None,
            model: str | None, concurrency: int = 1) -> tuple[Endpoint, dict[str, Any]]:
    known = None
    # An explicit endpoint's key from OPENAI_API_KEY, the variable OpenAI clients read; the node's own
    # deployment's from its container (what vLLM itself reads).
    key = os.environ.get("OPENAI_API_KEY")
    if endpoint is None:
        known = current_deployment_info(ctx.node)
        endpoint = str(known["endpoint"])
        key = deployment_key(ctx.node)
        # The node's GPU devices are Intel's (/dev/dri): an XPU node unless its config says none.
        why = suffix_deadlock({"name": known["stack"], "speculative": known.get("speculative")}, concurrency,
                              xpu=ctx.node.config.device_dir is not None)
        if why:
            raise UserError(why, where="--concurrency",
                            fix=f"measure at C <= {SUFFIX_DEADLOCK_C - 1}, or switch to a stack without suffix "
                            "decoding first")
    ep = Endpoint.parse(endpoint, key)
    env = environment(ep, known, model=model, note=note, date=now_iso())
    if stack:
        env["stack"] = stack
    return ep, env


def _fitted_ctx(click_ctx: click.Context, cfg: BenchConfig, facts: dict[str, Any]) -> int:
    """--ctx within the model's max_model_len (see guards.context_fit), before the first request."""
    given = click_ctx.get_parameter_source("ctx_tokens") is not click.core.ParameterSource.DEFAULT
    limit = (facts.get("max_model_len") or {}).get(cfg.model)
    ctx, said = context_fit(cfg.ctx, cfg.tokens, limit, given=given)
    if said and given and limit is not None:
        raise UserError(said, where="--ctx", fix=f"--ctx {limit - cfg.tokens} or less (or fewer --max-tokens)")
    if said:
        note(said)
    return ctx


def _output_path(ctx: Ctx, output: str | None, doc: dict[str, Any]) -> Path:
    if output:
        return Path(output)
    return default_path(ctx.node.state_dir / "bench", doc)


def _finish(ctx: Ctx, doc: dict[str, Any], output: str | None, as_json: bool) -> Path:
    path = write(_output_path(ctx, output, doc), doc)
    if as_json:
        emit_json({**doc, "file": str(path)})
    return path


def _token_report(check: dict[str, Any] | None, strict: bool) -> bool:
    """Warn (or fail with --strict) when prompts missed the target context by more than 1%."""
    if not check or check.get("worst_off") is None:
        warn("the server reported no usage.prompt_tokens: the context could not be checked")
        return not strict
    if check["outside"]:
        warn(f"{len(check['outside'])} prompt(s) off the {check['target']:,}-token target by more than 1% "
             f"(worst {check['worst_off'] * 100:+.2f}%)")
        return not strict
    return True


def _describe_point(point: dict[str, Any], metric: str) -> str:
    s = point["summary"]
    parts = [f"{stats.fmt_rate(point['result']['value'])} tok/s"]
    if s["n"]:
        parts.append(f"n={s['n']}, per request median {stats.fmt_rate(s['median'])}, "
                     f"min {stats.fmt_rate(s['min'])}, max {stats.fmt_rate(s['max'])}")
    acc = metrics.describe(point.get("acceptance"))
    if acc:
        parts.append(acc)
    if point.get("failed"):
        parts.append(f"{point['failed']} failed")
    return "; ".join(parts)


def _warmup_line(doc: dict[str, Any]) -> str | None:
    w = doc.get("warmup")
    if not w:
        return None
    return (f"warm-up (excluded): {w['total_s']:.2f} s total, time to first token {w['ttft_s']:.3f} s "
            f"for {w.get('prompt_tokens') or '?'} prompt tokens")


@click.group(invoke_without_command=True, epilog=BENCH_EPILOG)
@click.option("--metric", type=click.Choice(["prefill", "decode", "aggregate"]), help="What to measure.")
@click.option("--concurrency", "-c", type=int, default=1, show_default=True, help="Requests in flight.")
@_common
@pass_ctx
@click.pass_context
def bench(click_ctx: click.Context, ctx: Ctx, metric: str | None, concurrency: int, endpoint: str | None,
          model: str | None, ctx_tokens: int, n_prompts: int, max_tokens: int | None, api: str, stack: str | None,
          note: str | None, output: str | None, no_warmup: bool, no_ignore_eos: bool, strict: bool,
          timeout: float, quiet: bool, as_json: bool) -> None:
    if click_ctx.invoked_subcommand is not None:
        return

    if metric is None:
        raise UserError("which metric?", where="--metric", fix="give --metric prefill, decode or aggregate")
    ep, env = _target(ctx, endpoint, stack, note, model, concurrency)
    cfg = BenchConfig(metric=metric, ctx=ctx_tokens, n_prompts=n_prompts, concurrency=concurrency,
                      max_tokens=max_tokens, api=api, ignore_eos=not no_ignore_eos, timeout=timeout,
                      warmup=not no_warmup)
    cfg.check()
    facts = server_facts(ep)
    cfg.model = resolve_model(ep, model, env.get("served_models") or facts["models"])
    env["model"] = cfg.model
    cfg.ctx = _fitted_ctx(click_ctx, cfg, facts)
    doc = run_bench(ep, cfg, env, show_progress=not quiet)
    path = _finish(ctx, doc, output, as_json)
    tokens_ok = _token_report(doc.get("token_check"), strict)
    if not as_json:
        w = _warmup_line(doc)
        if w:
            click.echo(w)
        click.echo(f"{metric} ctx={ctx_tokens:,} C={concurrency} on {env.get('stack') or ep.url}: "
                   f"{_describe_point(doc, metric)}")
        click.echo(f"results: {path}")
    if doc["interrupted"]:
        click.echo(f"interrupted: kept {len(doc['samples'])} sample(s) in {path}", err=True)
        raise SystemExit(130)
    if not tokens_ok or doc["result"]["value"] is None:
        raise SystemExit(1)


@bench.command(epilog="""\b
Example:
  b70deploy bench sweep --concurrency 1,2,3,4,12 --ctx 8192 --max-tokens 200
Each level sends C x --waves requests together; one warm-up and one calibration serve all.""")
@click.option("--concurrency", "-c", "levels", default="1,2,3,4,12", show_default=True,
              help="Comma list of concurrency levels.")
@click.option("--waves", type=int, default=1, show_default=True, help="Requests per level = C x waves.")
@_common
@pass_ctx
def sweep(ctx: Ctx, levels: str, waves: int, endpoint: str | None, model: str | None, ctx_tokens: int,
          n_prompts: int, max_tokens: int | None, api: str, stack: str | None, note: str | None,
          output: str | None, no_warmup: bool, no_ignore_eos: bool, strict: bool, timeout: float, quiet: bool,
          as_json: bool) -> None:
    """Aggregate tok/s across concurrency levels, with the change per step."""
    lv = sweep_mod.parse_levels(levels)
    if waves < 1:
        raise UserError("waves must be at least 1", where="--waves", fix="e.g. --waves 2")
    ep, env = _target(ctx, endpoint, stack, note, model, max(lv))
    cfg = BenchConfig(metric="aggregate", ctx=ctx_tokens, n_prompts=n_prompts, concurrency=max(lv),
                      max_tokens=max_tokens, api=api, ignore_eos=not no_ignore_eos, timeout=timeout,
                      warmup=not no_warmup)
    cfg.check()
    facts = server_facts(ep)
    cfg.model = resolve_model(ep, model, env.get("served_models") or facts["models"])
    env["model"] = cfg.model
    cfg.ctx = _fitted_ctx(click.get_current_context(), cfg, facts)
    doc = sweep_mod.run_sweep(ep, cfg, lv, env, waves=waves, show_progress=not quiet)
    path = _finish(ctx, doc, output, as_json)
    tokens_ok = all(_token_report(p.get("token_check"), strict) for p in doc["points"])
    if not as_json:
        w = _warmup_line(doc)
        if w:
            click.echo(w)
        table(sweep_mod.SWEEP_HEADERS, sweep_mod.table_rows(doc),
              title=f"aggregate tok/s, ctx={ctx_tokens:,}, {env.get('stack') or ep.url}")
        click.echo(f"results: {path}")
    if doc["interrupted"]:
        click.echo(f"interrupted: kept {len(doc['points'])} level(s) in {path}", err=True)
        raise SystemExit(130)
    if not tokens_ok:
        raise SystemExit(1)


@bench.command(epilog="""\b
Examples:
  b70deploy bench compare tq-*.json w4a16-*.json
  b70deploy bench compare ngram-sweep.json nosd-sweep.json --plot sweep.png
Files of one stack (same stack and note) fill one column; ratios are against the first column.""")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--plot", "plot_out", metavar="PNG", type=click.Path(path_type=Path),
              help="Also draw a chart (needs the [plot] extra: matplotlib).")
@click.option("--title", help="Chart title.")
@options.as_json("the matrix")
def compare(files: tuple[Path, ...], plot_out: Path | None, title: str | None, as_json: bool) -> None:
    """Compare results files: a table of tok/s per stack and the ratios new/old."""
    m = cmp.build(cmp.load_all(list(files)))
    if as_json:
        emit_json(cmp.as_json(m))
    else:
        table(cmp.headers(m), cmp.table_rows(m))
    if plot_out is not None:
        render(m, plot_out, title=title)
        click.echo(f"chart: {plot_out}", err=as_json)


def _bench_call(click_ctx: click.Context, stack: str, args: tuple[str, ...]) -> Callable[[str], int]:
    """BENCH ARGS as `bench` (or `bench sweep`) against a URL: parsed now, so a bad flag fails
    before the drain; run later in this process, its exit code returned."""
    if any(a == "--endpoint" or a.startswith("--endpoint=") for a in args):
        raise UserError("bench cycle points the bench at the dark stack itself", where="--endpoint",
                        fix="drop --endpoint from the arguments after --")
    command: click.Command = sweep if args[:1] == ("sweep",) else bench
    argv = [*(args[1:] if command is sweep else args), "--stack", stack]

    def make(url: str) -> click.Context:
        return command.make_context(f"bench{' sweep' if command is sweep else ''}", [*argv, "--endpoint", url],
                                    parent=click_ctx)

    if command is bench and make("http://127.0.0.1:1").params.get("metric") is None:
        raise UserError("which metric?", where="BENCH ARGS", fix="e.g. -- --metric decode --ctx 8192, or -- sweep ...")

    def call(url: str) -> int:
        try:
            with make(url) as sub:
                command.invoke(sub)
        except SystemExit as e:  # the bench says interrupted (130) or failed (1) this way
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return 0

    return call


@bench.command(context_settings={"ignore_unknown_options": True}, epilog="""\b
Examples:
  b70deploy bench cycle w4a16 -- --metric decode --ctx 32768 --n-prompts 5
  b70deploy bench cycle ngram --verify-wait 60 -- sweep --concurrency 1,2,4,12 --ctx 8192
Everything after -- goes to `bench` (or `bench sweep`), pointed at the dark stack. Ctrl-C or
SIGTERM at any point still removes the dark stack and restores production.""")
@click.argument("stack", shell_complete=stack_names)
@click.argument("bench_args", nargs=-1, type=click.UNPROCESSED)
@options.VERIFY_WAIT
@click.option("--timeout", type=float, help="Seconds to wait for the dark stack's /health (default: node timeouts).")
@options.LOCK_WAIT
@options.as_json("the cycle's outcome (the bench prints its own)")
@pass_ctx
@click.pass_context
def cycle(click_ctx: click.Context, ctx: Ctx, stack: str, bench_args: tuple[str, ...], verify_wait: float,
          timeout: float | None, lock_wait: float, as_json: bool) -> None:
    """Drain, verify, up --dark STACK, bench, down --dark, restore: production always comes back."""
    action = BenchCycle(ctx.node, stack, _bench_call(click_ctx, stack, bench_args), verify_wait=verify_wait,
                        timeout=timeout, lock_wait=lock_wait)

    def end(result: CycleResult) -> None:
        if as_json:
            emit_json(result.to_dict())
        else:
            for line in result.details:
                click.echo(line, err=True)
            click.echo(result.summary)
        if not result.ok:
            sys.exit(result.exit_code)

    mutate(action.run, quiet=as_json, end=end)


@click.command(epilog="""\b
Example:
  b70deploy capture --listen 127.0.0.1:8010 --upstream http://127.0.0.1:8000 --dir /var/lib/b70deploy/capture
Point clients at the listen address. Every request is forwarded, whatever happens to the
capture (full disk, unwritable folder): errors are logged, traffic flows. Authorization
headers are never stored. Stop with Ctrl-C.""")
@click.option("--listen", default="127.0.0.1:8010", show_default=True, metavar="[HOST:]PORT",
              help="Where to listen; a bare port binds loopback.")
@click.option("--upstream", metavar="URL", help="Server to forward to (default: the node's current deployment).")
@click.option("--dir", "folder", required=True, type=click.Path(path_type=Path), help="Capture folder.")
@click.option("--segment-mb", type=float, default=64.0, show_default=True, help="Rotate segments at this size.")
@click.option("--max-mb", type=float, default=1024.0, show_default=True,
              help="Keep at most this much; the oldest segments go first.")
@pass_ctx
def capture(ctx: Ctx, listen: str, upstream: str | None, folder: Path, segment_mb: float, max_mb: float) -> None:
    host, port = parse_listen(listen)
    if segment_mb <= 0 or max_mb < segment_mb:
        raise UserError("need 0 < --segment-mb <= --max-mb", where="--segment-mb/--max-mb",
                        fix="e.g. --segment-mb 64 --max-mb 1024")
    up = Endpoint.parse(upstream or str(current_deployment_info(ctx.node)["endpoint"]))
    logging.basicConfig(level=logging.INFO, format="capture: %(message)s", stream=sys.stderr)
    if not is_loopback(host):
        warn(f"listening on {host}, not loopback: anyone who can reach it can use the server through it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        warn(f"capture folder {folder} is not usable ({e}); forwarding anyway, nothing will be captured until it is")
    writer = CaptureWriter(folder, segment_bytes=int(segment_mb * (1 << 20)), max_bytes=int(max_mb * (1 << 20)))
    try:
        server = make_server((host, port), up, writer)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}", where="--listen",
                        fix="pick a free port") from None
    click.echo(f"capturing http://{host}:{server.server_address[1]}/v1 -> {up.url}, into {folder} "
               f"(segments {segment_mb:g} MB, keep {max_mb:g} MB); Ctrl-C stops", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        writer.close()
        click.echo(f"capture stopped: {writer.written} record(s) written, {writer.errors} error(s), "
                   f"{writer.dropped} dropped", err=True)


@click.command(epilog="""\b
Examples:
  b70deploy replay /var/lib/b70deploy/capture --endpoint http://127.0.0.1:8001 --stack eagle3 --sample 200
  b70deploy replay ./cap --endpoint http://127.0.0.1:8001 --stack ngram --concurrency 4
  b70deploy bench compare eagle3-replay.json ngram-replay.json
Requests go out as captured (messages, response_format / guided_json, temperatures); only
stream (for timing) and, with --model, the model alias change. At concurrency 1 each
request's acceptance comes from /metrics deltas around it.""")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--endpoint", metavar="URL", help="Server to replay against (default: the current deployment).")
@click.option("--concurrency", "-c", type=int, default=1, show_default=True, help="Requests in flight.")
@click.option("--sample", type=int, help="Replay a random sample of N captured requests (default: all).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample.")
@click.option("--model", metavar="ALIAS", help="Send this model alias instead of the captured one.")
@click.option("--stack", metavar="NAME", help="Label results with this stack name.")
@click.option("--note", metavar="TEXT", help="Free text kept with the results.")
@click.option("--output", metavar="FILE", help="Results file (default: <state_dir>/bench/<date>-replay-....json).")
@click.option("--timeout", type=float, default=1800.0, show_default=True, help="Seconds per request.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@options.as_json("the results document")
@pass_ctx
def replay(ctx: Ctx, folder: Path, endpoint: str | None, concurrency: int, sample: int | None, seed: int,
           model: str | None, stack: str | None, note: str | None, output: str | None, timeout: float, quiet: bool,
           as_json: bool) -> None:
    records = rp.select(rp.load_captures(folder), sample, seed)
    ep, env = _target(ctx, endpoint, stack, note, model)
    doc = rp.run_replay(ep, records, env, concurrency=concurrency, model=model, timeout=timeout,
                        show_progress=not quiet, source=str(folder))
    path = _finish(ctx, doc, output, as_json)
    if not as_json:
        table(rp.REPLAY_HEADERS, rp.table_rows(doc))
        acc = metrics.describe(doc.get("acceptance"))
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(doc["outcomes"].items()))
        click.echo(f"replay of {len(records)} request(s) at C={concurrency} on {env.get('stack') or ep.url}: "
                   f"{stats.fmt_rate(doc['result']['value'])} tok/s aggregate, per-request decode median "
                   f"{stats.fmt_rate(doc['summary']['median'])} tok/s; "
                   + (f"{acc}; " if acc else "no speculative metrics; ")
                   + outcomes)
        click.echo(f"results: {path}")
    if doc["interrupted"]:
        click.echo(f"interrupted: kept {len(doc['samples'])} sample(s) in {path}", err=True)
        raise SystemExit(130)
