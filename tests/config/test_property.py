"""Property: whatever a stack file holds, loading raises nothing but UserError (never a
traceback), and a stack that loads always renders into files Compose can parse."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kit.scratch import SHIPPED_STACKS

from b70deploy.config.catalogue import Catalogue
from b70deploy.config.node import Node, load_node
from b70deploy.config.resources import data_dir
from b70deploy.config.schema import Companion, Expect, ModelSpec, NodeConfig, Smoke, Speculative, Stack, ToolCalling
from b70deploy.errors import UserError
from b70deploy.render.devices import DeviceAccess
from b70deploy.render.files import COMPOSE_FILE, render

PROFILE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                   derandomize=False)

NESTED_KEYS = sorted({*Stack.model_fields, *ModelSpec.model_fields, *Speculative.model_fields,
                      *ToolCalling.model_fields, *Expect.model_fields, *Smoke.model_fields,
                      "prompt", "expect", "max_tokens", "completion"})
NODE_KEYS = sorted({*NodeConfig.model_fields, *Companion.model_fields, "prod", "dark", "health"})

# Strings that are valid somewhere, hostile somewhere, or both.
WORDS = ["ngram", "eagle3", "eagle", "suffix", "mtp", "fp8", "auto", "float16", "bfloat16", "hermes", "gptq",
         "compressed-tensors", "moe", "hybrid-moe", "bash-c", "vllm-serve", "intel/vllm:latest", "a/b", "w4a16",
         "w4a16-131k", "Qwen/Qwen3-30B-A3B-W4A16", "qwen3-30b-a3b-w4a16", '{"method": "ngram"}',
         '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":2,"prompt_lookup_max":4}',
         '{"method": ', "[1, 2]", "", " ", "x: y\nz: w", "$HOME", "${VLLM_MODEL}", "'", '"', "#", "\\",
         "\x07", "\ud800", "\r", "\u2028", "\ufeff", "😀", "../x", "/abs", "127.0.0.1", "::1", "16g", "8000"]

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40), st.sampled_from([0, 1, 2, 5, 256, 8000, 65535, 65536, 262144]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 0.92, 1.0, 1.5]),
    st.text(max_size=24), st.sampled_from(WORDS),
)
keys = st.one_of(st.sampled_from(NESTED_KEYS), st.text(max_size=10))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=24,
)
stack_docs = st.dictionaries(st.one_of(st.sampled_from(NESTED_KEYS), st.text(max_size=10)), values, max_size=10)
# Half of the random documents extend a shipped stack, so some of them load.
extending_docs = st.one_of(stack_docs, st.builds(lambda d, p: {**d, "extends": p}, st.dictionaries(
    st.sampled_from(NESTED_KEYS), values, max_size=3), st.sampled_from(SHIPPED_STACKS)))
raw_texts = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["", "---\n", "- a\n- b\n", "a: [1, 2\n", "&a [*a]\n", "a: &x [*x]\n",
                     "!!python/object:os.system {}\n", "? [a, b]\n: c\n", "a: 1\na: 2\n", "x: !!binary aGVsbG8=\n",
                     "%YAML 9.9\n---\na: 1\n", "<<: {a: 1}\na: 2\n", "a: {<<: [{b: 1}, {b: 2}]}\n",
                     "name: s\nimage: !!float 1\n", "speculative: &s {method: ngram}\nextends: *s\n"]),
)


def _merged(cat: Catalogue, name: str) -> dict[str, Any]:
    data = dict(cat.resolve_doc(name).data)
    data.pop("extends", None)
    data.pop("name", None)
    return data


@st.composite
def mutated_stacks(draw: st.DrawFn) -> dict[str, Any]:
    """A shipped stack, fully merged, with a few keys replaced, removed or added at any depth."""
    cat = Catalogue(data_dir("stacks"))
    doc = _merged(cat, draw(st.sampled_from(SHIPPED_STACKS)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        target: Any = doc
        while True:
            if isinstance(target, dict) and target:
                key = draw(st.sampled_from(sorted(target, key=str)))
            elif isinstance(target, list) and target:
                key = draw(st.integers(min_value=0, max_value=len(target) - 1))
            else:
                break
            child = target[key]
            if isinstance(child, (dict, list)) and child and draw(st.booleans()):
                target = child
                continue
            action = draw(st.sampled_from(["replace", "delete", "add"]))
            if action == "replace":
                target[key] = draw(values)
            elif action == "delete":
                del target[key]
            elif isinstance(target, dict):
                target[draw(keys)] = draw(values)
            else:
                target.append(draw(values))
            break
    if draw(st.booleans()):
        doc["extends"] = draw(st.sampled_from([*SHIPPED_STACKS, "absent", "s"]))
    return doc


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Path, Node]]:
    """A stacks folder (the shipped stacks plus `s.yaml`, rewritten per example) and a node."""
    root = Path(tempfile.mkdtemp(prefix="b70prop-"))
    stacks = root / "stacks"
    shutil.copytree(data_dir("stacks"), stacks)
    cfg = root / "node.yaml"
    cfg.write_text(yaml.safe_dump({"deploy_dir": str(root / "deploy"), "state_dir": str(root / "state"),
                                   "stacks_dir": str(stacks), "device_dir": None}))
    try:
        yield stacks, load_node(str(cfg))
    finally:
        shutil.rmtree(root)


def _check(stacks: Path, node: Node, text: str) -> None:
    (stacks / "s.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        stack = node.catalogue().load("s")
    except UserError as e:
        line = str(e)
        assert "\n" not in line and "fix: " in line, line
        return
    event("loaded and rendered")
    rendered = render(stack, node, DeviceAccess(device_dir=None))
    doc = yaml.safe_load(rendered.files[COMPOSE_FILE])
    assert doc["services"]["vllm"]["command"] == [a.replace("$", "$$") if a != "${VLLM_MODEL}" else a
                                                  for a in rendered.command]
    for name, data in rendered.files.items():
        data.decode("utf-8")
        if name.endswith(".env"):
            for line in data.decode().splitlines():
                assert line.startswith("#") or "=" in line, line


def _dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, allow_unicode=False, sort_keys=False)


@PROFILE
@given(doc=extending_docs)
def test_random_documents(world: tuple[Path, Node], doc: dict[str, Any]) -> None:
    _check(*world, _dump(doc))


@PROFILE
@given(doc=mutated_stacks())
def test_mutated_shipped_stacks(world: tuple[Path, Node], doc: dict[str, Any]) -> None:
    _check(*world, _dump(doc))


@PROFILE
@given(parser=st.text(max_size=20), extra=st.lists(st.text(max_size=20), max_size=4),
       env=st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), st.text(max_size=20),
                           max_size=3),
       tuning=st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=12), st.integers(), st.booleans()),
                              max_size=2))
def test_free_text_fields_render_safely(world: tuple[Path, Node], parser: str, extra: list[str],
                                        env: dict[str, str], tuning: dict[str, Any]) -> None:
    """The fields whose text reaches the compose file or env files verbatim."""
    doc = {"extends": "ngram", "tool_calling": {"parser": parser, "auto_tool_choice": False},
           "extra_args": extra, "env": env, "speculative": {"tuning": tuning}}
    _check(*world, _dump(doc))


@PROFILE
@given(text=raw_texts)
def test_raw_text(world: tuple[Path, Node], text: str) -> None:
    _check(*world, text)


@settings(max_examples=100, deadline=None)
@given(doc=st.dictionaries(st.one_of(st.sampled_from(NODE_KEYS), st.text(max_size=8)),
                           st.recursive(scalars, lambda i: st.one_of(st.lists(i, max_size=3),
                                                                     st.dictionaries(st.sampled_from(NODE_KEYS), i,
                                                                                     max_size=4)),
                                        max_leaves=12),
                           max_size=6))
def test_random_node_configs(world: tuple[Path, Node], doc: dict[str, Any]) -> None:
    stacks, _ = world
    cfg = stacks.parent / "random-node.yaml"
    cfg.write_text(_dump(doc))
    try:
        node = load_node(str(cfg))
    except UserError as e:
        assert "\n" not in str(e)
        return
    assert node.deploy_dir.is_absolute() and node.state_dir.is_absolute()
