"""render/from_compose and vllm_args.parse_serve_args on resolved compose services (pure, no engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit.scratch import SHIPPED_STACKS

from b70deploy.config.catalogue import Catalogue
from b70deploy.config.resources import data_dir
from b70deploy.config.schema import Stack
from b70deploy.errors import UserError
from b70deploy.render.from_compose import stack_from_compose
from b70deploy.render.masking import is_secret
from b70deploy.render.vllm_args import FLAGS, container_command, flag_name, parse_serve_args, serve_flags

MODELS_BIND = {"type": "bind", "source": "/srv/models", "target": "/models", "read_only": True}
BASH_C = ["/bin/bash", "-c", 'source /opt/intel/oneapi/setvars.sh --force && exec "$$@"', "--"]


@dataclass
class Facts:
    ref: str
    id: str
    entrypoint_style: str


def service(command: list[str], **over: Any) -> dict[str, Any]:
    return {"image": "intel/vllm:latest", "command": command, "volumes": [MODELS_BIND], **over}


SERVE = ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-W4A16", "--served-model-name", "qwen3-30b-a3b-w4a16",
         "--max-model-len", "131072"]


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_parse_reads_back_every_flag_serve_flags_writes(name: str) -> None:
    stack = Catalogue(data_dir("stacks")).load(name)
    parsed = parse_serve_args(["/models/x", *serve_flags(stack)])
    assert parsed.model == "/models/x" and parsed.extra == list(stack.extra_args)
    assert parsed.fixed == {"--port": "8000"}  # no --host: the catalogue never says one (vLLM binds all interfaces)
    assert parsed.values["max_model_len"] == stack.max_model_len
    assert parsed.values["served_model_names"] == stack.served_model_names
    assert parsed.values["prefix_caching"] is stack.prefix_caching


def test_parse_forms_vllm_accepts() -> None:
    parsed = parse_serve_args(["--model=/models/m", "--max_model_len", "4096", "--dtype=float16",
                               "--tensor-parallel-size", "1", "--swap-space", "-1", "--enforce-eager",
                               "--no-enable-prefix-caching", "--max-num-seqs", "many"])
    assert parsed.model == "/models/m"
    assert parsed.values == {"max_model_len": 4096, "dtype": "float16", "enforce_eager": True,
                             "prefix_caching": False}
    assert parsed.extra == ["--tensor-parallel-size", "1", "--swap-space", "-1", "--max-num-seqs", "many"]
    assert "is not a max num seqs a stack can hold" in parsed.notes[0]
    assert [parse_serve_args(["--max-model-len", v]).values.get("max_model_len") for v in
            ("131072", "128K", "25.6k", "1m", "1.5K", "auto")] == [131072, 131072, 25600, 1_000_000, None, None]


def test_report_shape_maps_keys_and_keeps_the_rest() -> None:
    cmd = ["vllm", "serve", "--model", "/models/Qwen/Qwen3-30B-A3B-W4A16", "--served-model-name", "a", "b",
           "--max-model-len", "262144", "--dtype", "half", "--kv-cache-dtype", "fp8", "--enable-auto-tool-choice",
           "--tool-call-parser", "hermes", "--speculative-config",
           '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}',
           "--port", "8001", "--block-size", "64"]
    env = {"ZE_AFFINITY_MASK": "0", "HF_TOKEN": "canary-secret", "PRICE": "$$5"}
    out = stack_from_compose(service(cmd, entrypoint=BASH_C, environment=env))
    doc = out.doc
    assert doc["entrypoint_style"] == "bash-c" and "entrypoint" in out.sources["entrypoint_style"]
    assert doc["model"] == {"path": "Qwen/Qwen3-30B-A3B-W4A16"}
    assert doc["served_model_names"] == ["a", "b"] and doc["max_model_len"] == 262144
    assert doc["tool_calling"] == {"parser": "hermes", "auto_tool_choice": True}
    assert doc["speculative"] == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
                                  "prompt_lookup_min": 2}
    # half is a dtype vLLM takes and the schema does not: the flag stays, verbatim.
    assert doc["extra_args"] == ["--block-size", "64", "--dtype", "half"]
    assert doc["env"] == {"PRICE": "$5", "ZE_AFFINITY_MASK": "0"} and out.withheld == ["HF_TOKEN"]
    assert "canary-secret" not in repr(out)
    assert out.node == {"models_dir": "/srv/models", "models_target": "/models"}
    assert out.doc["container_port"] == 8001  # the operator's port, rendered back as --port 8001
    stack = Stack.model_validate({"name": "x", **doc})
    assert container_command(stack, model="/models/Qwen/Qwen3-30B-A3B-W4A16")[:2] == ["vllm", "serve"]


def test_image_decides_the_style_over_the_file() -> None:
    bare = SERVE[2:]
    out = stack_from_compose(service(bare), image=Facts("intel/vllm:latest", "sha256:" + "ab" * 32, "bash-c"))
    assert out.doc["entrypoint_style"] == "bash-c" and out.sources["entrypoint_style"].startswith("image")
    assert any("lacks `vllm serve`" in n for n in out.notes)
    shaped = stack_from_compose(service(bare))
    assert shaped.doc["entrypoint_style"] == "vllm-serve" and "shape" in shaped.sources["entrypoint_style"]


def test_weights_elsewhere_and_draft_copy_come_back() -> None:
    bind = {"type": "bind", "source": "/data/hf", "target": "/hf", "read_only": True}
    spec = '{"method":"eagle3","model":"/hf/Qwen/D.b70-mpe262144","num_speculative_tokens":3}'
    out = stack_from_compose({"image": "intel/vllm:latest", "volumes": [bind],
                              "command": [*SERVE[:2], "/hf/Qwen/M", *SERVE[3:], "--speculative-config", spec]})
    assert out.doc["model"] == {"path": "Qwen/M"} and out.node["models_dir"] == "/data/hf"
    assert out.node["models_target"] == "/hf"
    assert out.doc["speculative"] == {"method": "eagle3", "model": "Qwen/D", "num_speculative_tokens": 3,
                                      "draft_max_position_embeddings": 262144}


def test_weights_in_a_hugging_face_tree_below_the_bind() -> None:
    """The report's node: /llms:/llms with the weights at huggingface/Qwen/...: the models folder is
    the one above org/name, so the catalogue's Qwen/... paths resolve there as well."""
    bind = {"type": "bind", "source": "/llms", "target": "/llms", "read_only": True}
    out = stack_from_compose({"image": "intel/vllm:latest", "volumes": [bind],
                              "command": [*SERVE[:2], "/llms/huggingface/Qwen/M", *SERVE[3:]]})
    assert out.doc["model"] == {"path": "Qwen/M"}
    assert out.node["models_dir"] == "/llms/huggingface" and out.node["models_target"] == "/llms/huggingface"


