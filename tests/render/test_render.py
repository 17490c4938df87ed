"""Render (pure): command shape, .env coverage, numeric gids, YAML safety, same bytes, secrets."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import MINIMAL_STACK, SHIPPED_STACKS, Scratch, make_dri
from simkit import run_cli, unavailable

from b70deploy.actions.diff import diff_against_dir
from b70deploy.actions.prepare import prepare
from b70deploy.config import hub
from b70deploy.config.catalogue import Catalogue
from b70deploy.config.node import Node, load_node
from b70deploy.config.resources import data_dir
from b70deploy.config.schema import HostMount, Stack
from b70deploy.errors import UserError
from b70deploy.render import devices
from b70deploy.render.files import COMPOSE_FILE, DOTENV_FILE, RUNTIME_ENV_FILE, Rendered, render

NO_DEVICES = devices.DeviceAccess(device_dir=None)


@pytest.fixture
def node(scratch: Scratch) -> Node:
    return load_node(str(scratch.config), stacks_dir=str(data_dir("stacks")))


def _render(node: Node, name: str, **kw: Any) -> Rendered:
    return render(node.catalogue().load(name), node, NO_DEVICES, **kw)


def _compose(r: Rendered) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(r.files[COMPOSE_FILE])
    return doc


def _dotenv(r: Rendered, name: str = DOTENV_FILE) -> dict[str, str | None]:
    import io

    from dotenv import dotenv_values

    return dict(dotenv_values(stream=io.StringIO(r.files[name].decode())))


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_shipped_stack_renders(node: Node, name: str) -> None:
    r = _render(node, name)
    assert set(r.files) == {COMPOSE_FILE, DOTENV_FILE, RUNTIME_ENV_FILE}
    doc = _compose(r)
    vllm = doc["services"]["vllm"]
    assert vllm["command"] == r.command
    assert all(isinstance(a, str) for a in vllm["command"])
    assert "profiles" not in vllm  # `docker compose ps` in the deploy dir lists it (issue 39)
    assert vllm["env_file"] == [RUNTIME_ENV_FILE]
    stack = node.catalogue().load(name)
    if stack.entrypoint_style == "bash-c":
        assert r.command[:3] == ["vllm", "serve", "${VLLM_MODEL}"]  # pitfall 1
    else:
        assert r.command[0] == "${VLLM_MODEL}"
        assert "vllm" not in r.command[:2]
    for alias in stack.served_model_names:
        assert alias in r.command


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_dotenv_defines_every_interpolated_variable(node: Node, name: str) -> None:
    """Pitfall 2: anything the compose file interpolates must come from the .env beside it."""
    r = _render(node, name)
    text = r.files[COMPOSE_FILE].decode()
    used = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    assert used >= {"VLLM_IMAGE", "VLLM_MODEL", "VLLM_PORT", "MODELS_DIR"}
    env = _dotenv(r)
    for var in used:
        assert env.get(var), f"{var} is interpolated but not set in .env"
    assert env["VLLM_MODEL"] == f"/models/{node.catalogue().load(name).model.path}"


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_render_is_byte_identical_twice(node: Node, name: str) -> None:
    assert _render(node, name).files == _render(node, name).files


def test_render_out_twice_gives_identical_files(scratch: Scratch) -> None:
    scratch.copy_shipped()
    scratch.without_engine()  # the plain render's three files, whatever images this machine has
    a, b = scratch.root / "a", scratch.root / "b"
    assert run_cli(None, "--config", str(scratch.config), "render", "eagle3", "--out", str(a),
                   in_process=True).returncode == 0
    assert run_cli(None, "--config", str(scratch.config), "render", "eagle3", "--out", str(b),
                   in_process=True).returncode == 0
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted([COMPOSE_FILE, DOTENV_FILE, RUNTIME_ENV_FILE])
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes()
    assert stat.S_IMODE((a / DOTENV_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((a / RUNTIME_ENV_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((a / COMPOSE_FILE).stat().st_mode) == 0o644


def test_port_and_project_overrides(node: Node) -> None:
    r = _render(node, "ngram", port=8001, project="b70-dark")
    assert _dotenv(r)["VLLM_PORT"] == "8001"
    assert _compose(r)["name"] == "b70-dark"


def _weights_bind(r: Rendered, node: Node) -> dict[str, Any]:
    binds = [v for v in _compose(r)["services"]["vllm"]["volumes"] if v["target"] == node.config.models_target]
    assert len(binds) == 1, binds
    return dict(binds[0])


def test_the_weights_bind_keeps_the_mode_the_node_or_stack_says(scratch: Scratch) -> None:
    """A node that never said binds the weights read-only; a node whose hand-made bind was read-write
    (init wrote models_read_only: false) keeps it so for every stack; a stack's own key wins."""
    scratch.copy_shipped()
    never = load_node(str(scratch.config))
    assert _weights_bind(_render(never, "ngram"), never)["read_only"] is True
    scratch.write_config({"models_read_only": False})
    rw = load_node(str(scratch.config))
    assert "read_only" not in _weights_bind(_render(rw, "ngram"), rw)
    stack = rw.catalogue().load("ngram").model_copy(update={"models_read_only": True})
    assert _weights_bind(render(stack, rw, NO_DEVICES), rw)["read_only"] is True


