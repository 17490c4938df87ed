"""The completion check reads its answer streamed, up to the token that decides (issue 35): the verdict is
the whole answer's, and a held client waits for no token after it. Read from a real vLLM stream (the
0.21.0 CPU build's, tests/fixtures/vllm-0.21.0-cpu/completion-stream.sse) and against the sim on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.simthread import Serve, loopback_sims

from b70deploy.config.schema import Stack
from b70deploy.docker.smoke import one_completion, streamed_until

STREAM = Path(__file__).parents[1] / "fixtures" / "vllm-0.21.0-cpu" / "completion-stream.sse"


@pytest.fixture
def serve() -> Iterator[Serve]:
    with loopback_sims("50") as start:
        yield start


def stack(max_tokens: int) -> Stack:
    return Stack.model_validate({
        "name": "t", "image": "intel/vllm:latest", "model": {"path": "Qwen/Qwen3-30B-A3B"},
        "served_model_names": ["m"], "max_model_len": 8192,
        "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris", "max_tokens": max_tokens}}})


def test_a_real_stream_is_read_up_to_the_chunk_where_the_expected_text_shows() -> None:
    lines = STREAM.read_bytes().splitlines()
    assert streamed_until(lines, "ROAD") == "htlaehroad"  # the second chunk decides, case aside
    assert streamed_until(lines, "Paris") == "htlaehroadroadroad"  # never shows: read to [DONE]


def test_an_error_inside_the_stream_fails_the_check_with_the_status_it_means() -> None:
    # vLLM 0.21.0's own error chunk when its engine died after /health (the real lane's log)
    died = (b'data: {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", '
            b'"param": null, "code": 500}}')
    with pytest.raises(RuntimeError, match=r"^HTTP 500 in the stream: EngineCore encountered an issue\.$"):
        streamed_until([died, b"data: [DONE]"], "Paris")
    with pytest.raises(RuntimeError, match=r"^error in the stream: gone$"):
        streamed_until([b'data: {"error": "gone"}', b"data: [DONE]"], "Paris")


def test_the_check_passes_on_the_first_tokens_and_still_fails_garbage(serve: Serve) -> None:
    passed, failed = one_completion(serve(), stack(max_tokens=16), timeout=10)
    # the sim's answer goes on for 16 tokens (" Paris. It is also the largest city ..."): read up to Paris
    assert failed == [] and passed == ["completion 'The capital of France is' -> 'Paris'"], (passed, failed)
    passed, failed = one_completion(serve(B70SIM_FAIL="garbage"), stack(max_tokens=16), timeout=10)
    assert passed == [] and "expected 'Paris'" in failed[0], failed
