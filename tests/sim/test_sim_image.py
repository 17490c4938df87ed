"""The sim image recipe: pure parts without Docker, the skip-when-unchanged rule on the engine."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from simkit import http_status, run_cli

from b70deploy.errors import UserError
from b70deploy.sim import image
from b70deploy.sim.vllm_tree import MARLIN_REL, VARIANTS, vllm_files

REPO = Path(__file__).resolve().parents[2]
LDD = """\tlinux-vdso.so.1 (0x00007ffd)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f6b)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f6a)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f6b7d1cc000)
"""


def test_parse_ldd() -> None:
    assert image.parse_ldd(LDD) == ["/lib/x86_64-linux-gnu/libm.so.6", "/lib/x86_64-linux-gnu/libc.so.6",
                                    "/lib64/ld-linux-x86-64.so.2"]
    assert image.parse_ldd("\tstatically linked\n") == []


def test_entrypoint_shapes() -> None:
    by_name = {v.name: v for v in VARIANTS}
    bash_c = image.image_config(by_name["bash-c"], "h")
    assert 'ENTRYPOINT ["/bin/bash", "-c", "source /opt/intel/oneapi/setvars.sh --force && exec \\"$@\\"", "--"]' \
        in bash_c
    assert 'ENTRYPOINT ["vllm", "serve"]' in image.image_config(by_name["serve"], "h")
    assert "LABEL b70sim.inputs=h" in bash_c
    names = ("bash-c", "serve", "bash-c-drift", "standby")
    assert set(image.TAGS.values()) == {f"{image.REPO}:{n}" for n in names}


def test_vllm_tree_marlin_check_and_drift() -> None:
    by_name = {v.name: vllm_files(v) for v in VARIANTS}
    marlin = by_name["bash-c"][f"vllm/{MARLIN_REL}"]
    body = marlin.split("def check_moe_marlin_supports_layer(layer, group_size):\n", 1)[1]
    assert body.startswith("    if current_platform.is_rocm():\n        return False\n")
    assert "if current_platform.is_rocm():\n        return False" not in by_name["bash-c-drift"][f"vllm/{MARLIN_REL}"]
    arctic = "arctic_inference/__init__.py"
    assert arctic in by_name["serve"] and arctic not in by_name["bash-c"]
    assert '__version__ = "0.19.0"' in by_name["serve"]["vllm/__init__.py"]
    # the release that sleeps on XPU carries the carve-out upstream (0.23 on)
    assert '__version__ = "0.32.0"' in by_name["standby"]["vllm/__init__.py"]
    assert "if current_platform.is_rocm() or current_platform.is_xpu():\n        return False" in \
        by_name["standby"][f"vllm/{MARLIN_REL}"]


def test_inputs_hash_follows_the_server_source() -> None:
    py = image.find_host_python()
    base = image.base_entries(py)
    variant = VARIANTS[0]
    entries = image.all_entries(variant, base, py)
    digest = image.inputs_hash(variant, entries)
    assert digest == image.inputs_hash(variant, image.all_entries(variant, base, py))
    edited = [dataclasses.replace(e, data=e.data + b"# changed\n") if e.name == image.SERVER_PATH else e
              for e in entries]
    assert image.inputs_hash(variant, edited) != digest
    assert image.inputs_hash(VARIANTS[1], image.all_entries(VARIANTS[1], base, py)) != digest


def test_a_repository_name_docker_refuses_is_one_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upper-case B70SIM_REPO (a branch name) made 186 tests fail on `docker import`'s
    "repository name must be lowercase"; now the build says so once, before any Docker call."""
    monkeypatch.setattr(image, "REPO", "b70sim-runA/vllm")
    monkeypatch.setattr(image, "find_host_python", lambda: pytest.fail("the check comes first"))
    with pytest.raises(UserError) as got:
        image.build()
    assert "B70SIM_REPO='b70sim-runA/vllm' is not a Docker repository name" in got.value.what
    assert got.value.fix == "export B70SIM_REPO=b70sim-runa/vllm"
    monkeypatch.setattr(image, "REPO", "b70sim:x/vllm")
    with pytest.raises(UserError, match="B70SIM_REPO") as got:
        image.build()
    assert got.value.fix == "export B70SIM_REPO=b70sim-mybranch/vllm"
    assert all(image.REPO_NAME.fullmatch(r) for r in ("b70sim/vllm", "b70sim-run_a/vllm", "a.b/c__d/e--f"))


def test_server_runs_on_the_host(free_port: Callable[[], int]) -> None:
    """`python -m b70deploy.sim.server serve ...` on loopback, as the bench helper runs it."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "B70SIM_BOOT_SECONDS": "0.3"}
    proc = subprocess.Popen([sys.executable, "-m", "b70deploy.sim.server", "serve", "/models/m",
                             "--max-model-len", "8192", "--host", "127.0.0.1", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 15
        while http_status(f"http://127.0.0.1:{port}/health") != 200:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "Application startup complete." in out


@pytest.mark.docker
def test_build_is_skipped_when_unchanged(sim_images: dict[str, str]) -> None:
    again = image.build()
    assert [b.status for b in again] == ["up-to-date"] * len(VARIANTS)
    assert all(b.size_bytes < 60_000_000 for b in again)
    out = run_cli(None, "sim", "build", "--json", check=True)
    assert {r["tag"]: r["status"] for r in json.loads(out.stdout)} == dict.fromkeys(sim_images.values(), "up-to-date")
