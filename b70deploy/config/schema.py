"""The shapes of a stack file and of the node config, validated by pydantic.

Every model forbids unknown keys and does not coerce types ("8000" is not a port), so a
typo is an error with a key path rather than a silently ignored setting. Validators raise
ValueError("what; fix: how"); `validation.py` turns that into one line naming the file.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .compose_keys import COMPANION_OWNED, check_keys
from .hub import CONTAINER_HF_HOME, HUB_FOLDER, HUB_ID_RE
from .names import NAME_RE, SERVICE_RE

MAX_CONTEXT = 10_485_760  # 10M tokens: far above any model; catches a stray digit
ALIAS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Relative paths below models_dir: no leading '/', no '..' component, no whitespace.
REL_PATH_RE = re.compile(r"^(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9._@+=,/-]+$")
# Absolute paths, same characters, no '..' component.
ABS_PATH_RE = re.compile(r"^/(?!.*(^|/)\.\.(/|$))[A-Za-z0-9._@+=,/-]*$")
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:@-]*$")


# Why standby needs the door: vLLM attaches /sleep, /wake_up and /is_sleeping only with VLLM_SERVER_DEV_MODE
# (vllm/entrypoints/serve/sleep/api_router.py:52-56, 0.21.0), beside its other development endpoints.
NO_DOOR = ("standby: sleep needs the front door (door.enabled is false): vLLM's sleep routes come with its "
           "development endpoints, which only the door keeps from clients")


def invalid(what: str, fix: str) -> ValueError:
    """A validator's error: pydantic keeps the message, validation.py makes it one line."""
    return ValueError(f"{what}; fix: {fix}")


def _env_key(key: str) -> str:
    if not ENV_KEY_RE.match(key):
        raise invalid(f"env key {key!r} is not a variable name", "use [A-Za-z_][A-Za-z0-9_]*")
    return key


def _env_value(value: str) -> str:
    if any(c in value for c in "\n\r\x00"):
        raise invalid("the value has a newline", "env values are single lines")
    return value


# Checked per entry, so an error's key path names the variable (env.BAD-KEY): with an
# `extends:` chain and an overlay, that is what says which file set it.
def _vllm_compose(v: dict[str, Any]) -> dict[str, Any]:
    problem = check_keys(v)
    if problem is not None:
        raise invalid(*problem)
    return v


# Compose keys merged into the vllm service (a stack's own, or the node's node-wide ones).
VllmCompose = Annotated[dict[str, Any], AfterValidator(_vllm_compose)]
EnvMap = dict[Annotated[str, AfterValidator(_env_key)], Annotated[str, AfterValidator(_env_value)]]


class _LongNumber(ValueError):
    pass


def _json_int(text: str) -> int:
    """An integer in inline JSON, bounded like the YAML loader's (a 4,300-digit one is a ValueError)."""
    if len(text) > 32:
        raise _LongNumber(f"a number of {len(text)} characters is too long")
    return int(text)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _rel_path(v: str, key: str) -> str:
    if not REL_PATH_RE.match(v):
        raise invalid(
            f"{key} {v!r} is not a plain relative path",
            "give a path below the node's models_dir, without '..', spaces or a leading '/'",
        )
    return v


def _gpus(v: Any) -> Any:
    """`gpus:` is all, a count of at least 1, or a list of device ids (distinct, each a plain word)."""
    if v is None or v == "all":
        return v
    if isinstance(v, bool) or (isinstance(v, int) and v < 1):
        raise invalid(f"gpus {v!r} is not a GPU count", "give all, a count of at least 1, or a list of ids")
    if isinstance(v, list):
        if not v or len(set(map(str, v))) != len(v):
            raise invalid("gpus lists no id, or one twice", "list each device id once, e.g. [0, 1]")
        for i in v:
            if isinstance(i, bool) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$", str(i)):
                raise invalid(f"gpus id {i!r} is not a device id", "use an index (0) or a UUID (GPU-...)")
        return [str(i) for i in v]
    if isinstance(v, int):
        return v
    raise invalid(f"gpus {v!r} is not all, a count or a list", "give all, a count of at least 1, or a list of ids")


# all | a count | device ids (indices or UUIDs), strings after validation
GpuSelection = Annotated[Literal["all"] | int | list[str | int], AfterValidator(_gpus)]


class Standby(Strict):
    """Hot standby (issue 24): `sleep` keeps the previous stack asleep in vLLM's sleep mode instead of
    stopping it. Level 1 moves the weights to host RAM and drops the KV cache, level 2 drops both
    (vllm/v1/worker/gpu_worker.py:160-182, 0.21.0)."""

    mode: Literal["off", "sleep"] = "off"
    level: Literal[1, 2] | None = None  # None: 1 (render/standby.py level_of; lint standby-host-ram)
    # What a sleeping stack keeps on the GPU (its context and graph pool), when known: vLLM logs it as
    # "Sleep mode freed X GiB memory, Y GiB memory is still in use." (gpu_worker.py:178, 0.21.0).
    keep_gib: float | None = Field(default=None, gt=0)
    # At most this many revisions asleep beside the live one; a switch past it stops the oldest.
    count: int = Field(default=1, ge=1, le=8)

    @model_validator(mode="before")
    @classmethod
    def _short(cls, v: Any) -> Any:
        # `standby: sleep` / `standby: off` stand for {mode: ...}; YAML 1.1 reads a bare off as false.
        if v is False or v == "off":
            return {"mode": "off"}
        if v == "sleep":
            return {"mode": "sleep"}
        if v is True or isinstance(v, str):
            raise invalid(f"standby {v!r} is not a mode", "write standby: sleep or standby: off")
        return v

    @property
    def sleeps(self) -> bool:
        return self.mode == "sleep"