@pytest.mark.parametrize("folder", ["hub", "models", "."])
def test_a_hub_model_finds_the_hub_folder_the_node_names(scratch: Scratch, folder: str) -> None:
    """A stack whose env does not name the cache gets HF_HOME for HF_HOME's `hub`, else HF_HUB_CACHE at
    the node's hf_hub_folder (huggingface_hub reads it whatever its name); lint looks in the same folder."""
    cache = scratch.root / "cache"
    snap = cache / folder / "models--Qwen--Qwen3-0.6B" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("0123abc")
    scratch.write_stack("h", {**MINIMAL_STACK, "name": "h", "model": {"path": "Qwen/Qwen3-0.6B", "hub": True}})
    scratch.write_config({"hf_cache": str(cache), "hf_cache_target": "/cache", "hf_hub_folder": folder})
    node = load_node(str(scratch.config))
    vllm = _compose(_render(node, "h"))["services"]["vllm"]
    assert {"type": "bind", "source": str(cache), "target": "/cache", "bind": {"create_host_path": False}} \
        in vllm["volumes"]
    want = {"hub": ("HF_HOME", "/cache"), "models": ("HF_HUB_CACHE", "/cache/models"), ".": ("HF_HUB_CACHE", "/cache")}
    key, value = want[folder]
    assert vllm["environment"][key] == value and not ({"HF_HOME", "HF_HUB_CACHE"} - {key}) & set(vllm["environment"])
    assert hub.snapshot(cache, "Qwen/Qwen3-0.6B", node.config.hf_hub_folder) == snap
    with pytest.raises(UserError, match=r"hf_hub_folder '\.\./x' is not a folder below hf_cache"):
        scratch.write_config({"hf_cache": str(cache), "hf_hub_folder": "../x"})
        load_node(str(scratch.config))


# ------------------------------------------------------------------ YAML safety


def test_hostile_values_cannot_inject_keys(scratch: Scratch) -> None:
    evil = "x: y\nimage: evil # \"q\" 'q' ${HOME} \\"
    scratch.write_stack("evil", {
        **MINIMAL_STACK,
        "served_model_names": ["qwen3:30b/a3b-w4a16"],
        "tool_calling": {"parser": evil},
        "extra_args": ["--x", "a: b", "- c", "{d: e}", "#f", "$HOME", "${VLLM_MODEL}x"],
        "env": {"NOTE": "k: v # c ' \" $x"},
    })
    cfg = scratch.write_config({"companions": [{
        "name": "webui", "image": "ghcr.io/open-webui/open-webui:main",
        "command": ["sh", "-c", evil], "environment": {"WEBUI_NAME": "a: b ${X} $$"}}]})
    node = load_node(str(cfg))
    r = render(node.catalogue().load("evil"), node, NO_DEVICES)
    doc = _compose(r)
    assert set(doc) == {"name", "services"}
    assert set(doc["services"]) == {"vllm", "webui"}
    vllm = doc["services"]["vllm"]
    assert set(vllm) == {"image", "restart", "command", "ports", "env_file", "volumes", "ipc",
                         "shm_size", "labels"}
    cmd = vllm["command"]
    # `$` is doubled for Compose (a literal dollar), except our own ${VLLM_MODEL}.
    assert cmd[cmd.index("--tool-call-parser") + 1] == evil.replace("$", "$$")
    assert cmd[-7:] == ["--x", "a: b", "- c", "{d: e}", "#f", "$$HOME", "$${VLLM_MODEL}x"]
    webui = doc["services"]["webui"]
    assert webui["command"] == ["sh", "-c", evil.replace("$", "$$")]
    # A companion's environment is Compose text as the operator wrote it: ${X} is Compose's, $$ a literal $.
    assert webui["environment"]["WEBUI_NAME"] == "a: b ${X} $$"
    # One line, double-quoted with `\$` (Compose's escape; the docker test checks the round trip).
    assert r.files[RUNTIME_ENV_FILE].decode().splitlines()[1:] == ['NOTE="k: v # c \' \\" \\$x"']


