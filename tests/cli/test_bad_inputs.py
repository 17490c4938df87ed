"""Bad stack and node files through the real CLI: one line naming file, key and fix; exit 2;
nothing written.

Each case writes its files into a fresh scratch node, runs `b70deploy render STACK --out DIR`
(or the command given), and checks stderr against the expected pieces.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import MINIMAL_STACK, Scratch
from simkit import run_cli


@dataclass(frozen=True)
class Case:
    id: str
    stacks: dict[str, dict[str, Any] | str] = field(default_factory=dict)  # file stem -> doc or raw text
    config: dict[str, Any] | str | None = None                               # node config additions
    file: str = "bad.yaml"     # the file the message must name
    key: str = ""              # the key path the message must name
    says: str = ""             # a phrase of the message
    argv: tuple[str, ...] = ("render", "bad")


def stack(**over: Any) -> dict[str, Any]:
    doc = dict(MINIMAL_STACK)
    for k, v in over.items():
        doc[k] = v
    return doc


def _bomb(levels: int = 9) -> str:
    """A "billion laughs" stack file: under 1 KB that expands to 9**9 strings through aliases."""
    lines = ["  a0: &a0 [" + ", ".join(['"lol"'] * 9) + "]"]
    lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return yaml.safe_dump(MINIMAL_STACK, sort_keys=False) + "description:\n" + "\n".join(lines) + "\n"


BOMB = _bomb()
DEEP = yaml.safe_dump(MINIMAL_STACK, sort_keys=False) + "notes: " + "[" * 500 + "]" * 500 + "\n"
HUGE_INT = yaml.safe_dump({**MINIMAL_STACK, "max_model_len": 1}, sort_keys=False).replace(
    "max_model_len: 1", "max_model_len: " + "1" * 4400)

CASES = [
    Case("unknown-key", {"bad": stack(max_model_length=131072)},
         key="max_model_length", says="unknown key; fix: did you mean max_model_len? rename it, or remove it"),
    Case("unknown-key-far", {"bad": stack(colour="blue")},
         key="colour", says="unknown key; fix: remove it or use one of: api_key, attention_backend, bake_seconds"),
    Case("unknown-nested-key", {"bad": stack(tool_calling={"parser": "hermes", "auto": True})},
         key="tool_calling.auto", says="unknown key"),
    Case("int-as-string", {"bad": stack(max_model_len="131072")},
         key="max_model_len", says="fix: write a whole number without quotes"),
    Case("bool-as-string", {"bad": stack(prefix_caching="yes please")},
         key="prefix_caching", says="fix: write true, false or default"),
    Case("length-too-small", {"bad": stack(max_model_len=16)},
         key="max_model_len", says="greater than or equal to 256"),
    Case("length-too-large", {"bad": stack(max_model_len=10**9)},
         key="max_model_len", says="less than or equal to"),
    Case("bad-dtype", {"bad": stack(dtype="fp16")}, key="dtype", says="'fp16' is not allowed"),
    Case("spec-json-malformed", {"bad": stack(speculative='{"method": "ngram", "num_speculative_tokens": 5,')},
         key="speculative", says="not valid JSON"),
    Case("spec-json-not-object", {"bad": stack(speculative='["ngram"]')},
         key="speculative", says="not an object"),
    Case("ngram-min-over-max", {"bad": stack(speculative={"method": "ngram", "num_speculative_tokens": 5,
                                                          "prompt_lookup_min": 4, "prompt_lookup_max": 2})},
         key="speculative", says="prompt_lookup_min (4) is greater than prompt_lookup_max (2)"),
    Case("eagle-without-draft", {"bad": stack(speculative={"method": "eagle3"})},
         key="speculative", says="needs a draft model"),
    Case("auto-tool-choice-no-parser", {"bad": stack(tool_calling={"auto_tool_choice": True})},
         key="tool_calling", says="fix: add tool_calling.parser: hermes"),
    Case("alias-injection", {"bad": stack(served_model_names=["qwen: {evil: 1}"])},
         key="served_model_names", says="characters vLLM clients choke on"),
    Case("model-path-escape", {"bad": stack(model={"path": "../../etc"})},
         key="model.path", says="not a plain relative path"),
    Case("env-key-not-a-name", {"bad": stack(env={"BAD-KEY": "1"})},
         key="env", says="is not a variable name"),
    Case("env-value-newline", {"bad": stack(env={"A": "x\ninjected: 1"})},
         key="env", says="has a newline"),
    Case("patch-name", {"bad": stack(patches=["../marlin"])}, key="patches", says="patch name"),
    Case("empty-aliases", {"bad": stack(served_model_names=[])}, key="served_model_names", says="at least 1"),
    Case("missing-required", {"bad": {"image": "intel/vllm:latest"}}, key="model", says="required key is missing"),
    Case("control-character", {"bad": 'description: "bell \\x07 here"\n'}, key="description",
         says="control character"),
    Case("yaml-syntax", {"bad": "image: intel/vllm:latest\nmodel: {path: x\n"}, key="line", says="YAML syntax"),
    Case("duplicate-key", {"bad": "image: intel/vllm:latest\nmax_model_len: 4096\nmax_model_len: 8192\n"},
         key="line 3", says="key 'max_model_len' appears twice"),
    # ---- bounds: each of these once took minutes or gave a traceback
    Case("yaml-bomb", {"bad": BOMB}, key="line 8", says="YAML anchor &a0 is not allowed"),
    Case("yaml-alias", {"bad": "image: &i intel/vllm:latest\ndescription: *i\n"}, key="line 1",
         says="YAML anchor &i is not allowed"),
    Case("deep-nesting", {"bad": DEEP}, key="line 7", says="nested more than 64 levels deep"),
    Case("huge-integer", {"bad": HUGE_INT}, key="line 6", says="a number of 4400 characters is too long"),
    Case("spec-json-deep", {"bad": stack(speculative="[" * 100_000 + "]" * 100_000)}, key="speculative",
         says="speculative JSON nests too deep"),
    Case("spec-json-huge-integer", {"bad": stack(speculative='{"method": "ngram", "num_speculative_tokens": '
                                                            + "1" * 4400 + "}")},
         key="speculative", says="a number of 4400 characters is too long"),
    Case("node-yaml-bomb", {"bad": stack()}, config=BOMB.replace("description:", "x-bomb:"), file="node.yaml",
         key="line 8", says="YAML anchor &a0 is not allowed"),
    Case("top-level-list", {"bad": "- image: intel/vllm:latest\n"}, key="top level", says="not a mapping"),
    Case("declared-name", {"bad": stack(name="Eagle3")}, key="name", says="differs from the file name"),
    Case("extends-unknown", {"bad": stack(extends="w4a16-262k")}, key="extends", says="unknown parent"),
    Case("extends-cycle", {"bad": stack(extends="other"), "other": {"extends": "bad"}},
         file="other.yaml", key="extends", says="cycle bad -> other -> bad"),
    Case("parent-bad-key", {"bad": {"extends": "parent"}, "parent": stack(kv_cache_dtype="fp8 --evil")},
         file="parent.yaml", key="kv_cache_dtype", says="is not a single word"),
    Case("stack-file-name", {"Bad_Name": stack()}, file="Bad_Name.yaml", key="stack file name",
         says="not a valid stack name", argv=("stacks",)),
    # ---- node config
    Case("node-port-range", {"bad": stack()}, config={"ports": {"prod": 70000}}, file="node.yaml",
         key="ports.prod", says="less than or equal to 65535"),
    Case("node-same-ports", {"bad": stack()}, config={"ports": {"prod": 8000, "dark": 8000}}, file="node.yaml",
         key="ports", says="prod and dark ports are the same"),
    Case("node-standby-ports-reversed", {"bad": stack()}, config={"ports": {"standby": [9010, 9000]}},
         file="node.yaml", key="ports", says="ports.standby [9010, 9000] is not a range of ports"),
    Case("node-standby-ports-hold-prod", {"bad": stack()}, config={"ports": {"prod": 9005, "standby": [9000, 9010]}},
         file="node.yaml", key="ports", says="holds the prod or dark port"),
    Case("node-unknown-key", {"bad": stack()}, config={"deploy_dri": "/srv"}, file="node.yaml",
         key="deploy_dri", says="unknown key"),
    Case("node-project-name", {"bad": stack()}, config={"project": "B70 Prod"}, file="node.yaml",
         key="project", says="not a compose project name"),
    Case("node-companion-name", {"bad": stack()},
         config={"companions": [{"name": "Open WebUI", "image": "ghcr.io/open-webui/open-webui:main"}]},
         file="node.yaml", key="companions[0].name", says="companion name 'Open WebUI' is not allowed"),
    # Compose's own service names (capitals and dots: naptha-node's `Qwen2.5-7B-Instruct`) are taken; not a leading dot.
    Case("node-service-name", {"bad": stack()}, config={"service": "../vllm"}, file="node.yaml", key="service",
         says="service '../vllm' is not a compose service name"),
    Case("node-companion-env-key", {"bad": stack()},
         config={"companions": [{"name": "webui", "image": "webui:1", "environment": {"A: B": "1"}}]},
         file="node.yaml", key="companions[0].environment", says="not a variable name"),
    Case("node-bind-address", {"bad": stack()}, config={"bind_address": "localhost"}, file="node.yaml",
         key="bind_address", says="not an IP address"),
    Case("node-gid-string", {"bad": stack()}, config={"gids": {"render": "render"}}, file="node.yaml",
         key="gids.render", says="whole number"),
    Case("node-secrets-missing", {"bad": stack()}, config={"secrets_env_file": "absent.env"}, file="absent.env",
         key="secrets_env_file", says="not found"),
    Case("node-overlay-bad-key", {"bad": stack()}, config={"stack_overlay": {"gpu_mem": 0.9}}, file="node.yaml",
         key="stack_overlay: gpu_mem", says="unknown key"),
    # ---- merged with the node's overlay or a parent: the file that set the bad value is named
    Case("overlay-env-over-stack-list", {"bad": stack(env=["A=1"])}, config={"stack_overlay": {"env": {"B": "1"}}},
         key="env", says="valid dictionary, got ['A=1']"),
    Case("parent-env-list-under-child-map", {"bad": {"extends": "parent", "env": {"B": "1"}},
                                             "parent": stack(env=["A=1"])},
         file="parent.yaml", key="env", says="valid dictionary"),
    Case("overlay-list-over-stack-env", {"bad": stack(env={"A": "1"})}, config={"stack_overlay": {"env": ["B=1"]}},
         file="node.yaml: stack_overlay", key="env", says="valid dictionary, got ['B=1']"),
    Case("stack-env-key-with-overlay", {"bad": stack(env={"BAD-KEY": "1"})},
         config={"stack_overlay": {"env": {"B": "1"}}}, key="env.BAD-KEY", says="is not a variable name"),
    Case("overlay-env-key", {"bad": stack(env={"A": "1"})}, config={"stack_overlay": {"env": {"BAD-KEY": "1"}}},
         file="node.yaml: stack_overlay", key="env.BAD-KEY", says="is not a variable name"),
    # ---- an unknown patch: render, show and diff refuse it (lint: patch-unknown)
    Case("unknown-patch", {"bad": stack(patches=["no-such-patch"])}, key="patches",
         says="no patch named 'no-such-patch'"),
    Case("unknown-patch-show", {"bad": stack(patches=["no-such-patch"])}, key="patches",
         says="no patch named 'no-such-patch'", argv=("show", "bad")),
    Case("unknown-patch-diff", {"bad": stack(patches=["no-such-patch"])}, key="patches",
         says="no patch named 'no-such-patch'", argv=("diff", "bad")),
    Case("unknown-patch-in-parent", {"bad": {"extends": "parent"}, "parent": stack(patches=["no-such-patch"])},
         file="parent.yaml", key="patches", says="no patch named 'no-such-patch'"),
    Case("node-same-dirs", {"bad": stack()}, config={"deploy_dir": "/srv/b70", "state_dir": "/srv/b70"},
         file="node.yaml", key="deploy_dir", says="same folder"),
]


def _setup(scratch: Scratch, case: Case) -> Path:
    for name, doc in case.stacks.items():
        scratch.write_stack(name, doc)
    if case.config is not None:
        scratch.write_config(case.config)
    return scratch.root / "out"


def _check(case: Case, result: subprocess.CompletedProcess[str], out_dir: Path, scratch: Scratch) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: ")
    assert case.file in line
    assert case.key in line
    assert case.says in line
    assert "fix: " in line
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not out_dir.exists()
    assert not (scratch.root / "deploy").exists()
    assert not (scratch.root / "state").exists()


def test_there_are_at_least_fifteen_cases() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, scratch: Scratch) -> None:
    out_dir = _setup(scratch, case)
    argv = [*case.argv, "--out", str(out_dir)] if case.argv[0] == "render" else list(case.argv)
    result = run_cli(None, "--config", str(scratch.config), *argv, in_process=True)
    _check(case, result, out_dir, scratch)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("unknown-key", "node-port-range", "yaml-syntax")],
                         ids=lambda c: c.id)
def test_bad_input_through_a_real_process(case: Case, scratch: Scratch) -> None:
    """The same through `python -m b70deploy.cli`, as an operator's shell would run it."""
    out_dir = _setup(scratch, case)
    proc = run_cli(None, "--config", str(scratch.config), *case.argv, "--out", str(out_dir), timeout=60,
                   cwd=scratch.root)
    _check(case, proc, out_dir, scratch)


