"""Capture real-looking traffic through the proxy in front of one sim stack, then replay it
verbatim against a second (speculative) sim stack: acceptance and tok/s per request."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kit.serving import serving
from simkit import run_cli

from b70deploy.bench.capture import CaptureWriter, make_server, segments
from b70deploy.bench.client import Endpoint, post_json, stream
from b70deploy.bench.replay import load_captures, run_replay, select

SimFactory = Callable[..., Any]

TRAFFIC: list[dict[str, Any]] = [
    {"model": "prod", "temperature": 0.0, "max_tokens": 24, "response_format": {"type": "json_object"},
     "messages": [{"role": "system", "content": "Classify the sentiment of the headline. Reply in JSON."},
                  {"role": "user", "content": "Shares of Acme jump 12% after strong quarterly results"}]},
    {"model": "prod", "temperature": 0.2, "max_tokens": 20,
     "guided_json": {"type": "object", "properties": {"verdict": {"type": "string"}}},
     "messages": [{"role": "user", "content": "Is the home team favoured tonight? Answer as JSON."}]},
    {"model": "prod", "temperature": 0.7, "max_tokens": 30, "stream": True, "stream_options": {"include_usage": True},
     "messages": [{"role": "user", "content": "Write two lines about the sea."}]},
    {"model": "prod", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0},
]


@contextmanager
def capture_proxy(upstream: str, folder: Path) -> Iterator[str]:
    writer = CaptureWriter(folder)
    try:
        with serving(make_server(("127.0.0.1", 0), Endpoint.parse(upstream), writer)) as port:
            yield f"http://127.0.0.1:{port}"
            writer.flush()
    finally:
        writer.close()


def send_traffic(url: str) -> None:
    ep = Endpoint.parse(url)
    for body in TRAFFIC:
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        if body.get("stream"):
            assert stream(ep, path, body, clock_zero=0.0).ok
        else:
            status, _, _ = post_json(ep, path, body)
            assert status == 200


def test_capture_then_replay_on_a_second_stack(sim_factory: SimFactory, tmp_path: Path) -> None:
    spec = json.dumps({"method": "eagle3", "model": "/models/eagle3-draft", "num_speculative_tokens": 3})
    prod = sim_factory("prod", prefill_tps=1e6, decode_tps=800)
    eagle = sim_factory("prod", prefill_tps=1e6, decode_tps=1200, speculative=spec, accept_rate=0.6)
    cap = tmp_path / "cap"
    with capture_proxy(prod.url, cap) as proxy_url:
        send_traffic(proxy_url)
    records = load_captures(cap)
    assert [r["body"] for r in records] == TRAFFIC

    # replay through a second capture proxy in front of the eagle stack: what arrives is verbatim
    cap2 = tmp_path / "cap2"
    with capture_proxy(eagle.url, cap2) as url2:
        doc = run_replay(Endpoint.parse(url2), records, {"stack": "eagle3"}, concurrency=1, show_progress=False)
    arrived = [r["body"] for r in load_captures(cap2)]
    for sent, got in zip(TRAFFIC, arrived, strict=True):
        got = dict(got)
        assert got.pop("stream") is True and got.pop("stream_options") == {"include_usage": True}
        want = {k: v for k, v in sent.items() if k not in ("stream", "stream_options")}  # may differ: timing needs them
        assert got == want, "only stream/usage may change in a replay"

    assert doc["interrupted"] is False and len(doc["samples"]) == len(TRAFFIC)
    for s in doc["samples"]:
        assert s["ok"] and s["decode_tps"] and s["decode_tps"] > 0
        acc = s["acceptance"]
        assert acc is not None and acc["drafts"] > 0 and acc["mean_acceptance_length"] > 1.0
    # the sim ignores response_format, so JSON-requesting replays are flagged, not hidden
    assert {s["outcome"] for s in doc["samples"][:2]} <= {"ok", "bad-json"}
    assert doc["acceptance"]["mean_acceptance_length"] > 1.0
    assert doc["result"]["value"] > 0


def test_replay_cli_reports_per_request_rows_and_compares(sim_factory: SimFactory, tmp_path: Path) -> None:
    ngram = json.dumps({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
                        "prompt_lookup_min": 2})
    prod = sim_factory("prod", prefill_tps=1e6, decode_tps=800)
    b = sim_factory("prod", prefill_tps=1e6, decode_tps=600, speculative=ngram, accept_rate=0.1)
    cap = tmp_path / "cap"
    with capture_proxy(prod.url, cap) as proxy_url:
        send_traffic(proxy_url)
        send_traffic(proxy_url)
    outs = []
    for sim, stack in ((prod, "nosd"), (b, "ngram")):
        out = tmp_path / f"replay-{stack}.json"
        r = run_cli(None, "replay", str(cap), "--endpoint", sim.url, "--stack", stack, "--sample", "5",
                    "--concurrency", "2", "--output", str(out), "-q", in_process=True)
        assert r.returncode == 0, (r.stdout + r.stderr)
        assert "decode tok/s" in (r.stdout + r.stderr) and "replay of 5 request(s) at C=2" in (r.stdout + r.stderr)
        outs.append(out)
    doc = json.loads(outs[1].read_text())
    assert doc["acceptance"]["drafts"] > 0 and len(doc["samples"]) == 5
    assert all(s["acceptance"] is None for s in doc["samples"]), "per-request acceptance only at C=1"
    r = run_cli(None, "bench", "compare", *map(str, outs), in_process=True)
    assert r.returncode == 0 and "ngram/nosd" in (r.stdout + r.stderr) and "replay" in (r.stdout + r.stderr)


def test_sample_is_deterministic_and_keeps_order(tmp_path: Path) -> None:
    recs = [{"i": i} for i in range(50)]
    a, b = select(recs, 7, 3), select(recs, 7, 3)
    assert a == b and [r["i"] for r in a] == sorted(r["i"] for r in a)
    assert select(recs, None, 0) == recs


def test_torn_lines_are_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "cap"
    w = CaptureWriter(folder)
    w.record({"method": "POST", "path": "/v1/completions", "body": {"prompt": "x"}})
    w.flush()
    w.close()
    seg = segments(folder)[0]
    seg.write_text(seg.read_text() + '{"method": "POST", "pa')
    assert len(load_captures(folder)) == 1
