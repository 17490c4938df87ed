"""bench against the simulated vLLM server (a host process on a free loopback port): the
measured rates must match the sim's configured truth."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from simkit import run_cli

from b70deploy.bench import run as bench_run
from b70deploy.bench.client import Endpoint
from b70deploy.bench.progress import Progress
from b70deploy.bench.run import APIS, BenchConfig, fire, request_body, run_bench
from b70deploy.bench.sweep import run_sweep
from b70deploy.sim.server import aggregate_tps

SimFactory = Callable[..., Any]  # the sim_factory fixture (tests/bench/conftest.py)


def faster(fast: float | None, slow: float | None) -> bool:
    """An ordering, not a tolerance: the sim configured twice as fast measures faster. How close
    each figure comes to the sim's configured truth is benchmarks/bench_accuracy.py's to say
    (a loaded core stretches the client's clock, not the sim's sleeps)."""
    return fast is not None and slow is not None and fast > slow > 0


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_prefill_and_decode_order_as_the_configured_rates(sim_factory: SimFactory, api: str) -> None:
    docs = {}
    for name, scale in (("sim-a", 1), ("sim-b", 2)):
        # 20 and 40 tokens/s: 25-50 ms a token, far above a loaded machine's scheduling delays,
        # which at 200/400 tokens/s (2.5-5 ms) could make both sims measure the same
        sim = sim_factory(name, prefill_tps=8000 * scale, decode_tps=20 * scale)
        ep = Endpoint.parse(sim.url)
        pre = run_bench(ep, BenchConfig(metric="prefill", ctx=4096, n_prompts=3, api=api, model=name), {},
                        show_progress=False)
        dec = run_bench(ep, BenchConfig(metric="decode", ctx=512, n_prompts=3, max_tokens=16, api=api,
                                        model=name), {}, show_progress=False)
        docs[name] = (pre, dec)
        for doc in (pre, dec):
            assert doc["token_check"]["ok"], doc["token_check"]  # server's prompt_tokens within 1% of the target
            assert doc["summary"]["n"] == 3 and doc["failed"] == 0
            assert doc["warmup"]["ok"] and doc["warmup"]["index"] == -1  # measured, reported, not in samples
            assert all(abs(s["prompt_tokens"] - s["target_tokens"]) <= 0.01 * s["target_tokens"]
                       for s in doc["samples"])
            assert all(s["ok"] for s in doc["samples"])
        assert all(s["completion_tokens"] == 16 for s in dec["samples"])
    (pre_a, dec_a), (pre_b, dec_b) = docs["sim-a"], docs["sim-b"]
    assert faster(pre_b["result"]["value"], pre_a["result"]["value"]), (pre_a["result"], pre_b["result"])
    assert faster(dec_b["result"]["value"], dec_a["result"]["value"]), (dec_a["result"], dec_b["result"])


def test_aggregate_grows_with_concurrency_as_the_sim_does(sim_factory: SimFactory) -> None:
    sim = sim_factory("sim-a", prefill_tps=1e6, decode_tps=30, alpha=0.04)  # 33 ms a token: see above
    cfg = BenchConfig(metric="aggregate", ctx=256, n_prompts=1, max_tokens=48, model="sim-a")
    doc = run_sweep(Endpoint.parse(sim.url), cfg, [1, 2, 4], {}, show_progress=False)
    values = {p["concurrency"]: p["result"]["value"] for p in doc["points"]}
    assert [p["concurrency"] for p in doc["points"]] == [1, 2, 4]
    # the sim's model grows the aggregate with each step (1 -> 2 -> 4 streams: x1.92, x3.57)
    assert aggregate_tps(4, 30, 0.04) > aggregate_tps(2, 30, 0.04) > aggregate_tps(1, 30, 0.04)
    assert faster(values[2], values[1]) and faster(values[4], values[2]), values
    for p in doc["points"]:
        assert p["failed"] == 0 and all(s["completion_tokens"] == 48 for s in p["samples"]), p


def test_acceptance_from_metrics_when_speculative(sim_factory: SimFactory) -> None:
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
                       "prompt_lookup_min": 2})
    sim = sim_factory("sim-ng", prefill_tps=1e6, decode_tps=1000, speculative=spec, accept_rate=0.4)
    doc = run_bench(Endpoint.parse(sim.url), BenchConfig(metric="decode", ctx=256, n_prompts=2, max_tokens=40,
                                                          model="sim-ng"), {}, show_progress=False)
    acc = doc["acceptance"]
    assert acc is not None and acc["drafts"] > 0
    # counters, not clocks: accepted over drafted tokens as the sim drew them (rate 0.4)
    assert abs(acc["acceptance_rate"] / 0.4 - 1) <= 0.15, acc
    assert acc["mean_acceptance_length"] == pytest.approx(1 + acc["accepted_tokens"] / acc["drafts"])


def test_no_spec_counters_means_no_acceptance(sim_factory: SimFactory) -> None:
    sim = sim_factory("sim-a", prefill_tps=1e6, decode_tps=2000)
    doc = run_bench(Endpoint.parse(sim.url), BenchConfig(metric="decode", ctx=128, n_prompts=1, max_tokens=8,
                                                          model="sim-a"), {}, show_progress=False)
    assert doc["acceptance"] is None or doc["acceptance"]["drafts"] == 0


def test_ctrl_c_keeps_the_samples_gathered_so_far(sim_factory: SimFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = sim_factory("sim-a", prefill_tps=1e6, decode_tps=100)
    ep = Endpoint.parse(sim.url)
    cfg = BenchConfig(metric="decode", ctx=64, n_prompts=4, model="sim-a")
    quick = request_body(cfg, "hello there", 5)      # 0.05 s
    slow = request_body(cfg, "hello there", 3000)    # 30 s: in flight when Ctrl-C comes
    items = [(0, "qa", None, APIS["completions"], quick), (1, "qa", None, APIS["completions"], slow)]
    # Ctrl-C lands right after the volley took the quick request's sample (the 30 s one is then in
    # flight): raised there, in the thread a Ctrl-C interrupts, as Python turns SIGINT into
    # KeyboardInterrupt. A signal sent from another thread reached the volley late or not at all
    # on a loaded machine (load 13 on 2 cores).
    class CtrlC(Progress):
        def step(self, ok: bool = True, detail: str = "") -> None:
            super().step(ok, detail)
            raise KeyboardInterrupt

    monkeypatch.setattr(bench_run, "Progress", CtrlC)
    out = fire(ep, items, concurrency=2, label="t", show_progress=False, timeout=60)
    assert out.interrupted
    done = {s["index"]: s for s in out.samples}
    assert done[0]["ok"] and done[0]["completion_tokens"] == 5
    assert 1 not in done or not done[1]["ok"]


def test_cli_bench_writes_a_results_file_and_compare_plots(sim_factory: SimFactory, tmp_path: Path) -> None:
    # decode 20 against 40 tokens/s, as above: an ordering a loaded machine cannot blur
    a = sim_factory("sim-a", prefill_tps=5000, decode_tps=20)
    b = sim_factory("sim-b", prefill_tps=10000, decode_tps=40)
    files = []
    for sim, stack in ((a, "old-stack"), (b, "new-stack")):
        for metric, extra in (("prefill", ["--ctx", "512"]), ("decode", ["--ctx", "256", "--max-tokens", "16"])):
            out = tmp_path / f"{stack}-{metric}.json"
            r = run_cli(None, "bench", "--metric", metric, "--endpoint", sim.url, "--stack", stack,
                        "--n-prompts", "2", "--note", "test", "--output", str(out), "-q", *extra, in_process=True)
            assert r.returncode == 0, (r.stdout + r.stderr)
            files.append(out)
    doc = json.loads(files[0].read_text())
    env = doc["environment"]
    assert env["stack"] == "old-stack" and env["endpoint"] == a.url and env["note"] == "test"
    assert env["vllm_version"] and env["model"] == "sim-a" and env["date"]
    assert {"n", "min", "median", "mean", "max"} <= set(doc["summary"])
    png = tmp_path / "compare.png"
    r = run_cli(None, "bench", "compare", *map(str, files), "--plot", str(png), in_process=True)
    assert r.returncode == 0, (r.stdout + r.stderr)
    assert "new-stack (test)/old-stack (test)" in (r.stdout + r.stderr)
    assert png.stat().st_size > 10_000
    r = run_cli(None, "bench", "compare", *map(str, files), "--json", in_process=True)
    rows: list[dict[str, Any]] = json.loads(r.stdout)
    dec = next(x for x in rows if x["metric"] == "decode")
    # compare's ratio is exactly the two files' results; that the faster sim measures faster is
    # an ordering (how close to 2 it comes is benchmarks/bench_accuracy.py's to say)
    old_dec, new_dec = (json.loads(f.read_text())["result"]["value"] for f in (files[1], files[3]))
    assert dec["ratios"]["new-stack (test)"] == pytest.approx(new_dec / old_dec, rel=1e-6)
    assert dec["ratios"]["new-stack (test)"] > 1


def _served(url: str) -> tuple[float, float]:
    """(generation tokens, finished requests) as the server's /metrics counts them."""
    text = requests.get(f"{url}/metrics", timeout=5).text

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))

    return total("vllm:generation_tokens_total"), total("vllm:request_success_total")


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_token_counts_hold_when_speculative_steps_group_tokens_per_chunk(sim_factory: SimFactory, api: str) -> None:
    # vLLM streams one chunk per engine step; with ngram drafts a step carries several tokens
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
                       "prompt_lookup_min": 2})
    sim = sim_factory("sim-ng", prefill_tps=1e6, decode_tps=400, speculative=spec, accept_rate=0.6)
    tokens0, requests0 = _served(sim.url)
    doc = run_bench(Endpoint.parse(sim.url), BenchConfig(metric="decode", ctx=256, n_prompts=3, max_tokens=120,
                                                          api=api, model="sim-ng"), {}, show_progress=False)
    tokens1, requests1 = _served(sim.url)
    timed = [doc["warmup"], *doc["samples"]]
    # the server's own count, less one token for each prompt-calibration request (make_probe asks for 1)
    server = (tokens1 - tokens0) - (requests1 - requests0 - len(timed))
    counted = sum(s["completion_tokens"] for s in timed)
    chunks = sum(s["content_chunks"] for s in timed)
    assert abs(counted / server - 1) <= 0.01, (counted, server)
    assert chunks < 0.6 * server  # grouped: a count of chunks would be far off
    assert all(s["completion_tokens"] == 120 for s in doc["samples"])
    assert doc["result"]["value"] is not None  # its closeness to 400 tok/s: benchmarks/bench_accuracy.py


def test_decode_context_fits_the_models_max_model_len(sim_factory: SimFactory, tmp_path: Path) -> None:
    """Issue 39, point 4: the default --ctx 8192 on a model whose /v1/models says max_model_len 8192 got a raw
    400 on every request. The default is lowered to fit (a note says so); a --ctx given that cannot fit is
    refused before the first request, in one line with the --ctx that fits."""
    sim = sim_factory("small", prefill_tps=1e6, decode_tps=2000, max_model_len=8192)
    out = tmp_path / "decode.json"
    r = run_cli(None, "bench", "--metric", "decode", "--endpoint", sim.url, "--n-prompts", "1", "--max-tokens", "8",
                "--no-warmup", "--output", str(out), "-q", in_process=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "context lowered to 8,184 tokens" in r.stderr and "max_model_len 8,192" in r.stderr
    assert json.loads(out.read_text())["config"]["ctx"] == 8184
    refused = run_cli(None, "bench", "--metric", "decode", "--endpoint", sim.url, "--ctx", "8192", "-q",
                      in_process=True)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
    [line] = refused.stderr.splitlines()
    assert "exceeds the model's max_model_len 8,192" in line and "fix: --ctx 8064 or less" in line, line
