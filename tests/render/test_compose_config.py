"""Rendered files through a real Compose v2 (`docker compose config`: parses and interpolates,
creates nothing). Compose prints a literal `$` as `$$` in its output, hence `dollars()`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kit.scratch import MINIMAL_STACK, SHIPPED_STACKS, Scratch, make_dri

from b70deploy.actions.prepare import prepare
from b70deploy.config.node import load_node
from b70deploy.errors import UserError
from b70deploy.render.files import Rendered, _env_q
from b70deploy.state.fsio import write_tree

pytestmark = pytest.mark.docker

Config = Callable[[Path], dict[str, Any]]


def dollars(text: str) -> str:
    return text.replace("$", "$$")


def _write(r: Rendered, folder: Path) -> Path:
    write_tree(folder, r.files, {n: r.mode(n) for n in r.files})
    return folder


@pytest.fixture
def device_dir(tmp_path: Path) -> Path | None:
    """Character devices owned by gids 44 and 992 when this user may mknod, else None
    (then the gids come from pins only, and the compose check still runs)."""
    try:
        return make_dri(tmp_path)
    except PermissionError:
        return None


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_shipped_stack_passes_compose_config(name: str, scratch: Scratch, device_dir: Path | None,
                                             compose: Config) -> None:
    scratch.copy_shipped()
    dri = device_dir
    pins = {"extra": 1234} if dri else {"video": 44, "render": 992, "extra": 1234}
    scratch.write_config({"device_dir": str(dri) if dri else None, "gids": pins,
                          "companions": [{"name": "open-webui", "image": "ghcr.io/open-webui/open-webui:main",
                                          "port": 3000, "container_port": 8080}]})
    node = load_node(str(scratch.config))
    prepared = prepare(node, name)
    doc = compose(_write(prepared.rendered, scratch.root / "deploy"))
    vllm = doc["services"]["vllm"]
    stack = prepared.stack
    model = f"/models/{stack.model.path}"
    cmd = vllm["command"]
    if stack.entrypoint_style == "bash-c":
        assert cmd[:3] == ["vllm", "serve", model]        # pitfalls 1 and 2: program first, model resolved
    else:
        assert cmd[0] == model
    assert model and "${" not in " ".join(cmd)
    assert vllm["image"] == stack.image
    assert vllm["group_add"] == ["44", "992", "1234"]  # pitfall 3: numeric, never a group name
    if dri:
        assert vllm["devices"] == [{"source": str(dri), "target": str(dri), "permissions": "rwm"}]
    assert vllm["ports"][0]["published"] == "8000" and vllm["ports"][0]["target"] == 8000
    assert vllm["volumes"][0]["source"] == str(node.models_dir)
    assert vllm["volumes"][0]["read_only"] is True
    assert set(doc["services"]) == {"vllm", "open-webui"}
    assert "environment" not in doc["services"]["open-webui"]  # nothing the companion did not have (issue 33)


def test_dark_port_resolves(scratch: Scratch, compose: Config) -> None:
    scratch.copy_shipped()
    node = load_node(str(scratch.write_config({"bind_address": "127.0.0.1"})))
    r = prepare(node, "tq-256k", port=node.config.ports.dark, project="b70-dark").rendered
    doc = compose(_write(r, scratch.root / "dark"))
    port = doc["services"]["vllm"]["ports"][0]
    assert (port["host_ip"], port["published"]) == ("127.0.0.1", "8001")


TRICKY = {
    "PLAIN": "plain",
    "SPACES": "  lead and trail  ",
    "DOLLAR": "cost $5 ${HOME} $HOME $$",
    "SINGLE": "it's",
    "DOUBLE": 'say "hi"',
    "BOTH": "it's \"$HOME\" \\ back",
    "HASH": "value # not a comment",
    "EQUALS": "a=b=c",
    "BACKSLASH": "C:\\path\\n",
    "UNICODE": "ü ☃ 😀",
    "TAB": "a\tb",
    "EMPTY": "",
}


def test_env_quoting_round_trips_through_compose(tmp_path: Path, compose: Config) -> None:
    """_env_q: the .env (interpolation) and an env_file (container environment) both read back exactly."""
    folder = tmp_path / "envq"
    folder.mkdir()
    (folder / ".env").write_text("".join(f"{k}={_env_q(v)}\n" for k, v in TRICKY.items()))
    (folder / "runtime.env").write_text("".join(f"R_{k}={_env_q(v)}\n" for k, v in TRICKY.items()))
    interp = "\n".join(f"      I_{k}: \"${{{k}}}\"" for k in TRICKY)
    (folder / "docker-compose.yml").write_text(
        "services:\n  probe:\n    image: busybox\n    profiles: [gpu]\n    env_file: [runtime.env]\n"
        f"    environment:\n{interp}\n")
    env = compose(folder)["services"]["probe"]["environment"]
    for k, v in TRICKY.items():
        assert env[f"I_{k}"] == dollars(v), k
        assert env[f"R_{k}"] == dollars(v), k


def test_stack_env_and_odd_models_dir_reach_compose_exactly(scratch: Scratch, compose: Config) -> None:
    scratch.write_stack("odd", {**MINIMAL_STACK, "env": dict(TRICKY)})
    models = scratch.root / "my models $HOME 'q' #1"
    node = load_node(str(scratch.write_config({"models_dir": str(models)})))
    r = prepare(node, "odd").rendered
    vllm = compose(_write(r, scratch.root / "deploy"))["services"]["vllm"]
    assert vllm["volumes"][0]["source"] == dollars(str(models))
    for k, v in TRICKY.items():
        assert vllm["environment"][k] == dollars(v), k


def test_missing_dotenv_fails_loudly(scratch: Scratch, compose: Config) -> None:
    """Without the .env, Compose refuses instead of rendering `--model ""` (pitfall 2)."""
    from b70deploy.errors import OperationError

    scratch.copy_shipped()
    r = prepare(load_node(str(scratch.config)), "w4a16").rendered
    folder = _write(r, scratch.root / "deploy")
    (folder / ".env").unlink()
    with pytest.raises(OperationError, match=r"required variable \w+ is missing a value"):
        compose(folder)


ODD_ARGS = ["\ufffe", "\uffff", "a\x7fb", "\x85", "\x9f", "\u2028", "\u2029", "\ufeff", "😀", "\U0010ffff",
            'q"uote', "back\\slash", "x: y", "$HOME"]


def test_odd_characters_render_to_a_file_compose_parses(scratch: Scratch, compose: Config) -> None:
    """render() is total for any string the schema accepts, even ones the YAML loader would
    refuse: such characters are written as escapes and read back exactly."""
    from b70deploy.config.schema import Stack
    from b70deploy.render.devices import DeviceAccess
    from b70deploy.render.files import render

    stack = Stack.model_validate({**MINIMAL_STACK, "name": "odd", "extra_args": ODD_ARGS})
    r = render(stack, load_node(str(scratch.config)), DeviceAccess(device_dir=None))
    vllm = compose(_write(r, scratch.root / "deploy"))["services"]["vllm"]
    assert vllm["command"][-len(ODD_ARGS):] == [dollars(a) for a in ODD_ARGS]


def test_companion_volumes_resolve_with_fixed_names_in_prod_and_dark(scratch: Scratch, compose: Config) -> None:
    """Named volumes keep the name the operator wrote (no project prefix, so a renamed project
    or the dark project finds the same data); binds stay binds; `:ro` is kept."""
    scratch.copy_shipped()
    node = load_node(str(scratch.write_config({"companions": [
        {"name": "open-webui", "image": "ghcr.io/open-webui/open-webui:main",
         "volumes": ["open-webui:/app/backend/data", {"source": "/srv/webui-cfg", "target": "/cfg",
                                                      "read_only": True}]}]})))
    for port, project, folder in ((None, None, "deploy"), (node.config.ports.dark, "b70-dark", "dark")):
        doc = compose(_write(prepare(node, "tq-256k", port=port, project=project).rendered, scratch.root / folder))
        assert doc["volumes"] == {"open-webui": {"name": "open-webui"}}
        vols = doc["services"]["open-webui"]["volumes"]
        assert [(v["type"], v["source"], v["target"], v.get("read_only", False)) for v in vols] == [
            ("volume", "open-webui", "/app/backend/data", False), ("bind", "/srv/webui-cfg", "/cfg", True)]


@pytest.mark.parametrize("volume,why", [("webui", "is not SOURCE:TARGET"), ("webui:data", "not an absolute path"),
                                        ("we bui:/data", "neither a volume name"), ("/a:/b:rx", "SOURCE:TARGET")])
def test_a_bad_companion_volume_is_one_line_naming_the_key(scratch: Scratch, volume: str, why: str) -> None:
    cfg = scratch.write_config({"companions": [{"name": "w", "image": "img:1", "volumes": [volume]}]})
    with pytest.raises(UserError) as e:
        load_node(str(cfg))
    assert why in str(e.value) and "companions" in str(e.value) and "\n" not in str(e.value)
