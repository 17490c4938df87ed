"""The CLI surface: help with examples, JSON output, fast `--help`, node config discovery."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from kit.scratch import MINIMAL_STACK, SHIPPED_STACKS, Scratch
from simkit import run_cli

from b70deploy.cli import cli
from b70deploy.config import node as node_mod
from b70deploy.config.node import find_config, load_node

HEAVY = ("pydantic", "docker", "requests", "jinja2", "yaml", "rich", "dotenv", "psutil", "tenacity")


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        out.append((*prefix, name))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
    return out


@pytest.mark.parametrize("path", [(), *_commands(cli)], ids=lambda p: " ".join(p) or "root")
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    result = run_cli(None, *path, "--help", in_process=True)
    assert result.returncode == 0
    assert "Example" in result.stdout
    assert result.stderr == ""


def test_help_imports_no_heavy_module() -> None:
    """`b70deploy --help` must stay fast: the heavy libraries load inside commands only."""
    probe = ("import sys\nfrom b70deploy.cli import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             f"print('HEAVY=' + ','.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "Commands:" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY="


def test_stacks_json(scratch: Scratch) -> None:
    scratch.copy_shipped()
    result = run_cli(None, "--config", str(scratch.config), "stacks", "--json", in_process=True)
    assert result.returncode == 0
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == SHIPPED_STACKS
    by_name = {r["name"]: r for r in rows}
    assert by_name["eagle3"]["speculative"] == "eagle3"
    assert by_name["w4a16"]["extends"] == "w4a16-131k"


def test_stacks_table(scratch: Scratch) -> None:
    scratch.copy_shipped()
    result = run_cli(None, "--config", str(scratch.config), "stacks", in_process=True)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["stack", "extends", "image"]
    assert any(line.split()[:2] == ["tq-256k", "vllm-xpu:0.19.0-tr5"] for line in lines)
    assert any("262,144" in line for line in lines)


def test_show_merges_extends(scratch: Scratch) -> None:
    scratch.copy_shipped()
    result = run_cli(None, "--config", str(scratch.config), "show", "eagle3", "--json", in_process=True)
    doc = json.loads(result.stdout)
    assert doc["max_model_len"] == 262144            # from w4a16
    assert doc["kv_cache_dtype"] == "fp8"             # from w4a16-131k
    assert doc["enforce_eager"] is True               # its own
    assert doc["speculative"]["method"] == "eagle3"
    import yaml

    assert yaml.safe_load(run_cli(None, "--config", str(scratch.config), "show", "eagle3",
                                  in_process=True).stdout) == doc


def test_render_json_has_files_and_command(scratch: Scratch) -> None:
    scratch.copy_shipped()
    scratch.without_engine()  # the plain render's three files, whatever images this machine has
    result = run_cli(None, "--config", str(scratch.config), "render", "ngram", "--json", in_process=True)
    data = json.loads(result.stdout)
    assert set(data["files"]) == {"docker-compose.yml", ".env", "vllm.env"}
    assert data["command"][:2] == ["vllm", "serve"]


def test_diff_reports_no_changes_then_changes(scratch: Scratch) -> None:
    scratch.copy_shipped()
    deploy = load_node(str(scratch.config)).deploy_dir
    assert run_cli(None, "--config", str(scratch.config), "render", "w4a16", "--out", str(deploy),
                   in_process=True).returncode == 0
    same = run_cli(None, "--config", str(scratch.config), "diff", "w4a16", in_process=True)
    assert same.returncode == 0 and same.stdout.startswith("no changes")
    changed = run_cli(None, "--config", str(scratch.config), "diff", "w4a16-131k", in_process=True)
    assert '-      - "262144"' in changed.stdout and '+      - "131072"' in changed.stdout
    data = json.loads(run_cli(None, "--config", str(scratch.config), "diff", "w4a16-131k", "--json",
                              in_process=True).stdout)
    assert data["changed"] == ["docker-compose.yml"]
    assert data["diff"] == changed.stdout


# ------------------------------------------------------------------ node config discovery


def test_config_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("B70DEPLOY_CONFIG", raising=False)
    system = tmp_path / "etc-node.yaml"
    monkeypatch.setattr(node_mod, "SYSTEM_PATH", system)
    assert find_config(None) is None
    system.write_text("project: sys\n")
    assert find_config(None) == system
    (tmp_path / "b70deploy.yml").write_text("project: cwd\n")  # the other spelling of YAML
    assert find_config(None) == tmp_path / "b70deploy.yml"
    (tmp_path / "b70deploy.yaml").write_text("project: cwd\n")
    assert find_config(None) == tmp_path / "b70deploy.yaml"
    monkeypatch.setenv("B70DEPLOY_CONFIG", str(tmp_path / "env.yaml"))
    assert find_config(None) == tmp_path / "env.yaml"
    assert find_config(str(tmp_path / "flag.yaml")) == tmp_path / "flag.yaml"
    assert find_config("flag.yaml") == tmp_path / "flag.yaml"  # relative: made absolute here
    monkeypatch.setenv("B70DEPLOY_CONFIG", "env.yaml")
    assert find_config(None) == tmp_path / "env.yaml"


def test_defaults_need_no_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("B70DEPLOY_CONFIG", raising=False)
    monkeypatch.delenv("B70DEPLOY_STACKS", raising=False)
    monkeypatch.setattr(node_mod, "SYSTEM_PATH", tmp_path / "absent.yaml")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home/.local/state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home/.local/share"))
    node = load_node(None)
    assert node.source is None
    assert node.project == "b70"
    assert node.config.ports.prod == 8000 and node.config.ports.dark == 8001
    assert str(node.state_dir).startswith(str(tmp_path / "home"))
    assert str(node.deploy_dir).startswith(str(tmp_path / "home"))
    assert node.stacks_dir.is_dir()
    assert node.device_dir is None or str(node.device_dir) == "/dev/dri"


@pytest.mark.parametrize("args", [("switch", "alpha", "--yes"), ("rollback", "--yes"), ("gc",), ("pin", "1"),
                                  ("adopt",), ("bench", "cycle", "w4a16", "--", "--metric", "decode"),
                                  ("fsck", "--repair"), ("unlock",)],
                         ids=lambda a: " ".join(a[:2]) if a[0] == "bench" else a[0])
def test_a_mutating_command_without_a_node_config_refuses_and_names_init(
        args: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in defaults are a guess: a command that changes the node refuses them, at once."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(node_mod, "SYSTEM_PATH", tmp_path / "absent.yaml")
    home = tmp_path / "home"
    env = {"HOME": str(home), "XDG_STATE_HOME": str(home / "state"), "XDG_DATA_HOME": str(home / "data")}
    r = run_cli(None, *args, env=env, in_process=True)
    assert r.returncode == 2, (r.stdout, r.stderr)
    [line] = r.stderr.splitlines()
    assert "no node config found" in line and "`b70deploy init`" in line and "Traceback" not in r.stderr
    assert not home.exists()  # no state dir, no lock, no audit line: nothing changed


def test_a_read_only_command_without_a_node_config_says_it_uses_the_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(node_mod, "SYSTEM_PATH", tmp_path / "absent.yaml")
    home = tmp_path / "home"
    env = {"HOME": str(home), "XDG_STATE_HOME": str(home / "state"), "XDG_DATA_HOME": str(home / "data")}
    r = run_cli(None, "history", env=env, in_process=True)
    assert r.returncode == 0, r.stderr
    assert "no node config found: using the built-in defaults (project b70, 0.0.0.0:8000, /models)" in r.stderr
    assert "b70deploy init" in r.stderr


def _options(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        out += [(" ".join((*prefix, name)), p.opts[0]) for p in cmd.params if isinstance(p, click.Option)]
        if isinstance(cmd, click.Group):
            out += _options(cmd, (*prefix, name))
    return out


def test_every_option_of_every_command_has_help_text() -> None:
    bare = [f"{command} {option}" for command, option in _options(cli)
            if not next(p for p in cli_params(command) if p.opts[0] == option).help]
    assert not bare, bare


def cli_params(command: str) -> list[click.Parameter]:
    cmd: click.Command = cli
    for part in command.split():
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[part]
    return cmd.params


def test_relative_paths_are_relative_to_the_config(scratch: Scratch) -> None:
    cfg = scratch.write_config({"deploy_dir": "deploy", "state_dir": "./state", "stacks_dir": "stacks"})
    node = load_node(str(cfg))
    assert node.deploy_dir == scratch.root / "deploy"
    assert node.state_dir == scratch.root / "state"
    assert node.stacks_dir == scratch.stacks


def test_stacks_dir_precedence(scratch: Scratch) -> None:
    """--stacks-dir beats $B70DEPLOY_STACKS beats the node config's stacks_dir."""
    for label in ("flag", "env", "cfg"):
        d = scratch.root / f"stacks-{label}"
        d.mkdir()
        (d / f"only-{label}.yaml").write_text("image: a/b:1\nmodel: {path: m}\nserved_model_names: [m]\n"
                                              "max_model_len: 4096\n")
    scratch.write_config({"stacks_dir": str(scratch.root / "stacks-cfg")})

    def names(*argv: str, env: dict[str, str] | None = None) -> list[str]:
        res = run_cli(None, "--config", str(scratch.config), *argv, "stacks", "--json", env=env, in_process=True)
        assert res.returncode == 0, res.stderr
        return [r["name"] for r in json.loads(res.stdout)]

    assert names() == ["only-cfg"]
    env = {"B70DEPLOY_STACKS": str(scratch.root / "stacks-env")}
    assert names(env=env) == ["only-env"]
    assert names("--stacks-dir", str(scratch.root / "stacks-flag"), env=env) == ["only-flag"]


