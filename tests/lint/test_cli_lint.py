"""The lint, diagnose and draft fix commands end to end (subprocess, no Docker needed)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from simkit import run_cli

FIX = Path(__file__).parents[1] / "vllmlog" / "fixtures"


def _cli(*args: str) -> tuple[int, str, str]:
    res = run_cli(None, *args, timeout=60)
    return res.returncode, res.stdout, res.stderr


def test_diagnose_log_kv_too_small() -> None:
    rc, out, _ = _cli("diagnose", "--log", str(FIX / "kv_too_small.log"))
    assert rc == 1
    assert "[kv-too-small]" in out and "max_model_len: 250880" in out


def test_diagnose_log_json_healthy() -> None:
    rc, out, _ = _cli("diagnose", "--log", str(FIX / "boot_ok_131k.log"), "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["diagnosis"] is None and data["boot_facts"]["kv_cache_tokens"] == 270_592


def test_diagnose_needs_one_source() -> None:
    rc, _, err = _cli("diagnose")
    assert rc == 2 and "exactly one of REV" in err
    rc, _, err = _cli("diagnose", "rev-7")
    assert rc == 2 and "'rev-7' is not a revision number" in err


def test_lint_errors_exit_2(node_path: Path, tmp_path: Path) -> None:
    cfg = yaml.safe_load(node_path.read_text())
    cfg["stack_overlay"] = {"prefix_caching": True}  # breaks the hybrids only
    node_path.write_text(yaml.safe_dump(cfg))
    rc, out, _ = _cli("--config", str(node_path), "lint", "qwen35", "w4a16", "--no-docker")
    assert rc == 2
    assert "qwen35: error [hybrid-prefix-caching]" in out and "fix: set prefix_caching: false" in out
    assert "1 error(s)" in out and "w4a16:" not in out


def test_lint_all_no_docker_clean(node_path: Path) -> None:
    rc, out, _ = _cli("--config", str(node_path), "lint", "--all", "--no-docker")
    assert rc == 0 and "7 stack(s), 0 error(s), 0 warning(s): ok" in out


def test_draft_fix_cli(models_dir: Path) -> None:
    src = models_dir / "Qwen" / "Qwen3-30B-A3B-EAGLE3"
    before = (src / "config.json").read_bytes()
    rc, out, _ = _cli("draft", "fix", str(src), "--max-position-embeddings", "262144")
    assert rc == 0 and "written" in out
    assert (src / "config.json").read_bytes() == before
    copy = models_dir / "Qwen" / "Qwen3-30B-A3B-EAGLE3.b70-mpe262144"
    assert json.loads((copy / "config.json").read_text())["max_position_embeddings"] == 262144
    rc, out, _ = _cli("draft", "fix", str(src), "--max-position-embeddings", "262144")
    assert rc == 0 and "already up to date" in out
