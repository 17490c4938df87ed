"""A vLLM started with --api-key (or VLLM_API_KEY) answers 401 to a /v1 request without
`Authorization: Bearer KEY` (vllm/entrypoints/openai/server_utils.py:32-77 at 387dcddc; the flag
before the variable: build_app in vllm/entrypoints/openai/api_server.py at 0001948b). The sim does
the same, and every /v1 request of the tool sends the key: smoke, the woken standby's completion,
bench. The key is read from the running container as vLLM reads it, and never printed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from kit.simthread import Serve, loopback_sims

from b70deploy.bench.client import Endpoint, get_json, post_json
from b70deploy.config.schema import Stack
from b70deploy.docker.smoke import one_completion, run_smoke
from b70deploy.render.vllm_args import api_keys

KEY = "sk-operator-canary-7f3a"


@pytest.fixture
def serve() -> Iterator[Serve]:
    with loopback_sims("20000") as start:
        yield start


def stack() -> Stack:
    return Stack.model_validate({
        "name": "t", "image": "vllm/vllm-openai:latest", "model": {"path": "Qwen/Qwen3-30B-A3B"},
        "served_model_names": ["m"], "max_model_len": 8192,
        "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris", "max_tokens": 4},
                  "tool_call": True, "aliases": True, "coherence": True}})


@pytest.mark.parametrize("how", ["flag", "env", "two keys"])
def test_the_sim_asks_every_v1_request_for_the_key_as_vllm_does(serve: Serve, how: str) -> None:
    url = {"flag": lambda: serve("--api-key", KEY, VLLM_API_KEY="not-this-one"),
           "env": lambda: serve(VLLM_API_KEY=KEY),
           "two keys": lambda: serve("--api-key", "other", KEY)}[how]()
    for path in ("/v1/models",):
        r = requests.get(url + path, timeout=5)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
        assert requests.get(url + path, headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
        assert requests.get(url + path, headers={"Authorization": f"bearer {KEY}"}, timeout=5).status_code == 200
    body = {"model": "m", "prompt": "The capital of France is", "max_tokens": 4}
    with requests.Session() as s:  # a refused POST leaves the connection usable (its body is read)
        assert s.post(url + "/v1/completions", json=body, timeout=5).status_code == 401
        assert s.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=5).status_code == 200
    # only /v1 is checked: the tool's /health and the door's /metrics need no key
    assert requests.get(url + "/health", timeout=5).status_code == 200
    assert requests.get(url + "/metrics", timeout=5).status_code == 200


def test_an_empty_key_checks_nothing(serve: Serve) -> None:
    url = serve(VLLM_API_KEY="")
    assert requests.get(url + "/v1/models", timeout=5).status_code == 200


def test_smoke_and_the_woken_standbys_completion_send_the_key_and_never_print_it(serve: Serve) -> None:
    url = serve("--api-key", KEY)
    passed, failed = run_smoke(url, stack(), timeout=10)
    assert len(failed) == 4 and all("401" in f for f in failed), failed   # without the key: refused
    passed, failed = run_smoke(url, stack(), timeout=10, key=KEY)
    assert failed == [] and len(passed) == 4, (passed, failed)
    passed, failed = one_completion(url, stack(), timeout=10, key=KEY)
    assert failed == [] and passed
    assert KEY not in repr(run_smoke(url, stack(), timeout=10, key="wrong"))


def test_bench_sends_the_key_and_keeps_it_out_of_its_repr(serve: Serve) -> None:
    url = serve("--api-key", KEY)
    assert get_json(Endpoint.parse(url), "/v1/models") is None
    ep = Endpoint.parse(url, KEY)
    assert get_json(ep, "/v1/models")["data"][0]["id"] == "m"
    status, doc, _ = post_json(ep, "/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 2})
    assert status == 200 and doc is not None
    assert KEY not in repr(ep) and ep == Endpoint.parse(url)


@pytest.mark.parametrize(("argv", "env", "want"), [
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--api-key", "K"], [], ["K"]),
    (["vllm", "serve", "m", "--api-key", "A", "B", "--port", "8000"], ["VLLM_API_KEY=E"], ["A", "B"]),
    (["vllm", "serve", "m", "--api_key=A"], [], ["A"]),                     # FlexibleArgumentParser's dashes
    (["vllm", "serve", "m", "--api-key", "A", "--api-key", "B"], [], ["B"]),  # argparse: the last wins
    (["vllm", "serve", "m"], ["VLLM_API_KEY=E", "PATH=/bin"], ["E"]),       # the variable when no flag
    (["vllm", "serve", "m"], ["VLLM_API_KEY="], []),                        # empty: no check
    (["bash", "-c", "ln -s /a /b && exec vllm serve m --api-key $KEY --port 80"], ["KEY=S"], ["S"]),
])
def test_the_key_is_read_from_the_process_as_vllm_reads_it(argv: list[str], env: list[str], want: list[str]) -> None:
    assert api_keys(argv, env) == want