def test_config_from_environment_variable(scratch: Scratch) -> None:
    scratch.copy_shipped()
    res = run_cli(scratch.config, "stacks", "--json", in_process=True)  # as $B70DEPLOY_CONFIG
    assert res.returncode == 0 and len(json.loads(res.stdout)) == len(SHIPPED_STACKS)
    res = run_cli(scratch.root / "missing.yaml", "stacks", in_process=True)
    assert res.returncode == 2 and "missing.yaml: file not found" in res.stderr


def test_history_names_a_gone_image_once_whatever_the_rows_that_ran_it() -> None:
    from b70deploy.cli.records import gone_images

    rows = [{"number": n, "image_gone": n != 4, "image_id": "sha256:" + ("a" * 64 if n < 4 else "b" * 64),
             "image_fix": "docker load -i FILE"} for n in range(1, 7)]
    assert gone_images(rows) == [
        f"image sha256:{'a' * 12} is gone (revisions 1, 2, 3); fix: docker load -i FILE",
        f"image sha256:{'b' * 12} is gone (revisions 5, 6); fix: docker load -i FILE",
    ]


@pytest.mark.parametrize("width", [80, 100, 120, 160, 240])
def test_a_table_fits_the_terminal_and_keeps_words_whole(width: int) -> None:
    """One line per row at any width, the header whole; word cells whole in the columns kept (never
    "superse/ded"), free text cut with an ellipsis, optional columns left out first (issue 39)."""
    from b70deploy.cli.records import HISTORY_OPTIONAL
    from b70deploy.ui.output import fitted

    headers = ["rev", "stack", "kind", "outcome", "pin", "created", "image", "KV tokens", "healthy s", "message"]
    message = "first deploy: W4A16 + fp8 KV at 262K, with words enough to wrap"
    rows = [[12, "w4a16-131k", "rollback", "superseded", "*", "2026-12-01 23:49", "intel/vllm:latest",
             "270,592", "21.4", message]]
    lines, dropped = fitted(headers, rows, width, optional=HISTORY_OPTIONAL)
    assert len(lines) == 2 and all(len(line) <= width for line in lines), (width, lines)
    kept = [h for h in headers if h not in dropped]
    assert lines[0].split("  ")[0] == "rev" and " ".join(lines[0].split()) == " ".join(kept)
    for whole in ("superseded", "w4a16-131k", "2026-12-01 23:49"):
        assert whole in lines[1], (whole, lines)
    assert (message in lines[1]) == (width >= 240), lines  # cut with "…" only when it does not fit
    assert dropped == list(HISTORY_OPTIONAL[:len(dropped)])  # the least important first


