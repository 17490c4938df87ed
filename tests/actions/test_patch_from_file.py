"""`patch from-file` on the real engine with the sim image: a corrected marlin_utils.py becomes a
patch, a stack using it is switched in and its container serves the corrected file (read from the
running container), and the drift image is refused with the line that no longer matches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import yaml
from kit.simnode import SimNode, docker
from simkit import image_file

from b70deploy.render.patches import load_patch
from b70deploy.sim.vllm_tree import MARLIN_REL, VARIANTS

pytestmark = pytest.mark.docker

SITE = next(v.site_packages for v in VARIANTS if v.name == "bash-c")
TARGET = f"{SITE}/vllm/{MARLIN_REL}"
ROCM_ONLY = b"if current_platform.is_rocm():"


def _own_patches(node: SimNode) -> Path:
    """Point the node at a patches dir of its own (the shipped one stays untouched)."""
    cfg = yaml.safe_load(node.config.read_text())
    cfg["patches_dir"] = str(node.root / "patches")
    node.config.write_text(yaml.safe_dump(cfg))
    (node.root / "patches").mkdir(exist_ok=True)
    return node.root / "patches"


def _corrected(node: SimNode) -> bytes:
    """The report's fix, as an operator writes it: the XPU carve-out beside ROCm's, and a comment."""
    original = image_file(node.tags["bash-c"], TARGET)
    assert original.count(ROCM_ONLY) == 1
    fixed = original.replace(ROCM_ONLY, b"# XPU has no Marlin MoE kernels either (field report fix 4).\n    "
                                        b"if current_platform.is_rocm() or current_platform.is_xpu():")
    path = node.root / "marlin_utils.py"
    path.write_bytes(fixed)
    return fixed


def test_patch_from_file_serves_the_corrected_file_and_refuses_drift(node: SimNode,
                                                                      sim_images: dict[str, str]) -> None:
    patches = _own_patches(node)
    fixed = _corrected(node)
    made = node.cli("patch", "from-file", str(node.root / "marlin_utils.py"), "--target", TARGET,
                    "--image", node.tags["bash-c"], "--name", "marlin-mine", "--json", check=True)
    out = json.loads(made.stdout)
    assert out["kind"] == "edits" and out["target"] == MARLIN_REL and out["vllm_versions"] == ["0.21.*"]
    spec = load_patch(patches / "marlin-mine.yaml")
    assert spec.edits[0].within == "def check_moe_marlin_supports_layer("
    assert spec.edits[0].find == ROCM_ONLY.decode()

    (node.root / "stacks" / "mine.yaml").write_text(yaml.safe_dump({"extends": "alpha",
                                                                    "patches": ["marlin-mine"]}))
    (node.root / "stacks" / "mine-drift.yaml").write_text(yaml.safe_dump({"extends": "mine",
                                                                          "image": sim_images["bash-c-drift"]}))
    r = node.cli("switch", "mine", "--yes", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    # Ask the node: the running container's file is the corrected one, and it answers.
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                 "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    assert len(ids) == 1
    served = docker("exec", ids[0], "cat", TARGET).stdout.encode()
    assert served == fixed
    logs = docker("logs", ids[0]).stdout + docker("logs", ids[0]).stderr
    assert "Using CompressedTensorsWNA16MoEMethod" in logs and "MarlinMoEMethod" not in logs
    reply = requests.post(f"http://127.0.0.1:{node.prod}/v1/completions", timeout=10,
                          json={"model": "qwen3-30b-a3b-w4a16", "prompt": "The capital of France is",
                                "max_tokens": 4}).json()
    assert "Paris" in reply["choices"][0]["text"]

    drift = node.cli("switch", "mine-drift", "--yes", timeout=180)
    assert drift.returncode == 2, drift.stdout + drift.stderr
    said = drift.stdout + drift.stderr
    assert "patch-does-not-apply" in said and "no longer applies to image" in said
    assert "'if current_platform.is_rocm():'" in said and "if not _platform_has_marlin():" in said
    assert docker("exec", ids[0], "cat", TARGET).stdout.encode() == fixed  # production untouched


@pytest.mark.parametrize(("args", "says"), [
    (("--name", "Bad..Name"), "--name: patch name 'Bad..Name' is not allowed"),
    (("--name", "taken"), "already exists"),
    (("--name", "x", "--target", "/etc/passwd"), "is outside the image's vllm package"),
    (("--name", "x", "--target", "model_executor/nope.py"), "is not in image"),
    (("--name", "x", "--image", "no-such/image:1"), "image no-such/image:1 is not on this node"),
    (("--name", "x", "--same"), "nothing to patch"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(node: SimNode, args: tuple[str, ...], says: str) -> None:
    patches = _own_patches(node)
    (patches / "taken.yaml").write_text("# the operator's own\n")
    _corrected(node)
    if "--same" in args:
        (node.root / "marlin_utils.py").write_bytes(image_file(node.tags["bash-c"], TARGET))
        args = tuple(a for a in args if a != "--same")
    argv = {"--target": TARGET, "--image": node.tags["bash-c"]}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        argv[flag] = value
    r = node.cli("patch", "from-file", str(node.root / "marlin_utils.py"), *[t for kv in argv.items() for t in kv])
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and r.stderr.count("\n") == 1 and "fix:" in r.stderr
    assert sorted(p.name for p in patches.iterdir()) == ["taken.yaml"]
