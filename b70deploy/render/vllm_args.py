"""The `vllm serve` argument list for a stack, and back (pure: no files, no Docker).

One table, FLAGS, says which stack key becomes which flag; `serve_flags` reads it to render a
stack, `parse_serve_args` reads it to turn a hand-written command back into stack keys.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config.schema import Stack

CONTAINER_PORT = 8000
CONTAINER_MODELS = "/models"
MODEL_REF = "${VLLM_MODEL}"  # interpolated by Compose from .env (the post's pitfall 2)
SPEC_FLAG = "--speculative-config"
UNSAID = "default"  # a toggle the command never set (prefix_caching: default): vLLM's default, no flag
MODEL_FLAG = "--model"
_NUMBER = re.compile(r"^-\d")
_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kmgtKMGT]?)$")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

Kind = Literal["names", "fixed", "value", "toggle", "switch", "speculative"]


def human_int(text: str) -> int:
    """A token count as vLLM reads --max-model-len (vllm/engine/arg_utils.py, human_readable_int):
    an integer, 25.6k / 1m (x1000 steps), or 16K / 1M (x1024 steps, whole numbers only)."""
    m = _HUMAN_INT.match(text.strip())
    if not m:
        raise ValueError(f"not a token count: {text!r}")
    number, suffix = str(m.group(1)), str(m.group(2))
    if suffix.islower():
        return int(float(number) * _SCALE[suffix])
    if "." in number:
        raise ValueError(f"decimals only with k/m/g/t: {text!r}")
    return int(number) * _SCALE[suffix]


@dataclass(frozen=True)
class Flag:
    """One `vllm serve` flag and the stack key it renders from (dotted: tool_calling.parser).

    names: the flag then every value (nargs="+"); fixed: read into ParsedServe.fixed (host, port),
    rendered from the stack's own host and container_port;
    value: the flag and str(value), left out when None or `skip`; toggle: the flag when true,
    `off` when false; switch: the flag when true, nothing when false; speculative: the JSON.
    """

    flag: str
    kind: Kind
    key: str = ""
    skip: object = None
    off: str = ""
    parse: Callable[[str], Any] = str


FLAGS: tuple[Flag, ...] = (
    Flag("--served-model-name", "names", "served_model_names"),
    Flag("--host", "fixed"),
    Flag("--port", "fixed"),
    Flag("--dtype", "value", "dtype", skip="auto"),
    Flag("--max-model-len", "value", "max_model_len", parse=human_int),
    Flag("--kv-cache-dtype", "value", "kv_cache_dtype", skip="auto"),
    Flag("--gpu-memory-utilization", "value", "gpu_memory_utilization", parse=float),
    Flag("--enable-prefix-caching", "toggle", "prefix_caching", off="--no-enable-prefix-caching"),
    Flag("--enforce-eager", "switch", "enforce_eager"),
    Flag("--attention-backend", "value", "attention_backend"),
    Flag("--max-num-seqs", "value", "max_num_seqs", parse=int),
    Flag("--max-num-batched-tokens", "value", "max_num_batched_tokens", parse=int),
    Flag("--tool-call-parser", "value", "tool_calling.parser"),
    Flag("--enable-auto-tool-choice", "switch", "tool_calling.auto_tool_choice"),
    Flag(SPEC_FLAG, "speculative", "speculative"),
)


def container_model_path(rel: str, root: str = CONTAINER_MODELS) -> str:
    """A model folder below the models dir, as the container sees it (`root`: the node's models_target)."""
    return f"{root}/{rel}"


def model_argument(stack: Stack, root: str = CONTAINER_MODELS) -> str:
    """What vLLM is given as the model: the folder in the container, or a hub id as it is (vLLM
    resolves it in the hub cache)."""
    return stack.model.path if stack.model.hub else container_model_path(stack.model.path, root)


def model_rel_path(path: str, root: str = CONTAINER_MODELS) -> str | None:
    """The inverse of container_model_path: `rel` for ROOT/rel, else None."""
    prefix = f"{root}/"
    rel = path[len(prefix):].strip("/") if path.startswith(prefix) else ""
    return rel or None


def speculative_json(stack: Stack, *, draft_path: str | None = None, root: str = CONTAINER_MODELS) -> str | None:
    """The --speculative-config value: compact JSON with sorted keys, as the post wrote it."""
    spec = stack.speculative
    if spec is None:
        return None
    conf: dict[str, Any] = {"method": spec.method}
    if spec.num_speculative_tokens is not None:
        conf["num_speculative_tokens"] = spec.num_speculative_tokens
    if spec.prompt_lookup_min is not None:
        conf["prompt_lookup_min"] = spec.prompt_lookup_min
    if spec.prompt_lookup_max is not None:
        conf["prompt_lookup_max"] = spec.prompt_lookup_max
    if spec.model is not None:
        conf["model"] = draft_path or container_model_path(spec.model, root)
    conf.update(spec.tuning)
    return json.dumps(conf, sort_keys=True, separators=(",", ":"))


def _value(stack: Stack, key: str) -> Any:
    value: Any = stack
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def serve_flags(stack: Stack, *, draft_path: str | None = None, root: str = CONTAINER_MODELS) -> list[str]:
    """Every flag after the model argument: FLAGS in order, then extra_args verbatim."""
    args: list[str] = []
    for f in FLAGS:
        if f.flag == "--port":
            args += [f.flag, str(stack.container_port)]
        elif f.flag == "--host":  # only where the operator or the stack has it: vLLM's default binds the same
            args += [] if stack.host is None else [f.flag, stack.host]
        elif f.kind == "speculative":
            spec = speculative_json(stack, draft_path=draft_path, root=root)
            args += [] if spec is None else [f.flag, spec]
        else:
            value = _value(stack, f.key)
            if value is None or value == UNSAID:  # left to vLLM's own default: no flag
                continue
            if f.kind == "names":
                args += [f.flag, *value]
            elif f.kind == "toggle":
                args.append(f.flag if value else f.off)
            elif f.kind == "switch":
                args += [f.flag] if value else []
            elif value is not None and value != f.skip:
                args += [f.flag, _text(value)]
    return args + list(stack.extra_args)


def container_command(stack: Stack, *, model: str = MODEL_REF, draft_path: str | None = None,
                      root: str = CONTAINER_MODELS) -> list[str]:
    """The compose `command:` list, shaped by the image's entrypoint style.

    A `bash -c '... exec "$@"' --` entrypoint runs the command verbatim, so it must name the
    program; an `ENTRYPOINT ["vllm","serve"]` image takes the model and flags only. A stack's
    `launcher` (python3 -m vllm.entrypoints.openai.api_server) is the program instead of
    `vllm serve`, and takes the model as --model (the module's parser has no positional
    model: vllm/entrypoints/openai/api_server.py, its `__main__`); under a vllm-serve image
    render/files.py makes the launcher the entrypoint.
    """
    flags = serve_flags(stack, draft_path=draft_path, root=root)
    by_flag = stack.launcher is not None and stack.launcher[-1] == API_SERVER
    program, args = (list(stack.launcher or ["vllm", "serve"]), [MODEL_FLAG, model, *flags] if by_flag
                     else [model, *flags])
    if stack.prelude or stack.shell:  # one shell script; render/files.py sets the entrypoint a vllm-serve image needs
        # exec: the server is the shell's process, so `docker stop`'s SIGTERM reaches vLLM.
        script = f"exec {shlex.join([*program, *args])}"
        script = join_prelude(stack.prelude, script) if stack.prelude else script
        return [*(stack.shell or ["bash", "-c"]), script] if stack.entrypoint_style == "bash-c" else [script]
    head = program if stack.entrypoint_style == "bash-c" else []
    return [*head, *args]


API_SERVER = "vllm.entrypoints.openai.api_server"
CLI_MAIN = "vllm.entrypoints.cli.main"  # the `vllm` console script's module (pyproject: vllm = ...cli.main:main)
_PYTHON = re.compile(r"^python[0-9.]*$")
_SHELL_C = re.compile(r"^-[a-z]*c[a-z]*$")  # -c, -lc, -ec: the script is the next argument


def join_prelude(prelude: str, script: str) -> str:
    """PRELUDE then the server: `PRE && exec ...`, or after a prelude that ends its own line or
    statement (`;`, a line break) the server directly, as the operator's script had it."""
    if prelude.endswith("\n"):
        return f"{prelude}{script}"
    if prelude.endswith(";"):
        return f"{prelude} {script}"
    return f"{prelude} && {script}"


def split_launcher(command: Sequence[str]) -> tuple[list[str] | None, list[str]]:
    """`python3 -m vllm.entrypoints.openai.api_server ARGS` as ([python3, -m, MODULE], [vllm, serve,
    ARGS]): the same parser reads ARGS (the module's `__main__` builds it with make_arg_parser, as
    `vllm serve` does); `python3 -m vllm.entrypoints.cli.main serve ARGS` (what the `vllm` script
    runs) as ([python3, -m, MODULE, serve], [vllm, serve, ARGS]); any other command as (None, command)."""
    words = list(command)
    if len(words) >= 3 and _PYTHON.match(posixpath.basename(words[0])) and words[1:3] == ["-m", API_SERVER]:
        return words[:3], ["vllm", "serve", *words[3:]]
    if len(words) >= 4 and _PYTHON.match(posixpath.basename(words[0])) and words[1:4] == ["-m", CLI_MAIN, "serve"]:
        return words[:4], ["vllm", "serve", *words[4:]]
    return None, words


def shell_of(command: Sequence[str]) -> list[str] | None:
    """The shell and its options (`bash -lc`, `/bin/sh -c`) when the command is a shell script, else None."""
    if len(command) >= 2 and command[0].rsplit("/", 1)[-1] in ("bash", "sh") and _SHELL_C.match(command[1]):
        return list(command[:2])
    return None


# The server at a command boundary of a script: `vllm serve`, or python -m one of the two modules.
_SERVE_IN_SCRIPT = re.compile(r"(?:^|&&|;|\n)[ \t]*(?:exec\s+)?(?P<program>vllm\s+serve|"
                              r"(?:/[\w./-]+/)?python[0-9.]*\s+-m\s+"
                              rf"(?:{re.escape(API_SERVER)}|{re.escape(CLI_MAIN)}\s+serve))(?=\s|$)")
_SHELL_OPERATORS = frozenset("();<>|&`")


def split_prelude(command: Sequence[str]) -> tuple[str | None, list[str]]:
    """A `bash -c "PRE && vllm serve ..."` command (or `bash -lc`, `sh -c`; PRE may end in `;` or a
    line break instead, and the server may be `python3 -m vllm.entrypoints.openai.api_server`) as
    (PRE, [vllm, serve, ...] or [python3, -m, MODULE, ...]); any other command as (None, command).
    Raises ValueError saying what in the script was not understood."""
    if shell_of(command) is None:
        return None, list(command)
    if len(command) != 3:
        raise ValueError(f"{command[0]} {command[1]} has {len(command) - 2} arguments after the script; one script "
                         "is read")
    script = command[2].replace("\\\n", " ")  # a line continuation is a space to the shell
    found = list(_SERVE_IN_SCRIPT.finditer(script))
    if not found:
        raise ValueError("the bash -c script runs no `vllm serve` (nor python -m vllm.entrypoints.openai.api_server)")
    at = found[-1]
    boundary = at.group(0)[:len(at.group(0)) - len(at.group(0).lstrip(";\n&"))]
    before = script[:at.start()]
    if boundary in (";", "\n"):
        prelude = (before.strip() + boundary) if before.strip() else None
    else:
        prelude = before.strip() or None
    if prelude is None and boundary == "&&":
        raise ValueError("the bash -c script has `&&` with nothing before it")
    rest = script[at.end():]
    if "\n" in rest.strip():
        raise ValueError("the bash -c script goes on after the server starts (a line after it): only a script that "
                         "ends with the server is read")
    lexer = shlex.shlex(rest, posix=True, punctuation_chars="".join(sorted(_SHELL_OPERATORS)))
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as e:
        raise ValueError(f"the `vllm serve` part of the bash -c script does not parse ({e})") from None
    odd = next((t for t in tokens if set(t) <= _SHELL_OPERATORS or "$" in t), None)
    if odd is not None:
        raise ValueError(f"the `vllm serve` part of the bash -c script has {odd!r} (a shell operator or "
                         "expansion): only `PRELUDE && vllm serve ARGS` is read")
    return prelude, [*at.group("program").split(), *tokens]


def parse_command(command: Sequence[str]) -> ParsedServe:
    """A compose `command:` (plain, bare flags under an ENTRYPOINT [vllm, serve] image, or
    `bash -c "PRE && vllm serve ..."`) read as its `vllm serve` arguments. Raises ValueError for
    a bash -c script split_prelude cannot read."""
    argv = split_launcher(split_prelude(command)[1])[1]
    return parse_serve_args(argv[2:] if argv[:2] == ["vllm", "serve"] else argv)


# ---------------------------------------------------------------- back: argv -> stack keys


@dataclass
class ParsedServe:
    """A `vllm serve` argv (after `vllm serve`) read through FLAGS.

    values: stack key -> value (dotted keys; speculative is the JSON text); raw: the same
    key -> its tokens as written; fixed: the host/port flags (the stack's host and container_port);
    extra: every other token, in order.
    """

    model: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, list[str]] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not _NUMBER.match(token)