@pytest.mark.parametrize(("svc", "says"), [
    (service([]), "no command"),
    ({**service(SERVE), "image": "Bad Image"}, "not an image reference"),
    (service(["vllm", "serve", "/srv/Qwen/Qwen3-30B-A3B"]), "not inside a bind-mounted folder"),
    (service([*SERVE, "--hf-token", "sk-canary"]), "--hf-token in clear"),
    (service([*SERVE, "--max-num-seqs", "64", "--max-num-batched-tokens", "8"]), "max_num_batched_tokens"),
])
def test_refused_services_name_the_problem(svc: dict[str, Any], says: str) -> None:
    with pytest.raises(UserError) as e:
        stack_from_compose(svc, where="f.yml: services.vllm")
    assert says in str(e.value) and str(e.value).startswith("f.yml: services.vllm: ")
    assert "sk-canary" not in str(e.value)


@pytest.mark.parametrize("flag", [["--api-key", "sk-canary", "other-key"], ["--api_key=sk-canary"]])
def test_an_api_key_leaves_the_stack_and_is_required_from_the_nodes_secrets(flag: list[str]) -> None:
    """louislepage's `--api-key ${VLLM_API_KEY}`: the stack (printed, 0644) holds no key; vLLM reads
    VLLM_API_KEY when no --api-key is given (build_app), which the node's secrets_env_file gives."""
    out = stack_from_compose(service([*SERVE[:3], *flag, *SERVE[3:]]))
    assert out.doc["api_key"] is True and "VLLM_API_KEY" in out.withheld
    assert "sk-canary" not in repr(out.doc) and out.doc.get("extra_args", []) == []
    assert stack_from_compose(service(SERVE)).doc.get("api_key") is None


