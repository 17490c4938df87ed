"""Lint, patches and diagnosis against the real engine and the sim images."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kit.lintnode import SIM_BASH_C, SIM_DRIFT, write_node
from simkit import LABEL, SESSION, run_cli, unique

from b70deploy.config.node import load_node
from b70deploy.docker.compose import Compose
from b70deploy.docker.proc import run
from b70deploy.lint import lint_stack
from b70deploy.lint.gather import context
from b70deploy.render.patches import deploy_files
from b70deploy.render.vllm_args import container_command
from b70deploy.sim.image import TAGS as SIM_TAGS
from b70deploy.state.fsio import write_tree
from b70deploy.vllmlog.bootlog import check_expectations, parse_boot_facts
from b70deploy.vllmlog.diagnosis import LOG_STALL, StallWatch, diagnose

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("sim_images")]
ROOT = Path(__file__).resolve().parents[2]
FAST = {"B70SIM_BOOT_SECONDS": "0.5"}
SESSION_LABELS = {LABEL: SESSION}  # with unique() names: the end-of-suite leak check sees these containers


@pytest.fixture
def docker_client(docker_engine: None) -> Any:
    import docker

    return docker.from_env()


def test_lint_all_on_the_shipped_catalogue(node_path: Path) -> None:
    res = run_cli(None, "--config", str(node_path), "lint", "--all", "--json", timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["errors"] == 0
    assert set(out["stacks"]) == {"eagle3", "ngram", "qwen35", "qwen36", "tq-256k", "w4a16", "w4a16-131k"}
    assert all(not s["skipped"] for s in out["stacks"].values())


def test_drift_is_a_preflight_error(tmp_path: Path, models_dir: Path) -> None:
    node = load_node(str(write_node(tmp_path, models_dir, image_map={"intel/vllm:latest": SIM_DRIFT})))
    ctx = context(node, node.catalogue().load("w4a16"))
    assert ctx.image is not None
    [f] = [f for f in lint_stack(ctx) if f.severity == "error"]
    assert f.id == "patch-does-not-apply"
    assert "patch marlin-xpu-carveout" in f.message
    assert ctx.image.id.removeprefix("sha256:")[:12] in f.message
    assert "if current_platform.is_rocm():" in f.message and "_platform_has_marlin" in f.message


@pytest.fixture
def deployed(tmp_path: Path, models_dir: Path) -> Iterator[tuple[Any, Compose, int]]:
    """w4a16-131k rendered with its patch, written to a deploy dir, and up through Compose."""
    node = load_node(str(write_node(tmp_path, models_dir, stack_overlay={"env": FAST})))
    ctx = context(node, node.catalogue().load("w4a16-131k"))
    assert lint_stack(ctx) == []
    files = {**ctx.rendered.files, **deploy_files(ctx.patched)}
    write_tree(node.deploy_dir, files, {n: ctx.rendered.mode(n) for n in files})
    compose = Compose(node.deploy_dir, node.project)
    try:
        run(compose.up(["vllm"]), timeout=120)
        yield ctx, compose, node.config.ports.prod
    finally:
        run(compose.down(), timeout=120, check=False)


def _wait_healthy(port: int, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError("never healthy")


def test_patch_applied_from_the_image_and_mounted(deployed: tuple[Any, Compose, int]) -> None:
    ctx, compose, port = deployed
    [pf] = ctx.patched
    assert pf.target == "/opt/venv/lib/python3.12/site-packages/vllm/model_executor/layers/quantization/utils/" \
                        "marlin_utils.py"
    assert pf.original_sha256 != pf.sha256 and b"is_xpu()" in pf.data
    _wait_healthy(port)
    seen = run([*compose.base(), "exec", "-T", "vllm", "cat", pf.target]).stdout.encode()
    assert seen == pf.data
    lines = run(compose.logs("vllm")).stdout.splitlines()
    facts = parse_boot_facts(lines)
    assert facts.moe_method == "CompressedTensorsWNA16MoEMethod"
    assert check_expectations(facts, ctx.stack.expect) == []
    assert diagnose(lines) is None


# One completion from inside the container (the engine of a die-after-ready sim dies on its first request).
POKE = ("import urllib.request as u\n"
        "try: u.urlopen(u.Request('http://127.0.0.1:8000/v1/completions', data=b'{\"prompt\": \"hi\"}',"
        " headers={'Content-Type': 'application/json'}), timeout=10)\n"
        "except Exception as e: print(e)\n")


def _run_sim(client: Any, image: str, command: list[str], env: dict[str, str], *, wait: float = 30,
             poke: bool = False, **kw: Any) -> list[str]:
    c = client.containers.create(image, command=command, environment={**FAST, **env}, detach=True,
                                 name=unique("lint-"), labels=SESSION_LABELS, **kw)
    try:
        c.start()
        if poke:
            deadline = time.monotonic() + wait
            while b"Application startup complete." not in c.logs() and time.monotonic() < deadline:
                time.sleep(0.2)
            c.exec_run(["python3", "-c", POKE])
        status = c.wait(timeout=wait)["StatusCode"]
        if poke:
            assert status == 0  # vLLM 0.21 exits 0 after its engine died: only the log says it failed
        return [str(ln) for ln in c.logs(stdout=True, stderr=True).decode().splitlines()]
    finally:
        c.remove(force=True)


MODEL = "/models/Qwen/Qwen3-30B-A3B-W4A16"


@pytest.mark.parametrize(("sig", "image", "command", "env"), [
    ("marlin-on-xpu", SIM_BASH_C, ["vllm", "serve", MODEL, "--kv-cache-dtype", "fp8"], {}),
    ("arctic-inference-missing", SIM_BASH_C, ["vllm", "serve", MODEL, "--speculative-config",
                                              '{"method":"suffix"}'], {}),
    ("kv-too-small", SIM_BASH_C, ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-GPTQ-Int4", "--max-model-len",
                                  "262144", "--kv-cache-dtype", "fp8"], {"B70SIM_FAIL": "kv-too-small"}),
    ("bare-flags-bash-c", SIM_BASH_C, ["--model", MODEL, "--max-model-len", "4096"], {}),
    ("cpu-attention-unsupported", SIM_BASH_C, ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-GPTQ-Int4",
                                               "--max-model-len", "4096"], {"B70SIM_FAIL": "die-after-ready"}),
])
def test_signature_from_a_sim_container(docker_client: Any, sig: str, image: str, command: list[str],
                                        env: dict[str, str]) -> None:
    die = env.get("B70SIM_FAIL") == "die-after-ready"
    lines = _run_sim(docker_client, image, command, env, poke=die)
    d = diagnose(lines)
    assert d is not None and d.id == sig, lines[-5:]
    if die:
        # The real sequence: the worker's cause, then the engine's and the API server's generic lines.
        assert d.data["root_cause"].startswith("Unsupported CPU attention configuration")
        api = diagnose([ln for ln in lines if ln.startswith("(APIServer ")])
        assert api is not None and api.id == "engine-dead"
    if sig == "kv-too-small":
        # The switch turns this into its message; the suggestion is the estimate rounded to 1024.
        assert d.data["suggested_max_model_len"] == d.data["estimated_max_model_len"] // 1024 * 1024
        assert f"max_model_len: {d.data['suggested_max_model_len']}" in d.fix


def test_rendered_bare_flags_fail_in_the_image(docker_client: Any, node: Any) -> None:
    stack = node.catalogue().load("w4a16-131k").model_copy(update={"entrypoint_style": "vllm-serve"})
    lines = _run_sim(docker_client, SIM_BASH_C, container_command(stack, model=MODEL), {})
    d = diagnose(lines)
    assert d is not None and d.id == "bare-flags-bash-c"


def test_group_name_signature_from_the_daemon(docker_client: Any) -> None:
    import docker

    c = docker_client.containers.create(SIM_BASH_C, command=["true"], group_add=["render"],
                                        name=unique("lint-"), labels=SESSION_LABELS)
    try:
        with pytest.raises(docker.errors.APIError) as e:
            c.start()
    finally:
        c.remove(force=True)
    d = diagnose([str(e.value)])
    assert d is not None and d.id == "group-name-missing" and d.data["group"] == "render"


def test_hang_is_a_log_stall(docker_client: Any) -> None:
    c = docker_client.containers.create(SIM_BASH_C, command=["vllm", "serve", MODEL],
                                        environment={**FAST, "B70SIM_FAIL": "hang"}, detach=True,
                                        name=unique("lint-"), labels=SESSION_LABELS)
    try:
        c.start()
        watch = StallWatch(60, quiet_seconds=1.0, start=time.monotonic())
        deadline = time.monotonic() + 15
        seen = 0
        found = None
        while found is None and time.monotonic() < deadline:
            lines = c.logs().decode().splitlines()
            watch.feed_all(lines[seen:], time.monotonic()) if len(lines) > seen else None
            seen = len(lines)
            found = watch.check(time.monotonic()) if seen else None
            time.sleep(0.2)
    finally:
        c.remove(force=True)
    assert found is not None and found.id == LOG_STALL and "load model" in found.line


def test_image_facts_cached_per_image_id(tmp_path: Path, docker_client: Any) -> None:
    from b70deploy.docker.image_inspect import ImageInspector

    with ImageInspector(tmp_path) as insp:
        facts = insp.facts(SIM_BASH_C)
        assert facts.entrypoint_style == "bash-c" and "render" not in facts.groups and facts.groups["video"] == 44
        assert facts.vllm_version == "0.21.1.dev17+g0a4756bb5" and not facts.has_package("arctic-inference")
    cache = tmp_path / "image-cache" / f"{facts.id.removeprefix('sha256:')}.json"
    assert json.loads(cache.read_text())["facts"]["vllm_package_dir"] == facts.vllm_package_dir

    class NoContainers:  # a second run must not start any container
        images = docker_client.images

        @property
        def containers(self) -> Any:
            raise AssertionError("cache miss")

    again = ImageInspector(tmp_path, client=NoContainers()).facts(SIM_BASH_C)
    assert again == facts


def test_diagnose_container_cli(docker_client: Any) -> None:
    name = unique("lint-")
    c = docker_client.containers.create(SIM_BASH_C, command=["vllm", "serve", MODEL, "--kv-cache-dtype", "fp8"],
                                        environment=FAST, name=name, labels=SESSION_LABELS)
    try:
        c.start()
        c.wait(timeout=30)
        res = run_cli(None, "diagnose", "--container", name)
    finally:
        c.remove(force=True)
    assert res.returncode == 1 and "[marlin-on-xpu]" in res.stdout and "marlin-xpu-carveout" in res.stdout


@pytest.fixture
def vllm_032_image(sim_images: None) -> Iterator[str]:
    """An image past the carve-out's range: the sim's standby variant, whose stand-in vLLM says 0.32.0
    (b70deploy/sim/vllm_tree.py; built once per session, not per test), under a tag of this test's."""
    tag = f"{unique('v032')}/vllm:0.32.0"
    run(["docker", "tag", SIM_TAGS["standby"], tag], timeout=120)
    try:
        yield tag
    finally:
        run(["docker", "rmi", tag], timeout=120, check=False)