def test_env_quoting_round_trips_through_dotenv_parser() -> None:
    """python-dotenv reads our quoting like Compose does, except `\\$` inside double quotes (a
    Compose escape, used only for values holding both `'` and `$`): the docker test covers those."""
    from b70deploy.render.files import _env_q

    tricky = ["plain", "with space", " lead and trail ", "dollar $HOME ${X} $$", "single ' quote",
              'double " quote', "both ' and \"", "hash # not a comment", "back\\slash", "back\\slash'",
              "=equals=", "", "ü ☃ 😀", "tab\there"]
    assert _env_q("it's $HOME") == '"it\'s \\$HOME"'
    text = "".join(f"V{i}={_env_q(v)}\n" for i, v in enumerate(tricky))
    import io

    from dotenv import dotenv_values

    parsed = dotenv_values(stream=io.StringIO(text), interpolate=False)
    assert [parsed[f"V{i}"] for i in range(len(tricky))] == tricky


# ------------------------------------------------------------------ devices


def test_scan_reads_numeric_gids_of_device_nodes(dri: Path) -> None:
    access = devices.scan(dri)
    assert access.device_dir == dri
    assert sorted(access.gids.values()) == [44, 992]
    assert access.group_add == ["44", "992"]
    assert access.notes == ()


def test_rendered_group_add_is_numeric(scratch: Scratch, dri: Path) -> None:
    scratch.copy_shipped()
    node = load_node(str(scratch.write_config({"device_dir": str(dri)})))
    prepared = prepare(node, "w4a16")
    vllm = _compose(prepared.rendered)["services"]["vllm"]
    assert vllm["group_add"] == ["44", "992"]
    assert all(g.isdigit() for g in vllm["group_add"])  # pitfall 3: never a group name
    assert vllm["devices"] == [f"{dri}:{dri}"]
    assert any("44" in n and "992" in n for n in prepared.rendered.notes)


def test_pinned_gids_win_over_scan(dri: Path) -> None:
    access = devices.scan(dri, {"render": 993, "extra": 7})
    assert 993 in access.gids.values() and 7 in access.gids.values()
    assert all(g.isdigit() for g in access.group_add)


def test_pinned_gids_without_devices(tmp_path: Path) -> None:
    access = devices.scan(tmp_path / "absent", {"render": 992, "video": 44})
    assert access.device_dir is None
    assert access.group_add == ["44", "992"]


def test_empty_device_dir_says_so(tmp_path: Path) -> None:
    access = devices.scan(tmp_path)
    assert access.gids == {}
    assert "no device nodes" in access.notes[0]


def test_no_device_dir_renders_without_devices_and_says_so(scratch: Scratch) -> None:
    scratch.copy_shipped()
    scratch.write_config({"device_dir": str(scratch.root / "no-dri")})
    result = run_cli(None, "--config", str(scratch.config), "render", "eagle3", in_process=True)
    assert result.returncode == 0
    assert "rendering without GPU devices" in result.stderr
    doc = yaml.safe_load(result.stdout.split(f"# ---- {DOTENV_FILE}")[0])
    assert "devices" not in doc["services"]["vllm"]
    assert "group_add" not in doc["services"]["vllm"]


# ------------------------------------------------------------------ secrets


SECRET = "hf_s3cr3tTOKENvalue"
PLAIN_NAMED_SECRET = "zz-value-from-secrets-file"


@pytest.fixture
def secret_node(scratch: Scratch) -> Scratch:
    scratch.copy_shipped()
    env = scratch.root / "secrets.env"
    env.write_text(f"HF_TOKEN={SECRET}\nSERVICE_URL_WITH_CREDS={PLAIN_NAMED_SECRET}\n")
    env.chmod(0o600)
    scratch.write_config({"secrets_env_file": str(env)})
    return scratch