def test_a_named_volume_that_is_hf_home_is_the_nodes_hf_cache_volume() -> None:
    svc = {"image": "vllm/vllm-openai:latest", "command": ["vllm", "serve", "Org/Model"],
           "volumes": [{"type": "volume", "source": "huggingface-cache", "target": "/root/.cache/huggingface"}]}
    out = stack_from_compose(svc)
    assert out.doc["model"] == {"path": "Org/Model", "hub": True}
    assert out.node == {"hf_cache_volume": "huggingface-cache"} and not any("named volume" in n for n in out.notes)
    deeper = {**svc, "volumes": [{"type": "volume", "source": "cache", "target": "/root/.cache"}]}
    with pytest.raises(UserError, match="mount a named volume at its HF_HOME"):
        stack_from_compose(deeper)


def test_what_the_stack_cannot_hold_is_named() -> None:
    svc = service(SERVE, volumes=[MODELS_BIND, {"type": "volume", "source": "hf", "target": "/root/.cache"},
                                  {"type": "bind", "source": "/srv/p/marlin_utils.py", "read_only": False,
                                   "target": "/opt/venv/lib/python3.12/site-packages/vllm/x/marlin_utils.py"}],
                  ports=[{"target": 8000, "published": "8000", "host_ip": "127.0.0.1"}],
                  devices=[{"source": "/dev/dri", "target": "/dev/dri"}], group_add=["992", "render"],
                  healthcheck={"test": ["CMD", "true"]}, environment={"UNSET": None}, container_name="qwen")
    out = stack_from_compose(svc)
    assert out.doc["compose"] == {"healthcheck": {"test": ["CMD", "true"]}}  # carried, not dropped
    assert out.doc["mounts"] == [{"source": "/srv/p/marlin_utils.py", "read_only": False,  # kept read-write
                                  "target": "/opt/venv/lib/python3.12/site-packages/vllm/x/marlin_utils.py"}]
    assert out.node == {"models_dir": "/srv/models", "models_target": "/models", "ports": {"prod": 8000},
                        "bind_address": "127.0.0.1",
                        "device_dir": "/dev/dri", "gids": {"gid992": 992}}
    text = "\n".join(out.notes)
    for piece in ("named volume at /root/.cache", "patch from-file", "group_add names render",
                  "container_name is not carried over", "UNSET has no value"):
        assert piece in text


# ---------------------------------------------------------------- the inverse, on random valid stacks

TOKENS = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)
ALIASES = st.from_regex(r"[a-z0-9][a-z0-9._:/-]{0,12}", fullmatch=True)
RULED = {n for f in FLAGS for n in (f.flag, f.off) if n} | {"--model"}


def _extra_ok(args: list[str]) -> bool:
    """extra_args that name no flag FLAGS renders (lint's flag-twice refuses those)."""
    return not any(flag_name(a)[0] in RULED for a in args if a.startswith("--"))