class LintSettings(Strict):
    # rule id -> why this stack may ignore it; lint prints each every time it runs
    ignore: dict[str, str] = Field(default_factory=dict)

    @field_validator("ignore")
    @classmethod
    def _why(cls, v: dict[str, str]) -> dict[str, str]:
        for rule_id, why in v.items():
            if not re.match(r"^[a-z0-9][a-z0-9-]*$", rule_id):
                raise invalid(f"lint.ignore names {rule_id!r}, not a rule id",
                              "use an id from `b70deploy lint`'s output")
            if not why.strip() or any(c in why for c in "\n\r\x00"):
                raise invalid(f"lint.ignore.{rule_id} gives no reason", "say in one line why the rule does not apply")
        return v


class HostMount(Strict):
    """A host path the vllm container sees read-only at `target`: a runtime the image expects
    at a fixed path (the real-vLLM lane's venv), a cache, a corrected file."""

    source: str
    target: str
    # The operator's read-write bind stays read-write (a cache vLLM writes to); a stack's own
    # mounts are read-only unless it says so.
    read_only: bool = True

    @field_validator("source", "target")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not ABS_PATH_RE.match(v) or v == "/":
            raise invalid(f"{v!r} is not an absolute path", "give a full path such as /opt/venv, without '..'")
        return v


class ModelSpec(Strict):
    path: str = Field(description="weights folder, relative to the node's models_dir (hub: the ORG/NAME id)")
    quantization: Literal["gptq", "compressed-tensors", "awq", "fp8", "none"] = "none"
    # None: not stated; lint's rules that depend on it do not guess (a dense model was linted as moe: issue 39).
    architecture: Literal["dense", "moe", "hybrid-moe"] | None = None
    # The path is a Hugging Face hub id, loaded from the node's hf_cache (config/hub.py).
    hub: bool = False

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return _rel_path(v, "model.path")

    @model_validator(mode="after")
    def _hub_id(self) -> ModelSpec:
        if self.hub and not HUB_ID_RE.match(self.path):
            raise invalid(f"model.path {self.path!r} is not a hub id", "write ORG/NAME, e.g. Qwen/Qwen3-0.6B")
        return self


class Speculative(Strict):
    method: Literal["ngram", "eagle", "eagle3", "suffix", "mtp"]
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64)
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=64)
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=64)
    model: str | None = Field(default=None, description="draft folder below models_dir")
    # The post's EAGLE-3 fix: serve a copy of the draft whose config.json allows this many
    # positions (acceptance is zero past the draft's own max_position_embeddings).
    draft_max_position_embeddings: int | None = Field(default=None, ge=1, le=MAX_CONTEXT)
    tuning: dict[str, int | float | str | bool] = Field(default_factory=dict)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        return None if v is None else _rel_path(v, "speculative.model")

    @model_validator(mode="after")
    def _consistent(self) -> Speculative:
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise invalid(
                f"prompt_lookup_min ({lo}) is greater than prompt_lookup_max ({hi})",
                "make prompt_lookup_min <= prompt_lookup_max",
            )
        if self.method == "ngram":
            if self.num_speculative_tokens is None:
                raise invalid("ngram needs num_speculative_tokens", "add e.g. num_speculative_tokens: 5")
            if self.model is not None:
                raise invalid("ngram takes no draft model", "remove speculative.model")
        if self.method in ("eagle", "eagle3") and self.model is None:
            raise invalid(f"{self.method} needs a draft model", "add speculative.model: <draft folder>")
        if self.method != "ngram" and (lo is not None or hi is not None):
            raise invalid(
                f"prompt_lookup_min/max only apply to ngram, not {self.method}",
                "remove them or set method: ngram",
            )
        return self


class ToolCalling(Strict):
    parser: str | None = None
    auto_tool_choice: bool = False

    @model_validator(mode="after")
    def _parser_needed(self) -> ToolCalling:
        if self.auto_tool_choice and not self.parser:
            raise invalid(
                "auto_tool_choice is on but no parser is set (vLLM refuses to start)",
                "add tool_calling.parser: hermes, or set auto_tool_choice: false",
            )
        return self


class Expect(Strict):
    """Facts the boot log must show; a silent fallback fails the switch."""

    attention_backend: str | None = None
    kv_cache_dtype: str | None = None
    moe_method: str | None = None
    flash_attn_version: int | None = Field(default=None, ge=1, le=9)
    min_kv_tokens: int | None = Field(default=None, ge=1)


class CompletionSmoke(Strict):
    prompt: str = Field(min_length=1)
    expect: str = Field(min_length=1)
    max_tokens: int = Field(default=8, ge=1, le=4096)


class Smoke(Strict):
    completion: CompletionSmoke | None = None
    tool_call: bool = False
    aliases: bool = True
    # A short free-form generation judged by docker/garbage.py (no expected answer): off unless
    # asked for, since a stack of random test weights is noise by design.
    coherence: bool = False


