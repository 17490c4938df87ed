"""docker/sleepmode.py's pure parts: the wake steps of each level, and the level /metrics names."""

from __future__ import annotations

from pathlib import Path

from b70deploy.docker import sleepmode

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_level_1_wakes_with_one_post_and_level_2_as_vllm_documents() -> None:
    assert sleepmode.wake_steps(1) == [("/wake_up", None)]
    assert sleepmode.wake_steps(2) == [("/wake_up?tags=weights", None),
                                       ("/collective_rpc", {"method": "reload_weights"}),
                                       ("/wake_up?tags=kv_cache", None), ("/reset_prefix_cache", None)]


def test_the_level_is_read_from_engine_sleep_state_as_vllm_021_prints_it() -> None:
    awake = (FIXTURES / "vllm-0.21.0-cpu" / "metrics.txt").read_text()
    assert sleepmode.level_in(awake) == 0
    asleep = awake.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0').replace(
        'sleep_state="discard_all"} 0.0', 'sleep_state="discard_all"} 1.0')
    assert sleepmode.level_in(asleep) == 2
    assert sleepmode.level_in("vllm:num_requests_waiting{engine=\"0\"} 0.0\n") is None
