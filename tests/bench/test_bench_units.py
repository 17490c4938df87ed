"""Pure parts of bench: padding calibration, /metrics parsing, stats, results files, compare, ETA."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from b70deploy.bench import compare, metrics, prompts, results, stats
from b70deploy.bench.progress import eta_seconds, fmt_duration
from b70deploy.errors import UserError


def bpe_like(text: str) -> int:
    """A stand-in tokenizer unlike the sim's: long words cost more, plus a fixed template."""
    words = re.findall(r"\w+|[^\w\s]", text)
    return 11 + sum(1 + len(w) // 5 for w in words)


@pytest.mark.parametrize("count", [bpe_like, lambda t: len(t) // 4 + 3])
@pytest.mark.parametrize("target", [512, 8192, 30000])
def test_calibrated_padding_lands_within_one_percent(count, target: int) -> None:  # type: ignore[no-untyped-def]
    probes: list[int] = []

    def probe(text: str) -> int:
        probes.append(len(text))
        return int(count(text))

    cal = prompts.calibrate(16, target, probe, "kdeadbeef")
    padded = prompts.materialize(cal, 16, target, "m01234567")
    for p in padded:
        assert abs(count(p.text) - target) <= 0.01 * target, (p.index, count(p.text))
    assert cal.probes == len(probes) <= 16 + 6
    assert {p.kind for p in padded} == set(prompts.KINDS)


def test_nonces_differ_per_run_and_prompt() -> None:
    cal = prompts.Calibration(rate=1.1, probes=0, base_tokens={i: 40 for i in range(16)}, anchor=(327, 400))
    a = prompts.materialize(cal, 3, 400, "maaaaaaaa")
    b = prompts.materialize(cal, 3, 400, "mbbbbbbbb")
    assert len({p.text[:24] for p in a + b}) == 6  # no shared prefix for the prefix cache to hit


COMMON = {f" {w}" for w in prompts.FILLER_WORDS} | {"."}


def pretokenized_bpe(text: str) -> int:
    """A tokenizer like GPT-2's and Qwen's: a regex cuts text into pre-tokens (letters, digits
    and punctuation apart, each with its leading space), and each pre-token's price is its own
    business: one token for a common word or a full stop, else a hash, 1 to 4 tokens."""
    import zlib
    pieces = re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", text)
    return 7 + sum(1 if p in COMMON else 1 + zlib.crc32(p.encode()) % 4 for p in pieces)


@pytest.mark.parametrize("run", range(40))
def test_every_run_lands_on_a_small_target_whatever_its_random_nonces(run: int) -> None:
    # What CI met on vLLM 0.32 with the tiny model's BPE: a hex nonce of the calibration run
    # cost 3 tokens more than a measured one, 253 of 256 (-1.17%). The nonces come from
    # secrets per run, so every run must land, not most.
    import secrets
    cal = prompts.calibrate(3, 256, pretokenized_bpe, f"k{secrets.token_hex(4)}")
    for p in prompts.materialize(cal, 3, 256, f"m{secrets.token_hex(4)}"):
        got = pretokenized_bpe(p.text)
        assert abs(got - p.expected_tokens) <= 1, p.index  # a full stop more or less, no more
        assert abs(prompts.off_by(got, 256)) <= 0.01, (p.index, got)


def test_context_below_the_bare_prompt_is_a_user_error() -> None:
    with pytest.raises(UserError, match="--ctx"):
        prompts.calibrate(2, 20, lambda t: 40, "k00000000")


METRICS_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 500.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 81.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_acceptance_from_counter_deltas() -> None:
    before = metrics.parse(METRICS_TEXT)
    after = metrics.parse(METRICS_TEXT.replace(" 100.0", " 200.0").replace(" 500.0", " 1000.0")
                          .replace(" 81.0", " 162.0"))
    acc = metrics.acceptance(before, after)
    assert acc is not None
    assert acc.mean_acceptance_length == pytest.approx(1.81)  # the post's EAGLE-3 figure
    assert acc.acceptance_rate == pytest.approx(81 / 500)
    assert metrics.acceptance(metrics.parse("vllm:num_requests_running 0\n"), metrics.parse("")) is None


def test_stats_and_formats() -> None:
    s = stats.summary([3.0, 1.0, 2.0, None])
    assert (s["n"], s["min"], s["median"], s["mean"], s["max"]) == (3, 1.0, 2.0, 2.0, 3.0)
    assert stats.summary([])["n"] == 0
    assert stats.fmt_change(stats.change(13.96, 11.22)) == "+24%"
    assert stats.fmt_ratio(stats.ratio(39429.77, 1929.28)) == "20.4x"


def _bench_doc(stack: str, metric: str, ctx: int, c: int, value: float) -> dict:  # type: ignore[type-arg]
    return {"kind": "bench", "environment": {"stack": stack, "note": None},
            "config": {"metric": metric, "ctx": ctx, "concurrency": c},
            "result": {"metric": metric, "value": value, "unit": "tok/s"}, "acceptance": None}


def test_compare_groups_files_by_stack_and_takes_ratios_to_the_first(tmp_path: Path) -> None:
    files = []
    for i, d in enumerate([_bench_doc("tq-256k", "prefill", 8192, 1, 1929.28),
                           _bench_doc("tq-256k", "decode", 8192, 1, 8.83),
                           _bench_doc("w4a16", "prefill", 8192, 1, 39429.77),
                           _bench_doc("w4a16", "decode", 8192, 1, 13.06)]):
        files.append(results.write(tmp_path / f"{i}.json", d))
    m = compare.build(compare.load_all(files))
    assert m.labels == ["tq-256k", "w4a16"]
    rows = compare.table_rows(m)
    assert rows[0][:3] == ["prefill", "8,192", "1"] and rows[0][-1] == "20.4x"
    assert rows[1][0] == "decode" and rows[1][-1] == "1.48x"


def test_sweep_rows_for_compare() -> None:
    sweep = {"kind": "sweep", "config": {"ctx": 8192}, "environment": {"stack": "ngram"},
             "points": [{"concurrency": c, "result": {"metric": "aggregate", "value": v}}
                        for c, v in ((1, 13.96), (2, 28.14), (12, 39.99))]}
    assert [(r.concurrency, r.value) for r in results.rows(sweep)] == [(1, 13.96), (2, 28.14), (12, 39.99)]


def test_results_files_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(UserError, match="schema"):
        results.load(bad)
    with pytest.raises(UserError, match="no such"):
        results.load(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{nope")
    with pytest.raises(UserError, match="JSON"):
        results.load(tmp_path / "junk.json")
    ok = results.write(tmp_path / "x" / "ok.json", _bench_doc("a", "decode", 1024, 1, 1.0))
    assert results.load(ok)["kind"] == "bench"
    p = results.default_path(tmp_path, {"kind": "bench", "environment": {"stack": "eagle3"},
                                        "config": {"metric": "decode", "ctx": 8192, "concurrency": 1}})
    assert p.name.endswith("-decode-eagle3-ctx8192-c1.json")


def test_eta() -> None:
    assert eta_seconds(0, 10, 5.0) is None
    assert eta_seconds(5, 10, 10.0) == pytest.approx(10.0)
    assert fmt_duration(75) == "1m15s" and fmt_duration(None) == "?"