def test_a_catalogue_stack_on_vllm_032_renders_without_the_carveout_and_cites_upstream(
        tmp_path: Path, models_dir: Path, vllm_032_image: str) -> None:
    """patches/marlin-xpu-carveout.yaml: needed on 0.20-0.22, upstream from 0.23 (XPU takes the
    WNA16 MoE oracle's XPU backend, fused_moe/oracle/int_wna16.py:130-131 at 0.32.0)."""
    path = write_node(tmp_path, models_dir, image_map={"intel/vllm:latest": vllm_032_image})
    r = run_cli(None, "--config", str(path), "render", "w4a16", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    said = r.stderr  # the render's notes; the files go to stdout
    assert "patch marlin-xpu-carveout not applied: vLLM 0.32.0 carries the fix upstream (since 0.23.0" in said, said
    assert "int_wna16.py:76-77" in said and ":130-131 at 0.32.0" in said
    assert "marlin_utils.py" not in r.stdout  # no patched file, no mount over the image's
    lint = run_cli(None, "--config", str(path), "lint", "w4a16", "--json", timeout=240)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    ids = [f["id"] for s in json.loads(lint.stdout)["stacks"].values() for f in s["findings"]]
    assert "marlin-carveout-missing" not in ids and "patch-does-not-apply" not in ids, ids


def test_a_patch_past_its_versions_without_upstream_is_stale_naming_the_version(
        tmp_path: Path, models_dir: Path, vllm_032_image: str) -> None:
    """gptq-xpu is for 0.19 and names no upstream fix: on 0.32 it is stale, an error naming 0.32.0."""
    path = write_node(tmp_path, models_dir, image_map={"vllm-xpu:0.19.0-tr5": vllm_032_image})
    lint = run_cli(None, "--config", str(path), "lint", "tq-256k", "--json", timeout=240)
    found = [f for s in json.loads(lint.stdout)["stacks"].values() for f in s["findings"]
             if f["id"] == "patch-does-not-apply"]
    assert lint.returncode != 0 and len(found) == 1, lint.stdout
    assert "patch gptq-xpu: stale for vLLM 0.32.0" in found[0]["message"], found