def test_secrets_only_in_runtime_env_and_masked(secret_node: Scratch) -> None:
    node = load_node(str(secret_node.config))
    r = prepare(node, "eagle3").rendered
    assert SECRET.encode() in r.files[RUNTIME_ENV_FILE]
    assert PLAIN_NAMED_SECRET.encode() in r.files[RUNTIME_ENV_FILE]
    for name in (COMPOSE_FILE, DOTENV_FILE):
        assert SECRET.encode() not in r.files[name]
    for name in r.files:
        assert SECRET not in r.masked(name)
        assert PLAIN_NAMED_SECRET not in r.masked(name)
    assert r.mode(RUNTIME_ENV_FILE) == 0o600
    assert r.mode(DOTENV_FILE) == 0o600


@pytest.mark.parametrize("argv", [("render", "eagle3"), ("render", "eagle3", "--json"), ("diff", "eagle3"),
                                  ("diff", "eagle3", "--json")])
def test_secrets_never_printed(secret_node: Scratch, argv: tuple[str, ...]) -> None:
    result = run_cli(None, "--config", str(secret_node.config), *argv, in_process=True)
    assert result.returncode == 0, result.stderr
    assert "HF_TOKEN" in result.stdout
    assert "****(sha256:" in result.stdout
    for text in (result.stdout, result.stderr):
        assert SECRET not in text
        assert PLAIN_NAMED_SECRET not in text


def test_diff_masks_old_and_new_secrets(secret_node: Scratch) -> None:
    node = load_node(str(secret_node.config))
    deploy = node.deploy_dir
    assert run_cli(None, "--config", str(secret_node.config), "render", "ngram", "--out", str(deploy),
                   in_process=True).returncode == 0
    old_secret = "hf_OLDsecretVALUE"
    vllm_env = deploy / RUNTIME_ENV_FILE
    vllm_env.write_text(vllm_env.read_text().replace(SECRET, old_secret))
    result = run_cli(None, "--config", str(secret_node.config), "diff", "eagle3", in_process=True)
    assert result.returncode == 0
    assert f"--- {deploy}/{RUNTIME_ENV_FILE}" in result.stdout
    assert "+    - --enforce-eager" not in result.stdout  # sanity: the compose diff is shown as quoted YAML
    assert '"--enforce-eager"' in result.stdout
    for text in (old_secret, SECRET, PLAIN_NAMED_SECRET):
        assert text not in result.stdout
    # The masks differ, so the operator sees that the token changed.
    masked = [ln for ln in result.stdout.splitlines() if ln[:1] in "+-" and "HF_TOKEN" in ln]
    assert len(masked) == 2 and masked[0][1:] != masked[1][1:]


def test_diff_of_identical_tree_is_empty(scratch: Scratch) -> None:
    scratch.copy_shipped()
    node = load_node(str(scratch.config))
    r = prepare(node, "w4a16").rendered
    from b70deploy.state.fsio import write_tree

    write_tree(node.deploy_dir, r.files, {n: r.mode(n) for n in r.files})
    assert diff_against_dir(node.deploy_dir, r.files) == ""


def test_stack_env_secret_names_masked_too(scratch: Scratch) -> None:
    scratch.write_stack("s", {**MINIMAL_STACK, "env": {"MY_API_KEY": "k-123456", "HF_HOME": "/models/hf"}})
    node = load_node(str(scratch.config))
    r = render(Catalogue(scratch.stacks).load("s"), node, NO_DEVICES)
    masked = r.masked(RUNTIME_ENV_FILE)
    assert "k-123456" not in masked
    assert "HF_HOME='/models/hf'" in masked


def test_multiline_secret_is_refused(scratch: Scratch) -> None:
    from b70deploy.config.secrets_file import load_secrets
    from b70deploy.errors import UserError

    env = scratch.root / "s.env"
    env.write_text('HF_TOKEN="line1\nline2"\n')
    with pytest.raises(UserError, match="multi-line"):
        load_secrets(env)


def test_lax_secrets_mode_warns(scratch: Scratch) -> None:
    from b70deploy.config.secrets_file import load_secrets

    env = scratch.root / "s.env"
    env.write_text("HF_TOKEN=x\n")
    env.chmod(0o644)
    values, warnings = load_secrets(env)
    assert values == {"HF_TOKEN": "x"}
    assert "chmod 600" in warnings[0]


