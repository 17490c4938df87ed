"""The stack catalogue: the shipped stacks carry the post's values, `extends:` merges by the
documented rule, and errors name the file that set the bad key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import MINIMAL_STACK, SHIPPED_STACKS, Scratch
from simkit import run_cli

from b70deploy.config.catalogue import Catalogue, deep_merge
from b70deploy.config.node import load_node
from b70deploy.config.resources import data_dir
from b70deploy.errors import UserError
from b70deploy.render.vllm_args import container_command, speculative_json
from b70deploy.sim.image import TAGS as SIM_TAGS


@pytest.fixture(scope="module")
def shipped() -> Catalogue:
    return Catalogue(data_dir("stacks"))


# ------------------------------------------------------------------ deep_merge


def test_merge_mappings_recursively() -> None:
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "b": 1}
    over = {"a": {"y": {"q": 3, "r": 4}}}
    assert deep_merge(base, over) == {"a": {"x": 1, "y": {"p": 1, "q": 3, "r": 4}}, "b": 1}


def test_merge_lists_and_scalars_replace() -> None:
    base = {"l": [1, 2, 3], "s": "old", "m": {"k": 1}}
    over = {"l": [9], "s": "new", "m": "scalar now"}
    assert deep_merge(base, over) == {"l": [9], "s": "new", "m": "scalar now"}


def test_merge_mapping_replaces_scalar() -> None:
    assert deep_merge({"a": 1}, {"a": {"b": 2}}) == {"a": {"b": 2}}


def test_merge_null_deletes() -> None:
    base = {"speculative": {"method": "ngram"}, "keep": 1, "nested": {"x": 1, "y": 2}}
    out = deep_merge(base, {"speculative": None, "nested": {"x": None}, "absent": None})
    assert out == {"keep": 1, "nested": {"y": 2}}


def test_merge_does_not_mutate_inputs() -> None:
    base = {"a": {"b": [1]}}
    over = {"a": {"c": [2]}}
    out = deep_merge(base, over)
    out["a"]["b"].append(5)
    out["a"]["c"].append(5)
    assert base == {"a": {"b": [1]}}
    assert over == {"a": {"c": [2]}}


def test_merge_records_provenance() -> None:
    prov: dict[str, str] = {}
    merged = deep_merge({}, {"a": {"b": 1}, "c": 2}, prov=prov, source="parent.yaml")
    deep_merge(merged, {"a": {"b": 3}}, prov=prov, source="child.yaml")
    assert prov == {"a": "child.yaml", "a.b": "child.yaml", "c": "parent.yaml"}


def test_merge_asks_before_a_mapping_replaces_a_non_mapping() -> None:
    dropped: list[tuple[tuple[str, ...], Any]] = []
    out = deep_merge({"a": {"b": [1]}, "c": "s"}, {"a": {"b": {"x": 1}}, "c": {"y": 2}, "d": {"z": 3}},
                     conflict=lambda loc, value: dropped.append((loc, value)))
    assert out == {"a": {"b": {"x": 1}}, "c": {"y": 2}, "d": {"z": 3}}
    assert dropped == [(("a", "b"), [1]), (("c",), "s")]


def test_a_valid_value_a_mapping_replaces_is_no_error(tmp_path: Path) -> None:
    """The merge rule stands where the dropped value was right: a JSON `speculative:` string
    in the parent, a mapping in the child."""
    (tmp_path / "parent.yaml").write_text(json.dumps({
        **MINIMAL_STACK, "speculative": json.dumps({"method": "ngram", "num_speculative_tokens": 5})}))
    (tmp_path / "child.yaml").write_text(json.dumps({"extends": "parent",
                                                     "speculative": {"method": "suffix"}}))
    stack = Catalogue(tmp_path).load("child")
    assert stack.speculative is not None and stack.speculative.method == "suffix"


# ------------------------------------------------------------------ shipped stacks


def test_catalogue_lists_the_seven_stacks(shipped: Catalogue) -> None:
    assert shipped.names() == ["eagle3", "ngram", "qwen35", "qwen36", "tq-256k", "w4a16", "w4a16-131k"]
    assert shipped.names() == SHIPPED_STACKS


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_every_shipped_stack_loads(shipped: Catalogue, name: str) -> None:
    stack = shipped.load(name)
    assert stack.name == name
    # The two aliases clients use survive every migration of the 30B (the post's cutover rule);
    # the hybrids the report tried and did not ship serve their own alias, never those two.
    production = {"qwen3-30b-a3b-w4a16", "qwen3-30b-tq-256k"}
    if name == "tq-256k":  # the old stack itself: the one alias it served (the new stack added the second)
        assert stack.served_model_names == ["qwen3-30b-tq-256k"]
    elif stack.model_family == "qwen3-30b-a3b":
        assert production <= set(stack.served_model_names)
    else:
        assert name in ("qwen35", "qwen36") and not production & set(stack.served_model_names)
        assert stack.served_model_names == [stack.model_family]
    assert stack.dtype == "float16"
    assert stack.tool_calling.parser == "hermes"
    assert stack.tool_calling.auto_tool_choice


# Values straight from the field report.
POST_VALUES: dict[str, dict[str, Any]] = {
    "tq-256k": {"image": "vllm-xpu:0.19.0-tr5", "entrypoint_style": "vllm-serve",
                "kv_cache_dtype": "turboquant_k3v4_nc",
                "max_model_len": 262144, "prefix_caching": True, "patches": ["gptq-xpu"],
                "model.path": "Qwen/Qwen3-30B-A3B-GPTQ-Int4", "model.quantization": "gptq",
                "speculative.method": "suffix"},
    "w4a16-131k": {"image": "intel/vllm:latest", "entrypoint_style": "bash-c", "kv_cache_dtype": "fp8",
                   "max_model_len": 131072, "patches": ["marlin-xpu-carveout"], "speculative": None,
                   "model.quantization": "compressed-tensors", "expect.attention_backend": "FLASH_ATTN"},
    "w4a16": {"extends": "w4a16-131k", "max_model_len": 262144, "kv_cache_dtype": "fp8",
              "patches": ["marlin-xpu-carveout"], "speculative": None},
    "ngram": {"extends": "w4a16", "max_model_len": 262144, "speculative.method": "ngram",
              "speculative.num_speculative_tokens": 5, "speculative.prompt_lookup_min": 2,
              "speculative.prompt_lookup_max": 4, "enforce_eager": False},
    "eagle3": {"extends": "w4a16", "max_model_len": 262144, "enforce_eager": True, "speculative.method": "eagle3",
               "speculative.draft_max_position_embeddings": 262144},
    "qwen35": {"image": "intel/vllm:latest", "enforce_eager": True, "prefix_caching": False,
               "model.path": "Qwen/Qwen3.5-35B-A3B-GPTQ-Int4", "model.architecture": "hybrid-moe"},
    "qwen36": {"image": "intel/vllm:latest", "enforce_eager": True, "model.quantization": "compressed-tensors",
               "smoke.completion.expect": "Paris"},
}


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", sorted(POST_VALUES))
def test_shipped_stack_has_the_posts_values(shipped: Catalogue, name: str) -> None:
    stack = shipped.load(name)
    for key, want in POST_VALUES[name].items():
        assert _get(stack, key) == want, f"{name}: {key}"


def test_ngram_speculative_config_is_the_posts_json(shipped: Catalogue) -> None:
    post = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'
    assert speculative_json(shipped.load("ngram")) == post


def test_eagle3_differs_from_w4a16_only_by_eager_and_draft(shipped: Catalogue) -> None:
    # "everything else byte-identical to the config it replaced"
    base = container_command(shipped.load("w4a16"))
    eagle = container_command(shipped.load("eagle3"))
    extra = [a for a in eagle if a not in base]
    assert extra[0] == "--enforce-eager"
    assert extra[1] == "--speculative-config"
    assert json.loads(extra[2])["method"] == "eagle3"
    assert [a for a in eagle if a in base] == base


# ------------------------------------------------------------------ extends


def test_extends_chain_merges_in_order(scratch: Scratch) -> None:
    scratch.write_stack("base", {**MINIMAL_STACK, "env": {"A": "1", "B": "2"}, "notes": ["base note"]})
    scratch.write_stack("mid", {"extends": "base", "env": {"B": "mid"}, "max_model_len": 65536})
    scratch.write_stack("leaf", {"extends": "mid", "env": {"A": None, "C": "3"}, "notes": ["leaf note"]})
    cat = Catalogue(scratch.stacks)
    stack = cat.load("leaf")
    assert stack.env == {"B": "mid", "C": "3"}
    assert stack.notes == ["leaf note"]
    assert stack.max_model_len == 65536
    assert stack.extends == "mid"
    doc = cat.resolve_doc("leaf")
    assert [p.name for p in doc.chain] == ["leaf.yaml", "mid.yaml", "base.yaml"]


def test_child_null_drops_parents_speculative(scratch: Scratch) -> None:
    scratch.write_stack("base", {**MINIMAL_STACK, "speculative": {"method": "ngram", "num_speculative_tokens": 5}})
    scratch.write_stack("plain", {"extends": "base", "speculative": None})
    assert Catalogue(scratch.stacks).load("plain").speculative is None


def test_extends_cycle_is_an_error(scratch: Scratch) -> None:
    scratch.write_stack("a", {**MINIMAL_STACK, "extends": "b"})
    scratch.write_stack("b", {"extends": "a"})
    with pytest.raises(UserError, match=r"cycle a -> b -> a") as e:
        Catalogue(scratch.stacks).load("a")
    assert "fix:" in str(e.value)


def test_self_extension_is_a_cycle(scratch: Scratch) -> None:
    scratch.write_stack("a", {**MINIMAL_STACK, "extends": "a"})
    with pytest.raises(UserError, match="cycle"):
        Catalogue(scratch.stacks).load("a")


def test_unknown_parent_names_the_child(scratch: Scratch) -> None:
    path = scratch.write_stack("child", {**MINIMAL_STACK, "extends": "nope"})
    with pytest.raises(UserError, match="unknown parent stack 'nope'") as e:
        Catalogue(scratch.stacks).load("child")
    assert str(path) in str(e.value)


# ------------------------------------------------------------------ provenance


def test_bad_key_in_child_names_child(scratch: Scratch) -> None:
    parent = scratch.write_stack("parent", MINIMAL_STACK)
    child = scratch.write_stack("child", {"extends": "parent", "max_model_len": "lots"})
    with pytest.raises(UserError) as e:
        Catalogue(scratch.stacks).load("child")
    msg = str(e.value)
    assert msg.startswith(f"{child}: max_model_len:")
    assert str(parent) not in msg


def test_bad_key_in_parent_names_parent(scratch: Scratch) -> None:
    parent = scratch.write_stack("parent", {**MINIMAL_STACK, "tool_calling": {"auto_tool_choice": True}})
    child = scratch.write_stack("child", {"extends": "parent", "max_model_len": 65536})
    with pytest.raises(UserError) as e:
        Catalogue(scratch.stacks).load("child")
    msg = str(e.value)
    assert msg.startswith(f"{parent}: tool_calling:")
    assert str(child) not in msg


def test_nested_key_set_by_child_over_parent_mapping(scratch: Scratch) -> None:
    parent = scratch.write_stack("parent", {**MINIMAL_STACK, "model": {"path": "a/b", "quantization": "gptq"}})
    child = scratch.write_stack("child", {"extends": "parent", "model": {"quantization": "int3"}})
    with pytest.raises(UserError) as e:
        Catalogue(scratch.stacks).load("child")
    assert str(e.value).startswith(f"{child}: model.quantization:")
    assert str(parent) not in str(e.value)


def test_overlay_error_names_the_node_config(scratch: Scratch) -> None:
    scratch.write_stack("s", MINIMAL_STACK)
    cfg = scratch.write_config({"stack_overlay": {"max_num_seqs": 0}})
    with pytest.raises(UserError) as e:
        load_node(str(cfg)).catalogue().load("s")
    assert str(e.value).startswith(f"{cfg}: stack_overlay: max_num_seqs:")


def test_overlay_applies_to_every_stack(scratch: Scratch) -> None:
    scratch.copy_shipped()
    cfg = scratch.write_config({"stack_overlay": {"gpu_memory_utilization": 0.9, "env": {"ZE_AFFINITY_MASK": "0"}},
                                "image_map": {"intel/vllm:latest": SIM_TAGS["bash-c"]}})
    cat = load_node(str(cfg)).catalogue()
    for stack in cat.load_all():
        assert stack.gpu_memory_utilization == 0.9
        assert stack.env["ZE_AFFINITY_MASK"] == "0"
    assert cat.load("eagle3").image == SIM_TAGS["bash-c"]
    assert cat.load("tq-256k").image == "vllm-xpu:0.19.0-tr5"


def test_declared_name_must_match_file(scratch: Scratch) -> None:
    path = scratch.write_stack("real", {**MINIMAL_STACK, "name": "other"})
    with pytest.raises(UserError, match="differs from the file name") as e:
        Catalogue(scratch.stacks).load("real")
    assert str(path) in str(e.value)


def test_missing_stacks_dir_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="stacks folder not found"):
        Catalogue(tmp_path / "absent")


# ------------------------------------------------------------------ a new operator's mistakes


def test_a_mistyped_stack_name_gets_a_did_you_mean(scratch: Scratch) -> None:
    scratch.write_stack("w4a16-131k", MINIMAL_STACK)
    scratch.write_stack("eagle3", MINIMAL_STACK)
    with pytest.raises(UserError, match=r"no stack named 'w4a16-13k'.*fix: did you mean w4a16-131k\?"):
        Catalogue(scratch.stacks).load("w4a16-13k")
    with pytest.raises(UserError, match="fix: use one of: eagle3, w4a16-131k"):
        Catalogue(scratch.stacks).load("zzz")


def test_an_empty_stack_file_says_it_is_empty(scratch: Scratch) -> None:
    path = scratch.write_stack("blank", "")
    with pytest.raises(UserError, match="the stack file is empty") as e:
        Catalogue(scratch.stacks).load("blank")
    assert str(path) in str(e.value) and "required key" not in str(e.value)


def test_every_error_of_a_file_is_in_its_one_line(scratch: Scratch) -> None:
    path = scratch.write_stack("bad", {**MINIMAL_STACK, "max_model_len": "lots", "dtype": 3, "tensor_paralel": 2})
    with pytest.raises(UserError) as e:
        Catalogue(scratch.stacks).load("bad")
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"{path}: 3 errors: ")
    for key in ("max_model_len", "dtype", "tensor_paralel"):
        assert f"{key}: " in text, text


def test_stacks_lists_the_good_stacks_and_a_line_per_broken_file(scratch: Scratch) -> None:
    scratch.write_stack("good", MINIMAL_STACK)
    scratch.write_stack("zz-good", MINIMAL_STACK)
    scratch.write_stack("blank", "")
    scratch.write_stack("orphan", {"extends": "nobody"})
    (scratch.stacks / "Bad Name.yaml").write_text(yaml.safe_dump(MINIMAL_STACK))
    r = run_cli(scratch.config, "stacks", "--json", in_process=True)
    assert r.returncode == 2
    assert [row["name"] for row in json.loads(r.stdout)] == ["good", "zz-good"]
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 3, errors
    assert any("blank.yaml: the stack file is empty" in e for e in errors)
    assert any("orphan.yaml: extends: unknown parent stack 'nobody'" in e for e in errors)
    assert any("'Bad Name.yaml' is not a valid stack name" in e for e in errors)
    r = run_cli(scratch.config, "stacks", in_process=True)
    assert r.returncode == 2 and "zz-good" in r.stdout and "good" in r.stdout
