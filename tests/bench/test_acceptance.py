"""Acceptance three ways, from Prometheus text as vLLM exports it (two engines, `_created`
samples, the per-position counter with its `position` label), and the report's figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from b70deploy.bench import compare, metrics, results, sweep


def prom(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float]) -> str:
    """What vLLM's SpecDecodingProm exposes, split over two engines (labels engine, model_name)."""
    out: list[str] = []
    for name, value in (("vllm:spec_decode_num_drafts", drafts), ("vllm:spec_decode_num_draft_tokens", draft_tokens),
                        ("vllm:spec_decode_num_accepted_tokens", accepted)):
        out += [f"# HELP {name}_total x", f"# TYPE {name}_total counter"]
        out += [f'{name}_total{{engine="{e}",model_name="m"}} {value / 2}' for e in (0, 1)]
        out += [f"# TYPE {name}_created gauge",
                f'{name}_created{{engine="0",model_name="m"}} 1.7515e+09']
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    out += [f"# HELP {name}_total Accepted tokens per draft position.", f"# TYPE {name}_total counter"]
    for e in (0, 1):
        out += [f'{name}_total{{engine="{e}",model_name="m",position="{i}"}} {n / 2}' for i, n in enumerate(per_pos)]
    out += [f'{name}_created{{engine="0",model_name="m",position="0"}} 1.7515e+09']
    return "\n".join(out) + "\n"


ZERO = metrics.parse(prom(0, 0, 0, [0, 0, 0]))


def acc(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float]) -> metrics.Acceptance:
    a = metrics.acceptance(ZERO, metrics.parse(prom(drafts, draft_tokens, accepted, per_pos)))
    assert a is not None
    return a


def test_parse_keeps_positions_and_skips_created_samples() -> None:
    got = metrics.parse(prom(10, 30, 8, [5, 2, 1]))
    assert got[metrics.DRAFTS] == 10 and got[metrics.ACCEPTED] == 8  # engines summed, _created not counted
    assert [got[metrics.per_pos_key(i)] for i in range(3)] == [5, 2, 1]


def test_the_eagle3_replay_row_mean_acceptance_length() -> None:
    a = acc(100, 300, 81, [40, 25, 16])
    assert a.mean_acceptance_length == pytest.approx(1.81)       # the report's "mean accept 1.81"
    assert a.accepted_tokens_per_draft == pytest.approx(0.81)
    assert a.acceptance_rate == pytest.approx(0.27)
    assert a.per_position_acceptance == pytest.approx([0.40, 0.25, 0.16])
    assert sum(a.per_position_acceptance or []) == pytest.approx(a.accepted_tokens_per_draft)
    assert metrics.describe(a.as_dict()) == ("mean acceptance length 1.81, accepted tokens per draft 0.81, "
                                             "acceptance rate 27.0%, per-position acceptance 0.400/0.250/0.160")


def test_the_first_eagle3_try_acceptance_rate_and_the_cliff() -> None:
    short = acc(100, 300, 120, [60, 40, 20])
    assert f"{short.acceptance_rate * 100:.1f}%" == "40.0%"     # "draft acceptance runs 40% on short prompts"
    cliff = acc(1000, 3000, 0, [0, 0, 0])                         # ">= 2.6K: 0.00 (every position, zero)"
    assert cliff.accepted_tokens_per_draft == 0 and cliff.per_position_acceptance == [0, 0, 0]
    assert metrics.fmt_per_position(cliff.per_position_acceptance) == "0.000/0.000/0.000"
    sliding = acc(100, 300, 44, [30, 10, 4])                      # "~1.9K: 0.44 (sliding)"
    assert f"{sliding.accepted_tokens_per_draft:.2f}" == "0.44"


def test_a_server_without_the_per_position_counter() -> None:
    text = "\n".join(ln for ln in prom(100, 300, 81, [40, 25, 16]).splitlines() if "per_pos" not in ln)
    a = metrics.acceptance(metrics.parse(""), metrics.parse(text))
    assert a is not None and a.per_position_acceptance is None and a.mean_acceptance_length == pytest.approx(1.81)
    assert "per-position" not in (metrics.describe(a.as_dict()) or "")


def _doc(stack: str, c: int, value: float, a: metrics.Acceptance | None) -> dict[str, Any]:
    return {"kind": "bench", "environment": {"stack": stack, "note": None},
            "config": {"metric": "aggregate", "ctx": 2048, "concurrency": c},
            "result": {"metric": "aggregate", "value": value, "unit": "tok/s"},
            "acceptance": a.as_dict() if a else None}


def test_compare_prints_the_three_named_columns(tmp_path: Path) -> None:
    eagle, ngram = acc(100, 300, 81, [40, 25, 16]), acc(100, 500, 0, [0, 0, 0, 0, 0])
    files = [results.write(tmp_path / f"{i}.json", d) for i, d in enumerate([
        _doc("ngram", 1, 12.9, ngram), _doc("eagle3", 1, 20.9, eagle)])]
    m = compare.build(compare.load_all(files))
    hs = compare.headers(m)
    assert hs[-6:] == ["mean accept len ngram", "mean accept len eagle3", "accept rate ngram", "accept rate eagle3",
                       "per-position ngram", "per-position eagle3"]
    [row] = compare.table_rows(m)
    assert row[3:6] == ["12.90", "20.90", "1.62x"]
    assert row[-6:] == ["1.00", "1.81", "0.0%", "27.0%", "0.000/0.000/0.000/0.000/0.000", "0.400/0.250/0.160"]
    [j] = compare.as_json(m)
    assert j["acceptance_rate"]["eagle3"] == pytest.approx(0.27)
    assert j["per_position_acceptance"]["eagle3"] == pytest.approx([0.40, 0.25, 0.16])


def test_sweep_table_names_each_figure() -> None:
    doc = {"points": [{"concurrency": 1, "result": {"value": 20.9}, "acceptance": acc(100, 300, 81, [40, 25, 16])
                       .as_dict()}, {"concurrency": 4, "result": {"value": 67.2}, "acceptance": None}]}
    rows = sweep.table_rows(doc)
    assert dict(zip(sweep.SWEEP_HEADERS, rows[0], strict=True)) == {
        "concurrency": "C=1", "tok/s": "20.90", "per stream": "20.90", "change": "-", "mean accept len": "1.81",
        "accept rate": "27.0%", "per-position": "0.400/0.250/0.160", "failed": "0"}
    assert rows[1][4:7] == ["-", "-", "-"]