@pytest.mark.docker
def test_switch_dry_run_with_the_image_missing_prints_the_plan_then_the_refusal(
        scratch: Scratch, docker_engine: None) -> None:
    scratch.copy_shipped()
    scratch.write_stack("gone", {"extends": "w4a16", "image": "b70t-absent/vllm:never"})
    r = run_cli(scratch.config, "switch", "gone", "--dry-run")
    assert r.returncode == 2, r.stderr
    assert "image b70t-absent/vllm:never is not on this engine: the files below name the tag" in r.stdout
    assert " 3. idle " in r.stdout and " 6. drain " in r.stdout and "+++ switch-gone/docker-compose.yml" in r.stdout
    assert "VLLM_IMAGE='b70t-absent/vllm:never'" in r.stdout
    [line] = r.stderr.splitlines()
    assert "is not on this engine" in line and "fix: pull or build it first" in line
    assert not (scratch.root / "deploy").exists() and not (scratch.root / "state" / "revisions").exists()


def test_show_says_no_architecture_the_stack_did_not_give(scratch: Scratch) -> None:
    """Issue 39, point 7: `show` called a dense model `architecture: moe` (the schema's default)."""
    scratch.write_stack("dense", {**MINIMAL_STACK, "model": {"path": "Qwen/Qwen3-8B"}})
    scratch.write_stack("told", {**MINIMAL_STACK, "model": {"path": "Qwen/Qwen3-8B", "architecture": "dense"}})
    dense = json.loads(run_cli(None, "--config", str(scratch.config), "show", "dense", "--json",
                               in_process=True).stdout)
    assert "architecture" not in dense["model"]
    told = json.loads(run_cli(None, "--config", str(scratch.config), "show", "told", "--json",
                              in_process=True).stdout)
    assert told["model"]["architecture"] == "dense"