def flag_name(token: str) -> tuple[str, str | None]:
    """(normalized flag, inline value). vLLM reads --max_model_len as --max-model-len (vllm/utils.py,
    FlexibleArgumentParser.parse_known_args: underscores in a long option's name become dashes)."""
    name, eq, inline = token.partition("=")
    if name.startswith("--") and "." not in name:
        name = "--" + name[2:].replace("_", "-")
    return name, inline if eq else None


FLAG_BY_NAME: dict[str, Flag] = {f.flag: f for f in FLAGS} | {f.off: f for f in FLAGS if f.off}


def parse_serve_args(argv: Sequence[str]) -> ParsedServe:
    """Read the tokens after `vllm serve` (model first or as --model, then flags). A flag of
    FLAGS whose value does not parse, and every flag FLAGS lacks, stay verbatim in `extra`."""
    out = ParsedServe()
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        j = i + 1
        while j < len(tokens) and not _is_flag(tokens[j]):
            j += 1
        following = tokens[i + 1:j]
        if not _is_flag(token):  # a positional: vLLM's one is the model (model_tag)
            if out.model is None:
                out.model = token
            else:
                out.extra.append(token)
            i += 1
            continue
        name, inline = flag_name(token)
        f = FLAG_BY_NAME.get(name)
        if name == MODEL_FLAG and (inline is not None or following):
            out.model, rest = (inline, following) if inline is not None else (following[0], following[1:])
        elif f is None:
            out.extra += tokens[i:j]
            rest = []
        else:
            rest = _read(out, f, name, token, inline, following)
        for stray in rest:  # positionals after a flag's own values: the model, if not yet given
            if out.model is None:
                out.model = stray
            else:
                out.extra.append(stray)
        i = j
    return out