class Stack(Strict):
    name: str
    description: str = ""
    extends: str | None = None
    image: str
    entrypoint_style: Literal["bash-c", "vllm-serve"] = "bash-c"
    model: ModelSpec
    # Which model this is, for the node's production aliases: only a stack of the node's
    # production family may serve them (lint warns otherwise), so clients asking for the
    # production model never silently get another one.
    model_family: str | None = None
    # None: no --served-model-name, and vLLM serves under the model argument (its default).
    served_model_names: list[str] | None = Field(default=None, min_length=1)
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    # None: no --max-model-len, and vLLM derives it from the model's config.json.
    max_model_len: int | None = Field(default=None, ge=256, le=MAX_CONTEXT)
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    # "default": neither flag, vLLM's own default (on in V1), as a command that never said it had it.
    # (A catalogue file's null means "inherit", so the unsaid case needs a word of its own.)
    prefix_caching: bool | Literal["default"] = True
    enforce_eager: bool = False

    @field_validator("prefix_caching", mode="before")
    @classmethod
    def _prefix_caching(cls, v: object) -> object:
        # One error for the union, not one per member (bool, then the literal).
        if isinstance(v, bool) or v == "default":
            return v
        raise invalid(f"{v!r} is neither true, false nor default", "write true, false or default")
    attention_backend: str | None = None
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536)
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=MAX_CONTEXT)
    tool_calling: ToolCalling = ToolCalling()
    speculative: Speculative | None = None
    extra_args: list[str] = Field(default_factory=list)
    # vLLM asks every /v1 request for a key (the operator's --api-key): it reads VLLM_API_KEY from the
    # node's secrets_env_file (never the stack file, which is printed); lint refuses the stack without it.
    api_key: bool = False
    # The port vLLM listens on in its container (--port): the operator's, which their healthcheck
    # and companions' URLs name; the node's ports publish it.
    container_port: int = Field(default=8000, ge=1, le=65535)
    # The address vLLM listens on in its container (--host), as the operator wrote it. None renders
    # no flag: vLLM then binds every IPv4 interface, as --host 0.0.0.0 does (vLLM 0.24.0
    # entrypoints/openai/cli_args.py:228 `host: str | None = None`; api_server.py:540
    # `sock_addr = (args.host or "", args.port)`), which the published port reaches.
    host: str | None = None
    # Further ports the service publishes, as Compose's short syntax ("9400:9400"), kept as written.
    extra_ports: list[str] = Field(default_factory=list)
    # Shell run before the server, verbatim: the command becomes `bash -c "PRELUDE && exec vllm
    # serve ..."` (the report's old stack imported its TurboQuant registration this way). A
    # prelude that ends in `;` or a line break is followed by the server directly (a script of lines).
    prelude: str | None = None
    # The shell that runs the command as a script, as the compose file wrote it (`bash -lc`: a
    # login shell that reads /etc/profile): none is `bash -c` when there is a prelude.
    shell: list[str] | None = None
    # The program instead of `vllm serve`: [python3, -m, vllm.entrypoints.openai.api_server].
    launcher: list[str] | None = None
    # Compose keys of the vllm service no stack key covers (ulimits, healthcheck, cap_add, ...),
    # merged in by render/passthrough.py; the keys b70deploy renders itself are refused there.
    compose: VllmCompose = Field(default_factory=dict)
    env: EnvMap = Field(default_factory=dict)
    mounts: list[HostMount] = Field(default_factory=list)
    # The weights bind's mode for this stack (none: the node's models_read_only).
    models_read_only: bool | None = None
    # A companion's per-stack file (a LiteLLM router config that names this stack's served model):
    # its name under the deploy dir's companions/ -> its text. Render writes it with the stack's
    # files; the companion binds it (node config companions[].volumes) and reads it when restore
    # starts it again, so a switch between variants keeps the router right.
    companion_files: dict[str, str] = Field(default_factory=dict)
    patches: list[str] = Field(default_factory=list)
    expect: Expect = Expect()
    # After /health first answers 200, the stack must stay healthy this long before its
    # checks run: an engine that dies right after ready fails the switch.
    settle_seconds: float = Field(default=5.0, ge=0, le=600)
    # `watch`: how long after its switch a failure of this stack still rolls back by itself
    # (none: the node's watch.bake_seconds).
    bake_seconds: float | None = Field(default=None, ge=0, le=7 * 86400)
    smoke: Smoke = Smoke()
    notes: list[str] = Field(default_factory=list)
    # The GPUs this stack takes on its node (none: the node's `gpus:`).
    gpus: GpuSelection | None = None
    lint: LintSettings = LintSettings()
    # Hot standby for this stack (none: the node's `standby:`).
    standby: Standby | None = None

    @field_validator("host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z0-9.:_\[\]-]*$", v):
            raise invalid(f"host {v!r} is not an address vLLM can listen on", "write e.g. 0.0.0.0, or leave host out")
        return v

    @field_validator("companion_files")
    @classmethod
    def _companion_files(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            parts = name.split("/")
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", name) or ".." in parts or name.endswith("/"):
                raise invalid(f"companion file {name!r} is not a file name under companions/",
                              "name it relative to the deploy dir's companions/ folder, e.g. litellm/config.yaml")
        return v

    @field_validator("name", "extends")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.match(v):
            raise invalid(f"{v!r} is not a valid stack name", "use [a-z0-9][a-z0-9._-]*")
        return v

    @field_validator("model_family")
    @classmethod
    def _family(cls, v: str | None) -> str | None:
        if v is not None and not ALIAS_RE.match(v):
            raise invalid(f"model_family {v!r} is not a plain name", "use e.g. qwen3-30b-a3b")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not IMAGE_RE.match(v):
            raise invalid(f"{v!r} is not an image reference", "use e.g. intel/vllm:latest")
        return v

    @field_validator("served_model_names")
    @classmethod
    def _aliases(cls, v: list[str] | None) -> list[str] | None:
        for alias in v or []:
            if not ALIAS_RE.match(alias):
                raise invalid(f"alias {alias!r} has characters vLLM clients choke on",
                            "use letters, digits and . _ : / -")
        if v is not None and len(set(v)) != len(v):
            raise invalid("an alias is listed twice", "list each served model name once")
        return v

    @field_validator("kv_cache_dtype", "attention_backend")
    @classmethod
    def _token(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z0-9_]+$", v):
            raise invalid(f"{v!r} is not a single word", "use e.g. fp8 or FLASH_ATTN")
        return v

    @field_validator("prelude")
    @classmethod
    def _prelude(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c in v for c in "\r\x00")):
            raise invalid("prelude is empty or has a carriage return or NUL", "shell lines, e.g. python3 -c 'import x'")
        return v

    @field_validator("shell")
    @classmethod
    def _shell(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (len(v) != 2 or v[0].rsplit("/", 1)[-1] not in ("bash", "sh")
                              or not re.match(r"^-[a-z]*c[a-z]*$", v[1])):
            raise invalid(f"shell {v!r} is not a shell and its -c option", "write e.g. [bash, -lc] or [/bin/sh, -c]")
        return v

    @field_validator("launcher")
    @classmethod
    def _launcher(cls, v: list[str] | None) -> list[str] | None:
        # The one launcher whose arguments are vllm serve's (render/vllm_args.split_launcher).
        if v is not None and (not re.match(r"^(/[\w./-]+/)?python[0-9.]*$", v[0] if v else "")
                              or v[1:] not in (["-m", "vllm.entrypoints.openai.api_server"],
                                               ["-m", "vllm.entrypoints.cli.main", "serve"])):
            raise invalid(f"launcher {v!r} is not python -m vllm.entrypoints.openai.api_server (or "
                          "vllm.entrypoints.cli.main serve)",
                          "write [python3, -m, vllm.entrypoints.openai.api_server], or drop launcher for vllm serve")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for arg in v:
            if any(c in arg for c in "\n\r\x00"):
                raise invalid("an extra_args entry has a newline", "one flag or value per entry")
        return v

    @field_validator("patches")
    @classmethod
    def _patches(cls, v: list[str]) -> list[str]:
        for p in v:
            if not NAME_RE.match(p):
                raise invalid(f"patch name {p!r} is not valid", "name a file in patches/ without .yaml")
        return v

    @field_validator("speculative", mode="before")
    @classmethod
    def _spec_json(cls, v: Any) -> Any:
        # The post writes --speculative-config as JSON; accept that form verbatim.
        if isinstance(v, str):
            try:
                v = json.loads(v, parse_int=_json_int)
            except json.JSONDecodeError as e:
                raise invalid(f"speculative is not valid JSON ({e.msg} at column {e.colno})",
                            "write it as a YAML mapping or valid JSON") from None
            except _LongNumber as e:
                raise invalid(f"speculative JSON: {e}", "write a number of at most 32 digits") from None
            except RecursionError:
                raise invalid("speculative JSON nests too deep", 'write a flat {"method": ...}') from None
            if not isinstance(v, dict):
                raise invalid("speculative JSON is not an object", 'write {"method": ...}')
        return v

    @model_validator(mode="after")
    def _whole(self) -> Stack:
        if self.max_num_batched_tokens is not None and self.max_num_seqs is not None \
                and self.max_num_batched_tokens < self.max_num_seqs:
            raise invalid("max_num_batched_tokens is below max_num_seqs",
                        "raise max_num_batched_tokens")
        return self

    @property
    def aliases(self) -> list[str]:
        """The names the stack states; empty when vLLM serves under the model argument."""
        return list(self.served_model_names or [])


# ---------------------------------------------------------------- node config


class Ports(Strict):
    prod: int = Field(default=8000, ge=1, le=65535)
    dark: int = Field(default=8001, ge=1, le=65535)
    # Hot standby's slots publish vllm on loopback ports from this range, [first, last] (a firewall
    # or another service may own the rest); none: a port the kernel picks (docker/standby.py).
    standby: list[int] | None = None

    @model_validator(mode="after")
    def _distinct(self) -> Ports:
        if self.prod == self.dark:
            raise invalid("prod and dark ports are the same", "give the dark port its own number")
        if self.standby is not None:
            first, last = [*self.standby, 0, 0][:2]
            if len(self.standby) != 2 or not 1 <= first <= last <= 65535:
                raise invalid(f"ports.standby {list(self.standby)} is not a range of ports",
                              "write ports.standby: [FIRST, LAST], 1 <= FIRST <= LAST <= 65535")
            if first <= self.prod <= last or first <= self.dark <= last:
                raise invalid(f"ports.standby {list(self.standby)} holds the prod or dark port",
                              "give the standby slots a range of their own")
        return self


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class Door(Strict):
    """The front door (render/door.py): a proxy in the project that publishes the node's port,
    holds requests while no stack is live (up to `hold_seconds`, then 503 with Retry-After)
    and is switched by the deploy. Off without a `door:` key; a `door:` key is on unless it says
    `enabled: false` (`door: {}` is the door with its defaults)."""

    enabled: bool = False

    @model_validator(mode="before")
    @classmethod
    def _present(cls, v: Any) -> Any:
        if v is None:  # a bare `door:` is `door: {}`
            return {"enabled": True}
        return {"enabled": True, **v} if isinstance(v, dict) else v

    image: str | None = None            # None: the image `b70deploy door --build` makes (Caddy, no registry)
    hold_seconds: float = Field(default=180.0, gt=0, le=3600)
    retry_after: int = Field(default=30, ge=1, le=86400)
    # vllm's own port for the tool's probes while the door has the node's: loopback only.
    probe_port: int = Field(default=8002, ge=1, le=65535)
    # The network between the door (on the host's) and vllm, which has a fixed address there; None: a /29
    # render/door.py picks by the project's name. Set it when the engine says the pool overlaps another.
    subnet: str | None = None

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            net = ipaddress.IPv4Network(v)
        except ValueError:
            raise invalid(f"door.subnet {v!r} is not an IPv4 network", "e.g. 198.19.7.0/29") from None
        if net.prefixlen > 29:
            raise invalid(f"door.subnet {v} is too small: the engine's gateway and vllm need a /29 or larger",
                          "e.g. 198.19.7.0/29")
        return str(net)

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not IMAGE_RE.match(v):
            raise invalid(f"door.image {v!r} is not an image reference",
                          "e.g. b70deploy/door:caddy-2.11.7 (`b70deploy door --build` makes it)")
        return v


class Timeouts(Strict):
    health: float = Field(default=720.0, gt=0, le=86400)
    rollback: float = Field(default=720.0, gt=0, le=86400)
    restore: float = Field(default=720.0, gt=0, le=86400)
    poll_interval: float = Field(default=2.0, gt=0, le=60)
    stall: float = Field(default=600.0, gt=0, le=86400)
    smoke: float = Field(default=120.0, gt=0, le=3600)


# Docker's own rule for a volume name (the engine refuses others).
VOLUME_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")


class CompanionVolume(Strict):
    """A companion's data: a named volume, created by Compose under exactly this name (no
    project prefix: renaming the project must not orphan open-webui's data), or a bind of an
    absolute host path. The tool never removes either (no `down -v`)."""

    source: str
    target: str
    read_only: bool = False

    @model_validator(mode="before")
    @classmethod
    def _short_syntax(cls, v: Any) -> Any:
        """`SOURCE:TARGET[:ro|rw]`, as in a compose file."""
        if not isinstance(v, str):
            return v
        parts = v.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise invalid(f"volume {v!r} is not SOURCE:TARGET[:ro]",
                          "write e.g. open-webui:/app/backend/data or /srv/webui:/data:ro")
        return {"source": parts[0], "target": parts[1], "read_only": parts[2:] == ["ro"]}

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if not (v.startswith("/") or VOLUME_NAME_RE.match(v)) or ":" in v:
            raise invalid(f"volume source {v!r} is neither a volume name nor an absolute host path",
                          "use a name of letters, digits, '_', '.', '-' (a named volume) or /a/host/path (a bind)")
        return v

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        if not v.startswith("/") or ":" in v:
            raise invalid(f"volume target {v!r} is not an absolute path in the container", "e.g. /app/backend/data")
        return v

    @property
    def is_bind(self) -> bool:
        return self.source.startswith("/")


class Companion(Strict):
    """A service sharing the compose project (the post's open-webui)."""

    name: str
    image: str
    command: list[str] | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    container_port: int | None = Field(default=None, ge=1, le=65535)
    environment: EnvMap = Field(default_factory=dict)  # keys become unquoted YAML keys in the compose file
    # Keys of environment that hold a secret whatever their name (a value init found in an env
    # file or .env the operator marked secret): rendered into the companion's 0600 env file.
    secrets: list[str] = Field(default_factory=list)
    # The values of the ${VAR}s its environment names, as the project's .env gave them to Compose
    # when init read the node: the rendered .env carries them, so the references resolve after a
    # switch as they did by hand. Listed in `secrets` where they hold one: masked in every output.
    variables: EnvMap = Field(default_factory=dict)
    volumes: list[CompanionVolume] = Field(default_factory=list)
    # The hand-made service's own (clients and scripts may reach it by that name): a switch keeps it.
    container_name: str | None = None
    # Compose keys no companion key covers (depends_on the vllm service's healthcheck, networks,
    # healthcheck, security_opt, ...), merged in by render/passthrough.py.
    compose: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v) or v == "vllm":
            raise invalid(f"companion name {v!r} is not allowed",
                        "use [a-z0-9][a-z0-9._-]* and not 'vllm'")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        return Stack._image(v)

    @field_validator("compose")
    @classmethod
    def _compose(cls, v: dict[str, Any]) -> dict[str, Any]:
        problem = check_keys(v, COMPANION_OWNED)
        if problem is not None:
            raise invalid(*problem)
        return v

    @model_validator(mode="after")
    def _secrets(self) -> Companion:
        unknown = [k for k in self.secrets if k not in self.environment and k not in self.variables]
        if unknown:
            raise invalid(f"companion {self.name}: secrets names {', '.join(unknown)}, not in its environment "
                          "or variables", "list only keys of the companion's environment or variables")
        return self

    @field_validator("container_name")
    @classmethod
    def _container_name(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$", v):
            raise invalid(f"container_name {v!r} is not a container name", "letters, digits, '_', '.', '-'")
        return v


class Watch(Strict):
    """`b70deploy watch`: how often it looks, what counts as a failure, and the bake window
    after a switch inside which a failure rolls back by itself (after it: an alert only)."""

    bake_seconds: float = Field(default=900.0, ge=0, le=7 * 86400)
    interval: float = Field(default=10.0, gt=0, le=3600)        # seconds between looks
    smoke_every: float = Field(default=60.0, gt=0, le=86400)    # seconds between smoke requests
    unhealthy_looks: int = Field(default=3, ge=1, le=1000)      # looks in a row with /health not 200
    restart_loop: int = Field(default=3, ge=1, le=1000)         # restarts within restart_window
    restart_window: float = Field(default=600.0, gt=0, le=86400)
    max_error_rate: float = Field(default=0.5, gt=0, le=1)      # errored / finished requests between looks
    min_requests: int = Field(default=10, ge=1, le=1_000_000)   # fewer finished requests say nothing


class Notify(Strict):
    """Who is told about switches, rollbacks and watch alerts: webhooks (a JSON POST) and/or a
    command (argv, the event as JSON on stdin). Fail-open: a receiver that fails or hangs costs a
    command at most `timeout` seconds, and the failure goes to the audit log."""

    webhooks: list[str] = Field(default_factory=list)
    command: list[str] | None = Field(default=None, min_length=1)
    timeout: float = Field(default=5.0, gt=0, le=300)
    retries: int = Field(default=2, ge=0, le=10)

    @field_validator("webhooks")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not re.match(r"^https?://[^\s/]+(/\S*)?$", url):
                raise invalid("a webhook is not an http(s) URL", "write e.g. https://hooks.example.com/b70")
        return v

    @field_validator("command")
    @classmethod
    def _argv(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v[0] or any("\x00" in a for a in v)):
            raise invalid("notify.command needs a program as its first entry", "write e.g. [/usr/local/bin/page, ops]")
        return v


class Production(Strict):
    """The aliases clients use for production, and the model family allowed to serve them (the
    report kept the 30B behind both names through every migration)."""

    model_family: str = "qwen3-30b-a3b"
    aliases: list[str] = Field(default_factory=lambda: ["qwen3-30b-tq-256k", "qwen3-30b-a3b-w4a16"])

    @field_validator("model_family")
    @classmethod
    def _family(cls, v: str) -> str:
        return Stack._family(v) or v

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, v: list[str]) -> list[str]:
        Stack._aliases(v)
        return v