def test_stack_model_is_pure(node: Node) -> None:
    stack = node.catalogue().load("eagle3")
    assert isinstance(stack, Stack)
    with pytest.raises(Exception):  # noqa: B017 - frozen pydantic model
        stack.max_model_len = 1  # type: ignore[misc]


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_every_rendered_and_stored_file_gets_the_one_mode_rule(node: Node, name: str, tmp_path: Path) -> None:
    """`render --out`, lint's scratch copy and the revision store all write with state/fsio.file_mode:
    env files 0600 (they carry secrets), the rest 0644."""
    from b70deploy.state.fsio import file_mode, write_tree
    from b70deploy.state.revisions import RevisionStore

    r = _render(node, name)
    write_tree(tmp_path / "out", r.files)
    rev = RevisionStore(tmp_path / "state").create(
        stack=name, kind="switch", files=r.files, image_ref="img:1", image_id=None, repo_digest=None,
        operator="me@host", message="m", created="2026-11-29T00:00:00+0000")
    assert {DOTENV_FILE, RUNTIME_ENV_FILE} <= set(r.files)
    for n in r.files:
        want = 0o600 if n.endswith(".env") else 0o644
        assert file_mode(n) == r.mode(n) == want, n
        assert stat.S_IMODE((tmp_path / "out" / n).stat().st_mode) == want, n
        assert stat.S_IMODE((rev.files_dir / n).stat().st_mode) == want, n


def test_stack_mounts_are_read_only_binds_and_bad_paths_are_one_line_errors(node: Node, scratch: Scratch) -> None:
    stack = node.catalogue().load("w4a16").model_copy(
        update={"mounts": [HostMount(source="/var/cache/venv", target="/var/cache/venv")]})
    doc = yaml.safe_load(render(stack, node, devices.scan(scratch.root / "no-dri")).files[COMPOSE_FILE])
    assert {"type": "bind", "source": "/var/cache/venv", "target": "/var/cache/venv",
            "read_only": True} in doc["services"]["vllm"]["volumes"]
    for bad in ("relative/path", "/a/../etc", "/", "/with space"):
        with pytest.raises(ValueError, match="is not an absolute path"):
            HostMount(source=bad, target="/x")


def test_a_pinned_image_id_gets_its_own_cache_mount_and_a_tag_gets_none(node: Node) -> None:
    image = "sha256:" + "ab" * 32
    r = _render(node, "w4a16", image=image)
    folder = node.cache_dir / ("sha256-" + "ab" * 32)
    assert _dotenv(r)["CACHE_DIR"] == str(folder)
    vllm = _compose(r)["services"]["vllm"]
    mount = [v for v in vllm["volumes"] if v["target"] == "/var/cache/b70deploy"]
    assert mount == [{"type": "bind", "source": "${CACHE_DIR:?}", "target": "/var/cache/b70deploy",
                      "bind": {"create_host_path": True}}]
    assert vllm["environment"]["VLLM_CACHE_ROOT"] == "/var/cache/b70deploy/vllm"
    assert vllm["environment"]["SYCL_CACHE_PERSISTENT"] == "1"
    other = _render(node, "w4a16", image="sha256:" + "cd" * 32)
    assert _dotenv(other)["CACHE_DIR"] != str(folder)
    plain = _render(node, "w4a16")  # a tag can move to another image: no cache is offered to it
    assert "CACHE_DIR" not in _dotenv(plain) and "environment" not in _compose(plain)["services"]["vllm"]


def test_a_single_device_node_is_a_device_not_a_folder(tmp_path: Path) -> None:
    """device_dir /dev/kfd (or /dev/dri/card0): its own gid, rendered, never "not found"."""
    try:
        card = make_dri(tmp_path) / "card0"
    except PermissionError:
        unavailable("mknod of a character device needs root")
    access = devices.scan(card)
    assert access.device_dir == card and list(access.gids.values()) == [44] and access.notes == ()


