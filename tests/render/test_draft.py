"""The EAGLE draft fix: a copy with one field raised; the original stays byte-identical."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from b70deploy.errors import UserError
from b70deploy.render.draft import ensure_draft_copy, length_limit, make_draft_copy

CONFIG = '{\n  "architectures": ["LlamaForCausalLMEagle3"],\n  "hidden_size": 2048,\n' \
         '  "max_position_embeddings": 2048,\n  "num_hidden_layers": 1\n}\n'


def _draft(root: Path) -> Path:
    d = root / "Qwen" / "Qwen3-30B-A3B-EAGLE3"
    d.mkdir(parents=True)
    (d / "config.json").write_text(CONFIG)
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    (d / "sub").mkdir()
    (d / "sub" / "tokenizer.json").write_text("{}")
    return d


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_copy_differs_in_one_field_only(tmp_path: Path) -> None:
    src = _draft(tmp_path)
    before = _snapshot(src)
    rel = ensure_draft_copy(tmp_path, "Qwen/Qwen3-30B-A3B-EAGLE3", 262144)
    assert rel == "Qwen/Qwen3-30B-A3B-EAGLE3.b70-mpe262144"
    copy = tmp_path / rel
    assert _snapshot(src) == before  # original byte-identical
    a, b = json.loads(CONFIG), json.loads((copy / "config.json").read_text())
    assert {k for k in a | b if a.get(k) != b.get(k)} == {"max_position_embeddings"}
    assert b["max_position_embeddings"] == 262144
    # Formatting kept: the only changed text is the number.
    assert (copy / "config.json").read_text() == CONFIG.replace("2048,\n  \"num", "262144,\n  \"num")
    # Weights are hard links, config.json is its own file.
    assert (copy / "model.safetensors").stat().st_ino == (src / "model.safetensors").stat().st_ino
    assert (copy / "config.json").stat().st_ino != (src / "config.json").stat().st_ino
    assert (copy / "sub" / "tokenizer.json").read_text() == "{}"
    assert length_limit(b) == ("max_position_embeddings", 262144)


def test_idempotent_and_replaces_a_stale_copy(tmp_path: Path) -> None:
    _draft(tmp_path)
    rel = ensure_draft_copy(tmp_path, "Qwen/Qwen3-30B-A3B-EAGLE3", 262144)
    ino = (tmp_path / rel / "config.json").stat().st_ino
    assert not make_draft_copy(tmp_path / "Qwen/Qwen3-30B-A3B-EAGLE3", tmp_path / rel, 262144)
    assert (tmp_path / rel / "config.json").stat().st_ino == ino
    (tmp_path / rel / "config.json").write_text('{"max_position_embeddings": 1}')
    assert make_draft_copy(tmp_path / "Qwen/Qwen3-30B-A3B-EAGLE3", tmp_path / rel, 262144)
    assert json.loads((tmp_path / rel / "config.json").read_text())["max_position_embeddings"] == 262144
    assert not [p for p in (tmp_path / "Qwen").iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_missing_draft(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="draft folder not found"):
        ensure_draft_copy(tmp_path, "nope", 4096)


def test_length_limit_smallest_key_wins() -> None:
    assert length_limit({"max_position_embeddings": 262144, "seq_length": 2048}) == ("seq_length", 2048)
    assert length_limit({"text_config": {"max_position_embeddings": 4096}}) == \
        ("text_config.max_position_embeddings", 4096)
    assert length_limit({}) is None
