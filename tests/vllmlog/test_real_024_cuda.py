"""The real vLLM 0.24.0 CUDA logs and the GPU lane's results (tests/fixtures/vllm-0.24.0-cuda/), read
by the tool's own parsers to the facts the logs print."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from b70deploy.docker import sleepmode, standby
from b70deploy.docker.garbage import garbage_reason
from b70deploy.vllmlog.bootlog import parse_boot_facts
from b70deploy.vllmlog.diagnosis import diagnose

FIX = Path(__file__).parents[1] / "fixtures" / "vllm-0.24.0-cuda"


def _lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def _results(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIX / name).read_text())
    return doc


@pytest.mark.parametrize(("name", "kv_gib", "kv_tokens", "weights_gib", "compile_s", "init_s"), [
    ("sleep-h200.log", 111.86, 814_512, 15.27, 27.32, 50.71),
    ("lane-h100.log", 70.6, 660_944, 1.12, 32.29, 61.31),
    ("lane-h100-docker.log", 70.6, 660_944, 1.12, 28.41, 55.33),
])
def test_boot_facts_of_the_real_cuda_logs(name: str, kv_gib: float, kv_tokens: int, weights_gib: float,
                                          compile_s: float, init_s: float) -> None:
    f = parse_boot_facts(_lines(name))
    assert f.vllm_version == "0.24.0"
    assert (f.attention_backend, f.attention_fallback, f.flash_attn_version) == ("FLASH_ATTN", None, 3)
    assert (f.available_kv_gib, f.kv_cache_tokens, f.max_concurrency_len) == (kv_gib, kv_tokens, 40_960)
    assert (f.model_weights_gib, f.compile_seconds, f.init_engine_seconds) == (weights_gib, compile_s, init_s)
    assert f.async_scheduling_disabled is False and f.api_server_started


@pytest.mark.parametrize("name", ["sleep-h200.log", "lane-h100.log", "boot-h100.log", "lane-h100-bench.log",
                                  "lane-h100-docker.log"])
def test_a_healthy_cuda_log_with_sleeps_and_reloads_is_no_failure(name: str) -> None:
    # The reload's "WARNING [layerwise.py:255] RotaryEmbedding: Failed to load weights" serves correctly.
    assert diagnose(_lines(name)) is None


def test_vllms_own_sleep_seconds_are_read_from_the_engine_core_lines() -> None:
    text = "\n".join(_lines("sleep-h200.log"))
    fell = [float(m.group(1)) for m in standby._FELL.finditer(text) if m.group(2) == "fall asleep"]
    woke = [float(m.group(1)) for m in standby._FELL.finditer(text) if m.group(2) == "wake up"]
    # The first sleep of a process pins host memory: 10.2 s, the later ones 0.4 s.
    assert fell[:3] == [10.230108, 0.423548, 0.366993]
    assert woke[:3] == [0.82569, 0.777985, 0.820469]


def test_the_metrics_of_a_level_1_sleeper_name_its_level() -> None:
    asleep = _results("results-cycle-h100.json")["asleep_request"]["metrics_asleep"]
    assert sleepmode.level_in("\n".join(asleep)) == 1
    assert sleepmode.level_in(asleep[0]) is None  # num_requests_waiting alone says nothing of sleep


@pytest.mark.parametrize("name", ["results-cycle-h100.json", "results-cycle-h100-bench.json",
                                  "results-cycle-h100-docker.json"])
def test_on_the_gpu_level_2_fails_its_smoke_test_after_a_bare_wake_and_passes_after_the_documented_one(
        name: str) -> None:
    res = _results(name)
    bare = res["level2_bare_wake"]
    assert bare["health"] == 200  # the broken server says it is healthy
    assert bare["only_token_0"] and bare["token_0"] == "!" and res["token_0"] == "!"
    assert bare["text"] == "!" * 12
    assert garbage_reason(bare["text"]) == bare["judge"] == "a run of '!!!!!!!!'"
    assert [f.split(" returned ")[0] for f in bare["smoke_failed"]] == ["completion 'The capital of France is'"]
    # reload_weights alone: a prompt computed by the broken weights is still served from the prefix cache.
    assert bare["after_reload"] == res["reference"]
    assert not bare["after_reload_long_matches_reference"]
    assert bare["after_reset_long_matches_reference"] and bare["smoke_after_reset"][1] == []
    for row in res["level2"]["cycles"]:
        assert (row["metrics_level"], row["wake_level"]) == (2, 2)
        assert row["smoke"][1].startswith("completion 'The capital of France is' -> ")


def test_the_lane_results_hold_three_cold_boots_and_three_wakes_of_each_level() -> None:
    res, boots = _results("results-cycle-h100.json"), _results("results-boots-h100.json")
    cold = [res["boot_s"], *boots["boot_s"]]
    assert len(cold) == 3 and 100 < statistics.median(cold) < 200
    for level in ("level1", "level2"):
        assert res[level]["first_good_s"]["n"] == 3
        assert all(r["smoke"] and r["first_good_s"] >= r["wake_s"] for r in res[level]["cycles"])
    # Level 2 reloads the weights from disk: slower to its first good completion than level 1.
    assert res["level2"]["first_good_s"]["median"] > res["level1"]["first_good_s"]["median"]
    # A request sent while asleep waits and finishes after the wake; /health answers 200 while asleep.
    asleep = res["asleep_request"]
    assert asleep["health_asleep"] == 200 and asleep["text_matches_reference"] and asleep["error"] is None
    assert asleep["finished_s_after_send"] > asleep["wake_started_s_after_send"]


def test_bench_capture_and_replay_ran_through_the_real_server() -> None:
    bench = _results("results-cycle-h100-bench.json")["bench"]
    assert {k: v["exit"] for k, v in bench.items() if k != "capture"} == {
        "prefill": 0, "decode": 0, "aggregate": 0, "replay": 0}
    assert bench["capture"]["bench_exit"] == 0 and bench["capture"]["records"] > 0
    prefill, aggregate, replay = (_results(f) for f in ("bench-prefill-h100.json", "bench-aggregate-h100.json",
                                                         "replay-h100.json"))
    assert prefill["environment"]["vllm_version"] == "0.24.0" and prefill["environment"]["model"] == "lane"
    assert prefill["result"]["metric"] == "prefill" and prefill["result"]["value"] > 0 and not prefill["failed"]
    assert aggregate["concurrency"] == 8 and aggregate["result"]["value"] > 0
    assert replay["outcomes"] == {"ok": 10} and not replay["interrupted"]


def test_debians_docker_engine_ran_on_the_lent_gpu_machine_and_a_container_saw_the_gpu() -> None:
    text = (FIX / "docker-h100.txt").read_text()
    assert "Server Version: 20.10.24+dfsg1" in text and "Storage Driver: vfs" in text
    assert "GPU 0: NVIDIA H100 80GB HBM3" in text


def test_switch_and_rollback_with_standby_sleep_ran_through_docker_and_the_door_on_the_gpu() -> None:
    """Issue 36, deliver 4: `b70deploy switch` and `rollback` on the lent H100's own Docker engine, the door in
    front, `standby: sleep`, four clients through the door (scripts/gpu_lane_standby.py --eager)."""
    res = _results("results-standby-h100-docker.json")
    assert res["gpu"].startswith("NVIDIA H100") and res["node"]["standby"] == "sleep" and res["node"]["door"]["enabled"]
    switch, rollbacks = res["switch"], res["rollbacks"]
    assert res["first_switch"]["exit"] == 0 and switch["exit"] == 0 and [r["exit"] for r in rollbacks] == [0, 0]
    # Which revision answers through the door after each operation: its max_model_len, asked from outside.
    served = [op["after"]["models"][0]["max_model_len"] for op in (switch, *rollbacks)]
    assert served == [8192, 4096, 8192]
    # No client request failed, and the clients waited through the cold boot and little beyond it.
    assert [op["failed"] for op in (switch, *rollbacks)] == [0, 0, 0]
    assert switch["requests"] > 100 and res["compile_cache_before_switch"] == []
    assert switch["engine_s"] < switch["longest_wait_s"] < switch["engine_s"] + 3
    # A rollback is a wake: vLLM's own wake seconds, then the door; the second one under 1.5 s whole.
    assert all(r["engine_s"] < 0.5 for r in rollbacks) and rollbacks[1]["longest_wait_s"] < 1.5


@pytest.mark.parametrize(("name", "max_len", "fell", "woke"), [
    ("standby-h100-r1.log", 4096, [1.283986, 0.093778], [0.239267]),
    ("standby-h100-r2.log", 8192, [1.957229], [0.249852]),
])
def test_the_standby_slots_logs_from_docker_on_the_gpu(name: str, max_len: int, fell: list[float],
                                                       woke: list[float]) -> None:
    # `docker logs -t`: each line begins with the engine's timestamp, which the tool's parsers pass over.
    lines = _lines(name)
    f = parse_boot_facts(lines)
    assert (f.vllm_version, f.attention_backend, f.kv_cache_tokens, f.max_concurrency_len) == (
        "0.24.0", "FLASH_ATTN", 660_944, max_len)
    assert f.compile_seconds is None and f.api_server_started  # enforce_eager: nothing compiled
    assert diagnose(lines) is None
    text = "\n".join(lines)
    # The first sleep of a process pins host memory (1.3 to 2.0 s here), a later one 0.09 s.
    assert [float(m.group(1)) for m in standby._FELL.finditer(text) if m.group(2) == "fall asleep"] == fell
    assert [float(m.group(1)) for m in standby._FELL.finditer(text) if m.group(2) == "wake up"] == woke


def _steps(name: str) -> dict[str, dict[str, float]]:
    """Each run's step seconds from the tool's journal, keyed by the run's command (the later one of a name)."""
    runs: dict[str, str] = {}
    out: dict[str, dict[str, float]] = {}
    for line in _lines(name):
        event = json.loads(line)
        if event["event"] == "run-start":
            runs[event["run"]] = event["command"]
            out[event["command"]] = {}
        elif event["event"] == "step-done":
            out[runs[event["run"]]][event["step"]] = event["seconds"]
    return out