def test_unknown_stack_is_exit_2(scratch: Scratch) -> None:
    scratch.write_stack("only", stack())
    result = run_cli(None, "--config", str(scratch.config), "render", "absent", in_process=True)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: no stack named 'absent' in {scratch.stacks}; fix: use one of: only"


def test_invalid_stack_argument_is_exit_2(scratch: Scratch) -> None:
    result = run_cli(None, "--config", str(scratch.config), "show", "../etc/passwd", in_process=True)
    assert result.returncode == 2
    assert "not a valid stack name" in result.stderr


def test_missing_config_file_is_exit_2(scratch: Scratch) -> None:
    result = run_cli(None, "--config", str(scratch.root / "nope.yaml"), "stacks", in_process=True)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {scratch.root / 'nope.yaml'}: file not found; fix: check the path"


def test_unknown_option_is_exit_2() -> None:
    assert run_cli(None, "render", "--frobnicate", in_process=True).returncode == 2


BOUNDS = [c for c in CASES if c.id in ("yaml-bomb", "deep-nesting", "huge-integer", "spec-json-deep",
                                       "spec-json-huge-integer")]


@pytest.mark.parametrize("verb", ["render", "show", "lint"])
@pytest.mark.parametrize("case", BOUNDS, ids=lambda c: c.id)
def test_bounds_are_quick_in_every_verb(case: Case, verb: str, scratch: Scratch) -> None:
    """Refused in bounded time (well under a second on a quiet machine; the 30 s bound only tells
    a refusal from an unbounded expansion, whatever else loads the machine); lint reports the
    stack as one stack-invalid finding naming the file, the others as one error line."""
    out_dir = _setup(scratch, case)
    argv = {"render": ["render", "bad", "--out", str(out_dir)], "show": ["show", "bad"],
            "lint": ["lint", "--no-docker", "bad"]}[verb]
    start = time.monotonic()
    result = run_cli(None, "--config", str(scratch.config), *argv, in_process=True)
    assert time.monotonic() - start < 30
    if verb != "lint":
        _check(case, result, out_dir, scratch)
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr
    finding = [ln for ln in result.stdout.splitlines() if "[stack-invalid]" in ln]
    assert len(finding) == 1 and case.file in finding[0] and case.says in finding[0]
    assert finding[0].count("fix: ") == 1


@pytest.mark.parametrize("case", BOUNDS, ids=lambda c: c.id)
def test_bounds_through_a_real_process(case: Case, scratch: Scratch) -> None:
    out_dir = _setup(scratch, case)
    start = time.monotonic()
    proc = run_cli(None, "--config", str(scratch.config), *case.argv, "--out", str(out_dir), timeout=60,
                   cwd=scratch.root)
    assert time.monotonic() - start < 30  # start-up included; an unbounded expansion never ends
    _check(case, proc, out_dir, scratch)