def _read(out: ParsedServe, f: Flag, name: str, token: str, inline: str | None,
          following: list[str]) -> list[str]:
    """Store one known flag in `out`; return the positionals it does not consume."""
    if f.kind in ("toggle", "switch"):
        if inline is not None:
            out.extra.append(token)
        else:
            out.values[f.key], out.raw[f.key] = name == f.flag, [token]
        return following
    if f.kind == "names":
        names = ([inline] if inline is not None else []) + (following if inline is None else [])
        if names:
            out.values[f.key], out.raw[f.key] = names, [token, *(following if inline is None else [])]
            return [] if inline is None else following
        out.extra.append(token)
        return following
    if inline is None and not following:
        out.extra.append(token)
        out.notes.append(f"{name} has no value: kept verbatim in extra_args")
        return []
    value, rest = (inline, following) if inline is not None else (following[0], following[1:])
    if f.kind == "fixed":
        out.fixed[name] = value
        return rest
    try:
        out.values[f.key], out.raw[f.key] = f.parse(value), [name, value]
    except ValueError:
        out.extra += [name, value]
        out.notes.append(f"{name} {value!r} is not a {f.key.replace('_', ' ')} a stack can hold: kept verbatim "
                         "in extra_args")
    return rest


def entrypoint_style(entrypoint: list[str] | None) -> str:
    ep = entrypoint or []
    if len(ep) >= 3 and posixpath.basename(ep[0]) in ("bash", "sh") and ep[1] == "-c" and '"$@"' in ep[2]:
        return "bash-c"
    if len(ep) >= 2 and posixpath.basename(ep[0]) == "vllm" and ep[1] == "serve":
        return "vllm-serve"
    return "other"