@st.composite
def stacks(draw: st.DrawFn) -> dict[str, Any]:
    spec = draw(st.one_of(
        st.none(),
        st.builds(lambda n, lo, hi: {"method": "ngram", "num_speculative_tokens": n, "prompt_lookup_min": lo,
                                     "prompt_lookup_max": lo + hi}, st.integers(1, 8), st.integers(1, 4),
                  st.integers(0, 4)),
        st.builds(lambda n, mpe: {"method": "eagle3", "model": "Qwen/D", "num_speculative_tokens": n,
                                  **({"draft_max_position_embeddings": mpe} if mpe else {})},
                  st.integers(1, 5), st.sampled_from([None, 262144])),
        st.builds(lambda t: {"method": "suffix", "tuning": t},
                  st.dictionaries(st.sampled_from(["suffix_cache_max_depth", "x_y"]),
                                  st.one_of(st.integers(0, 99), st.booleans(), TOKENS), max_size=2)),
    ))
    parser = draw(st.sampled_from([None, "hermes", "qwen3_xml"]))
    doc: dict[str, Any] = {
        "image": "intel/vllm:latest", "entrypoint_style": draw(st.sampled_from(["bash-c", "vllm-serve"])),
        "model": {"path": "Qwen/M"}, "served_model_names": draw(st.lists(ALIASES, min_size=1, max_size=3,
                                                                          unique=True)),
        "dtype": draw(st.sampled_from(["auto", "float16", "bfloat16"])),
        "max_model_len": draw(st.integers(256, 1_000_000)),
        "kv_cache_dtype": draw(st.sampled_from(["auto", "fp8", "k3v4_nc"])),
        "gpu_memory_utilization": draw(st.sampled_from([None, 0.5, 0.92, 0.875])),
        "prefix_caching": draw(st.booleans()), "enforce_eager": draw(st.booleans()),
        "attention_backend": draw(st.sampled_from([None, "FLASH_ATTN", "TRITON_ATTN"])),
        "max_num_seqs": draw(st.sampled_from([None, 1, 64])),
        "max_num_batched_tokens": draw(st.sampled_from([None, 8192])),
        "tool_calling": {"parser": parser, "auto_tool_choice": parser is not None and draw(st.booleans())},
        "extra_args": draw(st.lists(TOKENS, max_size=4).filter(_extra_ok)),
        "env": draw(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
            lambda k: not is_secret(k)), TOKENS.filter(lambda v: "\n" not in v and "\r" not in v), max_size=3)),
    }
    if spec is not None:
        doc["speculative"] = spec
    return doc


@settings(max_examples=150, deadline=None)
@given(doc=stacks())
def test_from_compose_inverts_render_on_random_stacks(doc: dict[str, Any]) -> None:
    """What Compose would hand back for a rendered stack (a literal `$` as `$$`) maps to a stack that
    renders the same command and env."""
    stack = Stack.model_validate({"name": "s", **doc})
    model = "/models/Qwen/M"
    copy = stack.speculative and stack.speculative.draft_max_position_embeddings
    draft = f"/models/Qwen/D.b70-mpe{copy}" if copy else None
    command = container_command(stack, model=model, draft_path=draft)
    service = {"image": stack.image, "command": [a.replace("$", "$$") for a in command],
               "environment": {k: v.replace("$", "$$") for k, v in stack.env.items()}, "volumes": [MODELS_BIND]}
    back = Stack.model_validate({"name": "s", **stack_from_compose(service).doc})
    assert container_command(back, model=model, draft_path=draft) == command
    assert back.env == stack.env and back.entrypoint_style == stack.entrypoint_style


PRELUDE = "python3 -c 'import sys; sys.path.insert(0, \"/opt\"); import turboquant_register'"


def test_bash_c_prelude_is_kept_verbatim_and_rendered_back() -> None:
    """The report's old launch: bash -c "python3 -c '...' && vllm serve ...": the serve part maps as
    any command, the prefix becomes `prelude:`, and render puts it back in front of `exec vllm serve`."""
    script = f"{PRELUDE} && vllm serve {' '.join(SERVE[2:])} --kv-cache-dtype turboquant_k3v4_nc"
    out = stack_from_compose({**service(SERVE), "command": ["bash", "-c", script]})
    assert out.doc["prelude"] == PRELUDE and out.doc["kv_cache_dtype"] == "turboquant_k3v4_nc"
    assert out.doc["model"] == {"path": "Qwen/Qwen3-30B-A3B-W4A16"}
    stack = Stack.model_validate({"name": "x", **out.doc})
    cmd = container_command(stack, model="/models/Qwen/Qwen3-30B-A3B-W4A16")
    assert cmd[:2] == ["bash", "-c"] and cmd[2].startswith(f"{PRELUDE} && exec vllm serve /models/Qwen/")
    again = stack_from_compose({**service(SERVE), "command": cmd})
    assert again.doc == out.doc  # unsaid prefix caching stays unsaid


@pytest.mark.parametrize(("script", "says"), [
    ("echo hi", "runs no `vllm serve`"),
    (f"{PRELUDE} && vllm serve /models/Qwen/M --max-model-len 8 ; rm -rf /", "shell operator"),
    ("vllm serve $MODEL --max-model-len 8", "expansion"),
])
def test_a_bash_c_script_it_cannot_read_is_one_line(script: str, says: str) -> None:
    with pytest.raises(UserError) as e:
        stack_from_compose({**service(SERVE), "command": ["bash", "-c", script]})
    assert says in e.value.what and "\n" not in e.value.what