class NodeConfig(Strict):
    project: str = "b70"
    # The vLLM service's name in the compose files: a hand-made project's own (vllm-server, the
    # model's name), so clients and proxies on the project network reach it by the same name.
    service: str = "vllm"
    deploy_dir: str | None = None
    state_dir: str | None = None
    stacks_dir: str | None = None
    patches_dir: str | None = None
    models_dir: str = "/models"   # the host folder of the weights bind (stacks' model paths are below it)
    # Its path inside the container: the report's node binds /llms:/llms, not /models.
    models_target: str = "/models"
    # The weights bind's mode: the hand-made deployment's (init writes false for OPEA's ./data:/data,
    # read-write); a node that never said binds it read-only.
    models_read_only: bool = True
    device_dir: str | None = "/dev/dri"
    # HF_HOME on the host (it holds hub/models--ORG--NAME): the container's for a stack whose
    # model is a hub id (model.hub), bound read-write so vLLM finds the weights there.
    hf_cache: str | None = None
    # Its path in the container, which render sets HF_HOME to: the operator's (HF_HOME=/hf with
    # ./hf:/hf), the hub client's default for root otherwise.
    hf_cache_target: str = CONTAINER_HF_HOME
    # The hub folder's path below hf_cache: HF_HOME's `hub`, unless the operator's HF_HUB_CACHE names
    # another (huggingface_hub reads it whatever its name: config/hub.py), "." when hf_cache is it.
    hf_hub_folder: str = HUB_FOLDER
    # Or a named volume that is HF_HOME (louislepage's huggingface-cache:/root/.cache/huggingface):
    # the engine's name of it, mounted at hf_cache_target as the operator had it.
    hf_cache_volume: str | None = None
    gids: dict[str, int] | None = None
    # Which GPUs the node has (render/gpu.py, docs/platforms.md): xpu is the report's B70 node.
    platform: Literal["cuda", "rocm", "xpu", "cpu"] = "xpu"
    gpus: GpuSelection = "all"
    nvidia_cdi: bool = False            # cuda: CDI names in devices: instead of a device request
    kfd_device: str = "/dev/kfd"        # rocm: the compute node beside device_dir
    bind_address: str = "0.0.0.0"
    ports: Ports = Ports()
    door: Door = Door(enabled=False)  # no `door:` key: off (a key present is on, Door says)
    # Hot standby (issue 24): the live stack sleeps instead of stopping at a switch. Its routes are
    # vLLM's development endpoints, so only with the door, which refuses them to clients.
    standby: Standby = Standby()
    # The device's memory in GiB, for the standby memory rule (lint standby-memory); none: not checked.
    gpu_memory_gib: float | None = Field(default=None, gt=0)
    companions: list[Companion] = Field(default_factory=list)
    # The project's top-level networks, as Compose writes them (an address pool for a static
    # ipv4_address a stack's compose: gives the vllm service; an external proxy network).
    networks: dict[str, Any] = Field(default_factory=dict)
    # The vllm service's node-wide Compose keys (security_opt, cap_add, ipc, shm_size, ulimits,
    # runtime, devices, group_add, networks) as the hand-made deployment had them (init writes them):
    # every rendered stack has them, under its own compose: keys.
    compose: VllmCompose = Field(default_factory=dict)
    # The operator's .env values that the vllm service's compose: keys name (`${API_USERS}` in a
    # Traefik label; init moves a secret label written inline there too): the rendered .env (0600)
    # carries them, so the references resolve after a switch as they did by hand.
    variables: EnvMap = Field(default_factory=dict)
    # The project as Compose ran it: its compose files in the deploy dir, in -f order, and the
    # profiles its running services are in (init reads both from the running containers).
    compose_files: list[str] = Field(default_factory=lambda: ["docker-compose.yml"], min_length=1)
    profiles: list[str] = Field(default_factory=lambda: ["gpu"])
    feeders: list[str] = Field(default_factory=list)
    load_threshold: float | None = Field(default=None, gt=0, le=1024)  # None: the core count (verify.load_bound)
    timeouts: Timeouts = Timeouts()
    secrets_env_file: str | None = None
    # Variables of the deploy dir's .env that hold a secret although their names do not say so: a
    # value of an env file the operator marked (0600) that the compose files interpolate outside any
    # environment, e.g. into a Traefik basic-auth label (init finds them). Masked in every output.
    secret_variables: list[str] = Field(default_factory=list)
    image_map: dict[str, str] = Field(default_factory=dict)
    stack_overlay: dict[str, Any] = Field(default_factory=dict)
    peak_concurrency: int | None = Field(default=None, ge=1, le=100000)
    kv_memory_gib: float | None = Field(default=None, gt=0)
    production: Production = Production()
    shm_size: str = "16g"
    keep_revisions: int = Field(default=20, ge=1, le=100000)
    watch: Watch = Watch()
    notify: Notify = Notify()
    # Warm boots (state/caches.py): compile/kernel caches per image id, under cache_dir
    # (default <state_dir>/caches), least recently used image's evicted over cache_max_gib.
    cache_dir: str | None = None
    cache_max_gib: float = Field(default=50.0, gt=0, le=100000)
    # Where the node's Docker Engine is: none means the local default (DOCKER_HOST or the
    # socket); Docker's own transport (ssh, tcp+TLS, unix) does the remote work.
    docker_host: str | None = None
    docker_context: str | None = None
    tls_dir: str | None = None          # ca.pem, cert.pem, key.pem for a tcp:// endpoint
    address: str = "127.0.0.1"          # host at which /health and smoke reach the node's ports
    # The inventory: one entry per node, each a set of overrides of the keys above.
    nodes: dict[str, dict[str, Any]] | None = None

    @field_validator("compose_files")
    @classmethod
    def _compose_files(cls, v: list[str]) -> list[str]:
        for name in v:
            if name.startswith("/") or ".." in name.split("/") or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", name):
                raise invalid(f"compose file {name!r} is not a file name in the deploy dir",
                              "name it relative to deploy_dir, e.g. docker-compose.override.yml")
        if len(set(v)) != len(v):
            raise invalid("compose_files names a file twice", "list each compose file once, in -f order")
        return v

    @field_validator("secret_variables")
    @classmethod
    def _secret_variables(cls, v: list[str]) -> list[str]:
        for name in v:
            if not ENV_KEY_RE.match(name):
                raise invalid(f"secret_variables: {name!r} is not a variable name", "list .env names, e.g. AUTH_USERS")
        return v

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.match(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$", name):
                raise invalid(f"profile {name!r} is not a Compose profile name", "letters, digits, '_', '.', '-'")
        return v

    @field_validator("hf_cache")
    @classmethod
    def _hf_cache(cls, v: str | None) -> str | None:
        if v is not None and (not ABS_PATH_RE.match(v) or v.rstrip("/") == ""):
            raise invalid(f"hf_cache {v!r} is not an absolute host path",
                          "give the host folder that is HF_HOME, e.g. /srv/hf (it holds hub/models--ORG--NAME)")
        return v

    @field_validator("hf_hub_folder")
    @classmethod
    def _hf_hub_folder(cls, v: str) -> str:
        if v != "." and (not re.match(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", v) or ".." in v.split("/")
                         or "." in v.split("/")):
            raise invalid(f"hf_hub_folder {v!r} is not a folder below hf_cache",
                          "give its path below hf_cache: hub (HF_HOME's), another (models), or . (hf_cache itself)")
        return v

    @field_validator("hf_cache_volume")
    @classmethod
    def _hf_cache_volume(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not VOLUME_NAME_RE.match(v):
            raise invalid(f"hf_cache_volume {v!r} is not a volume name", "the name `docker volume ls` shows")
        if v is not None and info.data.get("hf_cache"):
            raise invalid("hf_cache and hf_cache_volume both say where HF_HOME is", "keep one of them")
        return v

    @field_validator("hf_cache_target")
    @classmethod
    def _hf_cache_target(cls, v: str) -> str:
        if not ABS_PATH_RE.match(v) or v.rstrip("/") == "":
            raise invalid(f"hf_cache_target {v!r} is not an absolute path in the container",
                          "e.g. /root/.cache/huggingface (the container's HF_HOME)")
        return v.rstrip("/")

    @field_validator("models_target")
    @classmethod
    def _models_target(cls, v: str) -> str:
        if not ABS_PATH_RE.match(v) or v.rstrip("/") == "":
            raise invalid(f"models_target {v!r} is not an absolute path in the container", "e.g. /models or /llms")
        return v.rstrip("/")

    @field_validator("docker_host")
    @classmethod
    def _docker_host(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not re.match(r"^(unix:///\S+|ssh://[^\s/@]+@?[^\s/]*|tcp://[^\s/:]+:\d{1,5}|npipe://\S+)$", v):
            raise invalid(f"docker_host {v!r} is not a Docker endpoint",
                        "use ssh://user@host, tcp://host:2376 (with tls_dir) or unix:///path/docker.sock")
        return v

    @field_validator("docker_context")
    @classmethod
    def _docker_context(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[a-zA-Z0-9][a-zA-Z0-9_.+-]*$", v):
            raise invalid(f"docker_context {v!r} is not a context name", "give a name from `docker context ls`")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9.:-]*$", v) or v.startswith("-"):
            raise invalid(f"address {v!r} is not a host name or IP address", "use e.g. 192.168.0.61 or gpu1.lan")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
        if v is None:
            return v
        if not v:
            raise invalid("nodes is empty", "name at least one node, or remove the nodes key")
        for name, entry in v.items():
            if not NAME_RE.match(name) or len(name) > 63 or ".." in name:
                raise invalid(f"node name {name!r} is not allowed", "use [a-z0-9][a-z0-9._-]*, at most 63 characters")
            if "nodes" in entry:
                raise invalid(f"node {name} has its own nodes key", "inventories do not nest; remove it")
        return v

    @model_validator(mode="after")
    def _endpoint(self) -> NodeConfig:
        if self.docker_host and self.docker_context:
            raise invalid("both docker_host and docker_context are set", "give one of them")
        if self.docker_host and self.docker_host.startswith("tcp://") and not self.tls_dir:
            raise invalid(f"docker_host {self.docker_host} has no tls_dir",
                        "give tls_dir with ca.pem, cert.pem and key.pem (a plain tcp:// engine is root for anyone)")
        if self.tls_dir and not (self.docker_host or "").startswith("tcp://"):
            raise invalid("tls_dir is set but docker_host is not tcp://", "remove tls_dir or use tcp://host:2376")
        return self

    @field_validator("project")
    @classmethod
    def _project(cls, v: str) -> str:
        if not re.match(r"^[a-z0-9][a-z0-9_-]*$", v):
            raise invalid(f"project {v!r} is not a compose project name",
                        "use lowercase letters, digits, '_' and '-'")
        return v

    @field_validator("gids")
    @classmethod
    def _gids(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        for name, gid in (v or {}).items():
            if not 0 <= gid < 2**31:
                raise invalid(f"gid for {name} is out of range", "give the numeric gid, e.g. 992")
        return v

    @field_validator("bind_address")
    @classmethod
    def _bind(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise invalid(f"bind_address {v!r} is not an IP address",
                        "use 0.0.0.0 or 127.0.0.1") from None
        return v

    @field_validator("feeders")
    @classmethod
    def _feeders(cls, v: list[str]) -> list[str]:
        for addr in v:
            try:
                ipaddress.ip_address(addr)
            except ValueError:
                raise invalid(f"feeder {addr!r} is not an IP address",
                            "list the addresses that send traffic, e.g. 192.168.0.62") from None
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str) -> str:
        if not re.match(r"^\d+[bkmg]?$", v):
            raise invalid(f"shm_size {v!r} is not a size", "use e.g. 16g")
        return v

    @field_validator("service")
    @classmethod
    def _service(cls, v: str) -> str:
        if not SERVICE_RE.match(v):
            raise invalid(f"service {v!r} is not a compose service name",
                          "use [a-zA-Z0-9][a-zA-Z0-9._-]*, e.g. vllm-server")
        return v

    @field_validator("standby")
    @classmethod
    def _standby_door(cls, v: Standby, info: ValidationInfo) -> Standby:
        door = info.data.get("door")
        if v.sleeps and isinstance(door, Door) and not door.enabled:
            raise invalid(NO_DOOR, "set door.enabled: true, or standby: off")
        return v

    @model_validator(mode="after")
    def _door_port(self) -> NodeConfig:
        if self.door.enabled and self.door.probe_port in (self.ports.prod, self.ports.dark):
            raise invalid(f"door.probe_port {self.door.probe_port} is the prod or dark port",
                          "give vllm's loopback probe port its own number, e.g. 8002")
        if self.door.enabled and not _loopback(self.address):
            # vllm's probe port is published on the node's 127.0.0.1 only (render/door.py).
            raise invalid(f"door.enabled with address {self.address}: the tool's probes of vllm reach only "
                          "127.0.0.1 on the node", "run b70deploy on the node with address: 127.0.0.1, or keep "
                          "the door off for this node")
        return self

    @model_validator(mode="after")
    def _companions_unique(self) -> NodeConfig:
        names = [c.name for c in self.companions]
        if len(set(names)) != len(names):
            raise invalid("two companions share a name", "give each companion its own name")
        if self.service in names:
            raise invalid(f"a companion is named {self.service}, the vLLM service", "give the companion another name")
        return self