def test_switch_and_rollback_with_standby_on_the_gpu_with_vllms_compiled_boot() -> None:
    """Issue 35 on the lent H100 after the hold was trimmed: the same run without --eager (beta compiles and
    captures CUDA graphs). Beyond the cold boot the clients waited for alpha's first sleep (vLLM's own seconds,
    in its log) and little else; a rollback whose sleeper slept before is under 1 s whole; no request failed."""
    res = _results("results-standby-h100-compiled.json")
    switch, rollbacks = res["switch"], res["rollbacks"]
    assert res["gpu"].startswith("NVIDIA H100") and res["stacks"]["beta"]["enforce_eager"] is False
    assert [op["exit"] for op in (res["first_switch"], switch, *rollbacks)] == [0, 0, 0, 0]
    assert [op["after"]["models"][0]["max_model_len"] for op in (switch, *rollbacks)] == [8192, 4096, 8192]
    assert [op["failed"] for op in (switch, *rollbacks)] == [0, 0, 0] and switch["requests"] > 500
    alpha = "\n".join(_lines("standby-h100-compiled-r1.log"))
    fell = [float(m.group(1)) for m in standby._FELL.finditer(alpha) if m.group(2) == "fall asleep"]
    assert fell == [2.033134, 0.065684]  # the process's first sleep pins host memory; a later one does not
    assert switch["engine_s"] < switch["longest_wait_s"] < switch["engine_s"] + fell[0] + 1.5
    assert all(r["engine_s"] < 0.5 for r in rollbacks) and rollbacks[1]["longest_wait_s"] < 1.0
    steps = _steps("standby-h100-compiled-journal.jsonl")
    # The tool's own steps inside the hold: activate is the container's start alone, the checks one request.
    assert steps["switch beta"]["activate"] < 1.0 and steps["switch beta"]["check"] < 0.5
    assert steps["rollback"]["activate"] < 1.0 and steps["rollback"]["check"] < 0.5


def test_the_compiled_slots_log_from_docker_on_the_gpu() -> None:
    lines = _lines("standby-h100-compiled-r2.log")
    f = parse_boot_facts(lines)
    assert (f.vllm_version, f.attention_backend, f.kv_cache_tokens, f.max_concurrency_len) == (
        "0.24.0", "FLASH_ATTN", 660_944, 8192)
    assert (f.compile_seconds, f.init_engine_seconds) == (26.78, 35.23) and f.api_server_started
    assert diagnose(lines) is None