# ---------------------------------------------------------------- started otherwise than `vllm serve`

LAUNCHER = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
FLAGS_ONLY = ["--model", "/models/Qwen/M", "--served-model-name", "m", "--max-model-len", "4096"]


@pytest.mark.parametrize(("svc", "style"), [
    (service([*LAUNCHER, *FLAGS_ONLY]), "bash-c"),                  # the launcher in the command
    (service(FLAGS_ONLY, entrypoint=LAUNCHER), "vllm-serve"),        # the launcher as the entrypoint
])
def test_python_m_launcher_is_kept_and_rendered_back_as_the_same_argv(svc: dict[str, Any], style: str) -> None:
    out = stack_from_compose(svc)
    assert out.doc["launcher"] == LAUNCHER and out.doc["entrypoint_style"] == style
    assert out.doc["model"] == {"path": "Qwen/M"} and "extra_args" not in out.doc
    stack = Stack.model_validate({"name": "s", **out.doc})
    command = container_command(stack, model="/models/Qwen/M")
    argv = command if style == "bash-c" else [*LAUNCHER, *command]
    assert argv[:5] == [*LAUNCHER, "--model", "/models/Qwen/M"]
    assert parse_serve_args(argv[3:]).values == parse_serve_args(FLAGS_ONLY).values  # nothing added


def test_bash_lc_keeps_its_login_shell() -> None:
    script = "source /etc/profile.d/conda.sh && vllm serve /models/Qwen/M --served-model-name m --max-model-len 4096"
    out = stack_from_compose(service(["bash", "-lc", script]))
    assert out.doc["shell"] == ["bash", "-lc"] and out.doc["prelude"] == "source /etc/profile.d/conda.sh"
    stack = Stack.model_validate({"name": "s", **out.doc})
    command = container_command(stack, model="/models/Qwen/M")
    assert command[:2] == ["bash", "-lc"] and command[2].startswith("source /etc/profile.d/conda.sh && exec vllm serve")
    # Read back, the rendered command is the same stack.
    again = stack_from_compose(service(command)).doc
    assert again == out.doc


@pytest.mark.parametrize(("svc", "key"), [
    (service([], entrypoint=["/bin/bash", "/scripts/start.sh"]), "entrypoint"),
    (service([], entrypoint=["/entrypoint.sh"]), "entrypoint"),
    (service(["/start.sh"]), "command"),
    (service(["bash", "/scripts/start.sh"]), "command"),
])
def test_a_script_that_builds_the_flags_is_refused_naming_the_key(svc: dict[str, Any], key: str) -> None:
    with pytest.raises(UserError) as e:
        stack_from_compose(svc, where="f.yml: services.vllm")
    assert str(e.value).startswith(f"f.yml: services.vllm.{key}: ") and "b70deploy import FILE" in str(e.value)


def test_token_counts_and_token_flags_are_not_secrets() -> None:
    cmd = [*SERVE, "--enable-prompt-tokens-details", "--max-num-batched-tokens", "8192"]
    out = stack_from_compose(service(cmd, environment={"MAX_NUM_BATCHED_TOKENS": "8192", "HF_TOKEN": "hf_x"}))
    assert out.doc["extra_args"] == ["--enable-prompt-tokens-details"] and out.doc["max_num_batched_tokens"] == 8192
    assert out.doc["env"] == {"MAX_NUM_BATCHED_TOKENS": "8192"} and out.withheld == ["HF_TOKEN"]


def test_the_operators_labels_are_named_as_the_nodes_not_dropped_in_silence() -> None:
    """A stack from a hand-made file leaves the vllm service's labels to the node config (init writes them
    there, every stack renders them): the note says so; the tool's own b70deploy.* labels are not named."""
    labels = ["traefik.http.routers.llm.rule=Host(`llm.example.org`)", "b70deploy.stack=old"]
    out = stack_from_compose(service(SERVE, labels=labels))
    [note] = [n for n in out.notes if n.startswith("labels (")]
    assert "traefik.http.routers.llm.rule" in note and "b70deploy.stack" not in note and "init" in note
    assert "labels" not in out.doc.get("compose", {})
    assert not any(n.startswith("labels (") for n in stack_from_compose(service(SERVE)).notes)
