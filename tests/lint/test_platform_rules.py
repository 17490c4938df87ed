"""Lint per platform (issue 28): each rule declares its platforms, a stack may ignore a rule with
a reason (printed every time), and tensor x pipeline parallel size must match the GPUs selected."""

from __future__ import annotations

from pathlib import Path

from kit.lintnode import write_node
from simkit import run_cli

from b70deploy.config.node import load_node
from b70deploy.lint import lint_stack
from b70deploy.lint.gather import context, lint_stacks
from b70deploy.lint.rules import ALL_PLATFORMS, PLATFORMS, RULES


def _node(tmp_path: Path, models_dir: Path, **cfg: object):  # type: ignore[no-untyped-def]
    return load_node(str(write_node(tmp_path, models_dir, **cfg)))


def _marlin_needing(node):  # type: ignore[no-untyped-def]
    """W4A16 MoE weights without the XPU carve-out patch: the report's crash on XPU."""
    return node.catalogue().load("w4a16").model_copy(update={"patches": []})


def test_nvidia_stack_with_marlin_needing_weights_lints_clean(tmp_path: Path, models_dir: Path) -> None:
    node = _node(tmp_path, models_dir, platform="cuda")
    findings = lint_stack(context(node, _marlin_needing(node), docker=False))
    assert findings == [], [f.one_line() for f in findings]


def test_the_same_stack_on_xpu_does_not(tmp_path: Path, models_dir: Path) -> None:
    node = _node(tmp_path, models_dir, platform="xpu")
    ids = [f.id for f in lint_stack(context(node, _marlin_needing(node), docker=False)) if f.severity == "error"]
    assert ids == ["marlin-carveout-missing"]


def test_every_rule_declares_its_platforms_and_xpu_only_ones_say_so() -> None:
    ids = {rid for rids, _ in RULES for rid in rids}
    assert set(PLATFORMS) == ids and all(set(PLATFORMS[i]) <= set(ALL_PLATFORMS) for i in ids)
    for xpu_only in ("marlin-carveout-missing", "gptq-bfloat16"):
        assert PLATFORMS[xpu_only] == ("xpu",)
    assert PLATFORMS["cpu-kvcache-space"] == ("cpu",)


def test_ignore_silences_a_rule_and_says_why_every_time(tmp_path: Path, models_dir: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "nomarlin.yaml").write_text(
        "extends: w4a16\npatches: []\n"
        "lint: {ignore: {marlin-carveout-missing: \"our image carries the fix\"}}\n")
    (stacks / "w4a16.yaml").write_text((Path(__file__).parents[2] / "stacks/w4a16.yaml").read_text())
    (stacks / "w4a16-131k.yaml").write_text((Path(__file__).parents[2] / "stacks/w4a16-131k.yaml").read_text())
    config = write_node(tmp_path, models_dir, stacks_dir=str(stacks))
    node = load_node(str(config))
    findings, skipped = lint_stacks(node, ["nomarlin"], docker=False)["nomarlin"]
    assert findings == []
    assert "lint.ignore marlin-carveout-missing: our image carries the fix" in skipped
    for _ in range(2):  # shown on every run, not once
        r = run_cli(config, "lint", "--no-docker", "nomarlin")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "lint.ignore marlin-carveout-missing: our image carries the fix" in r.stderr


def test_ignore_without_a_reason_is_refused(tmp_path: Path, models_dir: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "bad.yaml").write_text((Path(__file__).parents[2] / "stacks/w4a16-131k.yaml").read_text()
                                     .replace("name: w4a16-131k", "name: bad")
                                     + "lint: {ignore: {marlin-carveout-missing: \"  \"}}\n")
    config = write_node(tmp_path, models_dir, stacks_dir=str(stacks))
    r = run_cli(config, "lint", "--no-docker", "bad")
    assert r.returncode == 2 and "lint.ignore.marlin-carveout-missing gives no reason" in r.stdout + r.stderr


def test_parallel_size_matches_the_gpu_selection(tmp_path: Path, models_dir: Path) -> None:
    node = _node(tmp_path, models_dir, platform="cuda", gpus=["0", "1"])
    stack = _marlin_needing(node)
    assert [f.id for f in lint_stack(context(node, stack, docker=False))] == ["parallel-gpu-count"]
    tp2 = stack.model_copy(update={"extra_args": ["--tensor-parallel-size", "2"]})
    assert lint_stack(context(node, tp2, docker=False)) == []
    pp = stack.model_copy(update={"extra_args": ["-tp", "2", "--pipeline-parallel-size=2"], "gpus": 4})
    assert lint_stack(context(node, pp, docker=False)) == []
    everything = stack.model_copy(update={"gpus": "all", "extra_args": ["-tp", "8"]})
    assert lint_stack(context(node, everything, docker=False)) == []  # all: the node's count is not known here


def test_a_platform_or_gpus_value_the_schema_lacks_is_one_line(tmp_path: Path, models_dir: Path) -> None:
    for cfg, says in (({"platform": "tpu"}, "platform"), ({"gpus": 0}, "gpus 0 is not a GPU count"),
                      ({"gpus": ["0", "0"]}, "gpus lists no id, or one twice")):
        config = write_node(tmp_path, models_dir, **cfg)
        r = run_cli(config, "lint", "--no-docker", "w4a16")
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len([ln for ln in r.stderr.splitlines() if ln.startswith("error:")]) == 1, r.stderr
