"""The sim images on the real engine: shipped stacks boot, and every failure shows from outside."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from simkit import (
    SimDeployment,
    container_logs,
    container_state,
    docker,
    http_status,
    image_file,
    wait_exit,
    wait_log,
    wait_status,
)

from b70deploy.config.catalogue import Catalogue
from b70deploy.config.resources import data_dir
from b70deploy.render.vllm_args import container_command
from b70deploy.sim.server import ARCTIC_ERROR, GIB, MARLIN_ERROR, requested_bytes
from b70deploy.sim.vllm_tree import MARLIN_REL

pytestmark = pytest.mark.docker

BASH_C_SITE = "/opt/venv/lib/python3.12/site-packages"
MARLIN_PATH = f"{BASH_C_SITE}/vllm/{MARLIN_REL}"
ROCM_CHECK = "if current_platform.is_rocm():\n        return False"
FAST = {"B70SIM_BOOT_SECONDS": "0.5", "B70SIM_DECODE_TPS": "500"}
Run = Callable[..., str]


def serve_argv(stack_name: str, *, head: bool = True) -> list[str]:
    """The command b70deploy renders for a shipped stack, model path filled in."""
    stack = Catalogue(data_dir("stacks")).load(stack_name)
    cmd = container_command(stack, model=f"/models/{stack.model.path}")
    if head and cmd[:2] != ["vllm", "serve"]:
        cmd = ["vllm", "serve", *cmd]
    return cmd


def carveout(image: str) -> bytes:
    """The image's marlin_utils.py with XPU added to the ROCm check (what the deploy's patch does)."""
    text = image_file(image, MARLIN_PATH).decode()
    assert ROCM_CHECK in text
    return text.replace("if current_platform.is_rocm():",
                        "if current_platform.is_rocm() or current_platform.is_xpu():", 1).encode()


def boot_facts(log: str) -> dict[str, str]:
    """The boot facts the deploy parses, by the loose patterns of vllm-facts.md."""
    pats = {
        "kv_tokens": r"KV cache size: ([\d,]+) tokens",
        "concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
        "backend": r"Using (Flash Attention|Triton) backend",
        "fa_version": r"Using FlashAttention version (\d+)",
        "moe": r"Using (CompressedTensorsWNA16\w*MoEMethod)",
        "fp8": r"Using (fp8) data type to store kv cache",
        "compile": r"torch\.compile (?:took|takes) ([\d.]+) s in total",  # 0.21 writes took (monitor.py)
        "start": r"Starting vLLM (?:API )?server(?: \d+)? on (http://\S+)",
    }
    out = {}
    for key, pat in pats.items():
        m = re.search(r"^(?:\(\w+ pid=\d+\) )?(?:INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] .*?" + pat,
                      log, re.M)
        if m:
            out[key] = m.group(1)
    return out


# ---------------------------------------------------------------- shipped stacks through render + compose


def test_w4a16_stack_boots_and_serves(sim_node: Callable[..., SimDeployment], sim_images: dict[str, str]) -> None:
    dep = sim_node("w4a16-131k", env={"B70SIM_BOOT_SECONDS": "2"}, companions=True,
                   mounts={MARLIN_PATH: carveout(sim_images["bash-c"])})
    seen = wait_status(f"{dep.url}/health", 200, timeout=30)
    assert seen[0] is None and seen[-1] == 200  # refused (or reset by the proxy) before the boot delay

    ids = [m["id"] for m in requests.get(f"{dep.url}/v1/models", timeout=5).json()["data"]]
    assert ids == dep.stack.served_model_names
    for alias in ids:
        r = requests.post(f"{dep.url}/v1/completions", timeout=10,
                          json={"model": alias, "prompt": "The capital of France is", "max_tokens": 4}).json()
        assert "Paris" in r["choices"][0]["text"]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}]
    chat = requests.post(f"{dep.url}/v1/chat/completions", timeout=10, json={
        "model": ids[1], "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools}).json()
    choice = chat["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"

    facts = boot_facts(dep.logs())
    assert facts == {"kv_tokens": "270,592", "concurrency": "2.06", "backend": "Flash Attention", "fa_version": "2",
                     "moe": "CompressedTensorsWNA16MoEMethod", "fp8": "fp8", "compile": "82.14",
                     "start": "http://0.0.0.0:8000"}
    assert "Application startup complete." in dep.logs()
    # The companion stays up and answers HTTP on the project network.
    webui = dep.project.run("exec", "-T", "open-webui", "wget", "-qO-", "http://127.0.0.1:8080/health").stdout
    assert '"status": true' in webui
    reach = dep.project.run("exec", "-T", "open-webui", "wget", "-qO-", "http://vllm:8000/v1/models").stdout
    assert ids[0] in reach


def test_tq256k_boots_on_the_serve_image(sim_node: Callable[..., SimDeployment]) -> None:
    dep = sim_node("tq-256k")
    wait_status(f"{dep.url}/health", 200, timeout=30)
    assert requests.get(f"{dep.url}/version", timeout=5).json() == {"version": "0.19.0"}
    facts = boot_facts(dep.logs())
    assert facts["kv_tokens"] == "453,184" and facts["concurrency"] == "1.73"
    assert "Starting vLLM API server 0 on http://0.0.0.0:8000" in dep.logs()  # the pre-0.20 wording
    metrics = requests.get(f"{dep.url}/metrics", timeout=5).text
    assert "vllm:spec_decode_num_drafts_total" in metrics  # suffix decoding is on


def test_unpatched_w4a16_crashes_on_marlin(sim_node: Callable[..., SimDeployment]) -> None:
    dep = sim_node("w4a16-131k")
    log = wait_log(dep.logs, "gptq_marlin_repack", timeout=30)
    assert log.index("Loading weights took") < log.index(MARLIN_ERROR)
    assert "Using CompressedTensorsWNA16MarlinMoEMethod" in log
    assert http_status(f"{dep.url}/health") is None


# ---------------------------------------------------------------- entrypoint styles


def test_bare_flags_fail_on_bash_c_and_work_on_serve(docker_run: Run, sim_images: dict[str, str],
                                                     free_port: Callable[[], int]) -> None:
    bare = serve_argv("tq-256k", head=False)[:]
    assert bare[0].startswith("/models/")
    bare = ["--model", *bare]
    bad = docker_run(sim_images["bash-c"], *bare, env=FAST)
    assert wait_exit(bad) != 0
    assert "exec: --: invalid option" in container_logs(bad)
    port = free_port()
    good = docker_run(sim_images["serve"], *bare, env=FAST, ports={port: 8000})
    wait_status(f"http://127.0.0.1:{port}/health", 200, timeout=30)
    assert container_state(good)["Running"]


def test_unknown_flag_is_an_argparse_error(docker_run: Run, sim_images: dict[str, str]) -> None:
    name = docker_run(sim_images["bash-c"], "vllm", "serve", "/models/x", "--no-such-flag", env=FAST)
    assert wait_exit(name) == 2
    log = container_logs(name)
    assert "usage: vllm serve" in log and "unrecognized arguments: --no-such-flag" in log


def test_image_groups_and_package_paths(docker_run: Run, sim_images: dict[str, str]) -> None:
    probe = ("import vllm, importlib.util as u; print(vllm.__file__, vllm.__version__, "
             "u.find_spec('arctic_inference') is not None)")
    got = {}
    for variant in ("bash-c", "serve"):
        name = docker_run(sim_images[variant], *(["python3"] if variant == "bash-c" else []), "-c", probe,
                          entrypoint=None if variant == "bash-c" else "python3")
        assert wait_exit(name) == 0
        got[variant] = container_logs(name).split()
    assert got["bash-c"] == [f"{BASH_C_SITE}/vllm/__init__.py", "0.21.1.dev17+g0a4756bb5", "False"]
    assert got["serve"] == ["/usr/local/lib/python3.12/dist-packages/vllm/__init__.py", "0.19.0", "True"]
    group = image_file(sim_images["bash-c"], "/etc/group").decode()
    assert "video:x:44:" in group and "render" not in group


def test_drift_image_rewords_the_marlin_check(sim_images: dict[str, str]) -> None:
    drift = image_file(sim_images["bash-c-drift"], MARLIN_PATH).decode()
    assert "def check_moe_marlin_supports_layer" in drift and ROCM_CHECK not in drift
    assert drift != image_file(sim_images["bash-c"], MARLIN_PATH).decode()


# ---------------------------------------------------------------- failure modes, from outside


def run_stack(docker_run: Run, image: str, stack: str, env: dict[str, str], port: int | None = None,
              volumes: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> str:
    argv = serve_argv(stack, head=not image.endswith(":serve"))
    if image.endswith(":serve") and argv[:2] == ["vllm", "serve"]:
        argv = argv[2:]  # ENTRYPOINT ["vllm","serve"] takes the model and flags only
    return docker_run(image, *argv, *extra, env={**FAST, **env}, ports={port: 8000} if port else None,
                      volumes=volumes)


def test_suffix_without_arctic_crashes(docker_run: Run, sim_images: dict[str, str]) -> None:
    name = run_stack(docker_run, sim_images["bash-c"], "tq-256k", {})
    assert wait_exit(name) == 1
    assert ARCTIC_ERROR in container_logs(name)


@pytest.mark.parametrize(("fail", "needle"), [("arctic", ARCTIC_ERROR), ("marlin", MARLIN_ERROR),
                                              ("kv-too-small", "estimated maximum model length is ")])
def test_forced_crashes(docker_run: Run, sim_images: dict[str, str], fail: str, needle: str) -> None:
    name = run_stack(docker_run, sim_images["serve"], "tq-256k", {"B70SIM_FAIL": fail})
    assert wait_exit(name) == 1
    assert needle in container_logs(name)


def test_kv_budget_below_max_len(docker_run: Run, sim_images: dict[str, str]) -> None:
    # tq-256k: 262,144 max-len on the serve image (GPTQ: no Marlin crash comes first)
    name = run_stack(docker_run, sim_images["serve"], "tq-256k", {"B70SIM_KV_TOKENS": "251200"})
    assert wait_exit(name) == 1
    m = re.search(r"estimated maximum model length is (\d+)", container_logs(name))
    assert m and m.group(1) == "251200"


def test_hang_never_listens(docker_run: Run, sim_images: dict[str, str], free_port: Callable[[], int]) -> None:
    port = free_port()
    name = run_stack(docker_run, sim_images["serve"], "tq-256k", {"B70SIM_FAIL": "hang"}, port)
    wait_log(lambda: container_logs(name), "Starting to load model")
    import time

    time.sleep(1.0)  # twice the boot delay
    assert container_state(name)["Running"]
    assert http_status(f"http://127.0.0.1:{port}/health") is None
    assert "Starting vLLM" not in container_logs(name)


def test_unhealthy_answers_503(docker_run: Run, sim_images: dict[str, str], free_port: Callable[[], int]) -> None:
    port = free_port()
    run_stack(docker_run, sim_images["serve"], "tq-256k", {"B70SIM_FAIL": "unhealthy"}, port)
    wait_status(f"http://127.0.0.1:{port}/health", 503, timeout=30)


def test_engine_dies_after_ready(docker_run: Run, sim_images: dict[str, str], free_port: Callable[[], int]) -> None:
    port = free_port()
    name = run_stack(docker_run, sim_images["serve"], "tq-256k", {"B70SIM_FAIL": "die-after-ready"}, port)
    url = f"http://127.0.0.1:{port}"
    wait_status(f"{url}/health", 200, timeout=30)
    time.sleep(1.0)
    assert http_status(f"{url}/health") == 200  # no timer: healthy until a request reaches the engine
    r = requests.post(f"{url}/v1/completions", timeout=10, json={"prompt": "The capital of France is", "max_tokens": 4})
    assert r.status_code == 500 and r.json() == {"error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError", "param": None, "code": 500}}  # die-after-ready.response.json's shape
    assert wait_exit(name) == 0  # vLLM 0.21's API server shuts down cleanly after the engine died
    logs = container_logs(name)
    assert "EngineCore encountered a fatal error." in logs and "Application shutdown complete." in logs


def test_garbage_output(docker_run: Run, sim_images: dict[str, str], free_port: Callable[[], int]) -> None:
    port = free_port()
    run_stack(docker_run, sim_images["serve"], "tq-256k", {"B70SIM_FAIL": "garbage"}, port)
    url = f"http://127.0.0.1:{port}"
    wait_status(f"{url}/health", 200, timeout=30)
    text = requests.post(f"{url}/v1/completions", timeout=10, json={
        "prompt": "The capital of France is", "max_tokens": 8}).json()["choices"][0]["text"]
    assert "Paris" not in text and "garò" in text
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    chat = requests.post(f"{url}/v1/chat/completions", timeout=10, json={
        "messages": [{"role": "user", "content": "call f"}], "tools": tools}).json()
    assert chat["choices"][0]["finish_reason"] != "tool_calls"


def test_attention_fallback_in_log(docker_run: Run, sim_images: dict[str, str], free_port: Callable[[], int]) -> None:
    port = free_port()
    name = run_stack(docker_run, sim_images["serve"], "tq-256k", {"B70SIM_FAIL": "attn-fallback"}, port)
    wait_status(f"http://127.0.0.1:{port}/health", 200, timeout=30)
    facts = boot_facts(container_logs(name))
    assert facts["backend"] == "Triton" and "fa_version" not in facts


# ---------------------------------------------------------------- sleep mode and the shared GPU memory ledger


def test_sleep_refused_on_xpu_021(docker_run: Run, sim_images: dict[str, str]) -> None:
    name = run_stack(docker_run, sim_images["serve"], "tq-256k", {}, extra=("--enable-sleep-mode",))
    assert wait_exit(name) == 1
    assert "Value error, Sleep mode is not supported on current platform." in container_logs(name)


def test_containers_share_the_gpu_ledger(docker_run: Run, sim_images: dict[str, str], free_port: Callable[[], int],
                                         tmp_path: Path) -> None:
    """One node's sim containers see each other's memory through a bind-mounted folder: a second stack
    fails vLLM's start-up check while the first is awake, boots once it sleeps; a stopped one's line goes."""
    (tmp_path / "gpu").mkdir()
    ledger = tmp_path / "gpu" / "ledger.json"
    env = {"B70SIM_PLATFORM": "cuda", "B70SIM_GPU_LEDGER": "/gpu/ledger.json", "VLLM_SERVER_DEV_MODE": "1"}
    vol = (f"{tmp_path / 'gpu'}:/gpu",)
    util = ("--gpu-memory-utilization", "0.6")
    p1, p2 = free_port(), free_port()
    first = run_stack(docker_run, sim_images["serve"], "tq-256k", env, p1, vol, extra=(*util, "--enable-sleep-mode"))
    wait_status(f"http://127.0.0.1:{p1}/health", 200, timeout=30)
    refused = run_stack(docker_run, sim_images["serve"], "tq-256k", env, volumes=vol, extra=util)
    assert wait_exit(refused) == 1
    assert ("ValueError: Free memory on device cuda:0 (12.8/32.0 GiB) on startup is less than desired GPU memory "
            "utilization (0.6, 19.2 GiB).") in container_logs(refused)
    assert requests.post(f"http://127.0.0.1:{p1}/sleep?level=1", timeout=30).status_code == 200
    # The line is printed before the response goes; Docker's log copier may deliver it a moment later.
    assert re.search(r"It took [0-9.]+ seconds to fall asleep\.", wait_log(lambda: container_logs(first),
                                                                          "seconds to fall asleep."))
    run_stack(docker_run, sim_images["serve"], "tq-256k", env, p2, vol, extra=util)
    wait_status(f"http://127.0.0.1:{p2}/health", 200, timeout=30)
    assert len(json.loads(ledger.read_text())["holders"]) == 2
    docker("stop", "-t", "10", first)
    held = json.loads(ledger.read_text())["holders"]
    assert list(held.values()) == [requested_bytes(32 * GIB, 0.6)]  # the second's; the first's went on SIGTERM