def test_node_wide_settings_are_every_stacks(scratch: Scratch) -> None:
    """Issue 33: the hand-made service's node-wide keys (init writes them into the node's compose:)
    are in every rendered stack, under the stack's own keys; a companion gets no variable it did not
    have. The node's profiles are what the compose calls enable: the rendered services sit under no
    profile (issue 39: `docker compose config` by hand in the deploy dir lists them)."""
    scratch.copy_shipped()
    cfg = scratch.write_config({
        "profiles": ["nvidia", "chat"], "networks": {"appnet": {"name": "fixed-net"}},
        "compose": {"security_opt": ["label=disable"], "group_add": ["44"], "devices": ["/srv/dri:/dev/dri"],
                    "shm_size": "17179869184", "ulimits": {"memlock": -1}, "runtime": "runc",
                    "networks": {"appnet": None}},
        "companions": [{"name": "router", "image": "litellm:1", "environment": {"DATABASE_URL": "${DATABASE_URL}"}}]})
    node = load_node(str(cfg))
    for name in ("ngram", "eagle3"):
        doc = _compose(_render(node, name))
        vllm, router = doc["services"]["vllm"], doc["services"]["router"]
        assert vllm["security_opt"] == ["label=disable"] and "44" in vllm["group_add"]
        assert "/srv/dri:/dev/dri" in vllm["devices"] and vllm["shm_size"] == "17179869184"
        assert vllm["ulimits"] == {"memlock": -1} and vllm["runtime"] == "runc" and vllm["networks"] == {"appnet": None}
        assert doc["networks"] == {"appnet": {"name": "fixed-net"}}
        assert "profiles" not in vllm and "profiles" not in router
        assert router["environment"] == {"DATABASE_URL": "${DATABASE_URL}"}   # as written, nothing added


def test_a_stack_carries_its_companions_file(scratch: Scratch, tmp_path: Path) -> None:
    """Issue 33: a router config that names the stack's served model is the stack's file, under
    the deploy dir's companions/, which the deploy dir counts as its own (a rendered stack without
    it removes it; a revision keeps it)."""
    from b70deploy.deploy.deploydir import deployed_names, write_deployed

    scratch.copy_shipped()
    router = "model_list:\n  - model_name: chat\n    litellm_params: {model: openai/qwen3-30b-a3b-w4a16}\n"
    scratch.write_stack("routed", {"extends": "ngram", "companion_files": {"litellm/config.yaml": router}})
    node = load_node(str(scratch.write_config({})))
    r = _render(node, "routed")
    assert r.files["companions/litellm/config.yaml"] == router.encode()
    write_deployed(tmp_path, r.files)
    assert "companions/litellm/config.yaml" in deployed_names(tmp_path)
    write_deployed(tmp_path, _render(node, "ngram").files)
    assert not (tmp_path / "companions" / "litellm" / "config.yaml").exists()
    scratch.write_stack("bad", {"extends": "ngram", "companion_files": {"../escape": "x"}})
    with pytest.raises(UserError, match="not a file name under companions/"):
        node.catalogue().load("bad")


def test_a_companions_secrets_go_to_its_0600_env_file_never_inline(scratch: Scratch) -> None:
    """By name (WEBUI_SECRET_KEY), marked (`secrets:`), or holding a value of the node's secrets
    file: each goes to the companion's env file; a `${VAR}` reference stays in the compose file."""
    scratch.copy_shipped()
    env = scratch.root / "secrets.env"
    env.write_text(f"HF_TOKEN={SECRET}\n")
    env.chmod(0o600)
    cfg = scratch.write_config({"secrets_env_file": str(env), "companions": [{
        "name": "webui", "image": "ghcr.io/open-webui/open-webui:main", "secrets": ["SIGNING"],
        "environment": {"WEBUI_SECRET_KEY": "k'1", "SIGNING": "s1gning-value", "HF_MIRROR": f"x{SECRET}",
                        "DB_PASSWORD": "${DB_PASSWORD}", "WEBUI_NAME": "chat"}}]})
    node = load_node(str(cfg))
    r = render(node.catalogue().load("eagle3"), node, NO_DEVICES, secrets={"HF_TOKEN": SECRET})
    webui = _compose(r)["services"]["webui"]
    assert webui["env_file"] == ["webui.secrets.env"]
    assert {k for k in webui["environment"] if k != "OPENAI_API_BASE_URL"} == {"DB_PASSWORD", "WEBUI_NAME"}
    assert "{DB_PASSWORD}" in webui["environment"]["DB_PASSWORD"]  # the reference, as written
    assert _dotenv(r, "webui.secrets.env") == {"HF_MIRROR": f"x{SECRET}", "SIGNING": "s1gning-value",
                                               "WEBUI_SECRET_KEY": "k'1"}
    assert r.mode("webui.secrets.env") == 0o600
    for name in r.files:
        shown = r.masked(name)
        assert SECRET not in shown and "s1gning-value" not in shown and "k'1" not in shown