# ---------------------------------------------------------------- the key vLLM asks for

API_KEY_FLAG = "--api-key"
API_KEY_ENV = "VLLM_API_KEY"


def api_keys(argv: Sequence[str], env: Sequence[str]) -> list[str]:
    """The keys a running vLLM asks every /v1 request for, read from its process as docker inspect
    shows it (Path and Args, `NAME=value` Env). vLLM's build_app (vllm/entrypoints/openai/api_server.py,
    0001948b): `tokens = [key for key in (args.api_key or [envs.VLLM_API_KEY]) if key]`, the flag
    (FrontendArgs.api_key: list[str], so `--api-key A B`; vllm/entrypoints/openai/cli_args.py, 00522333)
    before the variable. A shell script's words are read too (`bash -c "... vllm serve ... --api-key K"`);
    a `$VAR` there is the container's variable. Empty: vLLM checks no key."""
    words: list[str] = []
    for token in argv:
        try:  # a script: its words; a plain token splits into itself
            words += shlex.split(token) if any(c.isspace() for c in token) else [token]
        except ValueError:
            words.append(token)
    variables = dict(e.partition("=")[::2] for e in env)
    given: list[str] | None = None
    for i, word in enumerate(words):
        name, inline = flag_name(word)
        if name != API_KEY_FLAG:
            continue
        if inline is not None:
            given = [inline]
            continue
        j = i + 1
        while j < len(words) and not _is_flag(words[j]) and not set(words[j]) <= set("();<>|&`"):
            j += 1
        given = words[i + 1:j]  # argparse's store: the last --api-key wins
    keys = given or [variables.get(API_KEY_ENV, "")]
    return [_expanded(k, variables) for k in keys if _expanded(k, variables)]


def _expanded(word: str, variables: dict[str, str]) -> str:
    """`$NAME` / `${NAME}` in a script's word, as the container's shell expands it."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m.group(1) or m.group(2), ""), word)
