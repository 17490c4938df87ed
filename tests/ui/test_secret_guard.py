"""What the node knows is secret, and the guard on the CLI's streams: the node's secrets file and
its companions' secrets (by name or marked), the values env files mark (mode 0600, or a secret
name), and stdout/stderr that show each value only as render/masking.mask of it."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pytest
import yaml
from rich.console import Console
from simkit import run_cli

from b70deploy.actions.init import Discovery, plan
from b70deploy.config.node import load_node
from b70deploy.docker.discover import LiveProject, LiveService
from b70deploy.render import devices
from b70deploy.render.masking import Secrets, mask
from b70deploy.ui.notice import exposed_config, marked_values, node_secrets
from b70deploy.ui.output import guard

SECRET = "hf_GuardedValue123"


def test_every_stream_of_the_cli_masks_the_nodes_secret_values(capsys: pytest.CaptureFixture[str]) -> None:
    guard(Secrets(values=frozenset({SECRET})))
    guard(Secrets(values=frozenset({SECRET, "second-secret"})))  # a second node load wraps once, not twice
    click.echo(f"out {SECRET}")
    click.echo(f"err {SECRET} second-secret", err=True)
    print(f"print {SECRET}")
    Console(stderr=True).print(f"rich {SECRET}")
    out, err = capsys.readouterr()
    assert SECRET not in out + err and "second-secret" not in err
    assert out.count(mask(SECRET)) == 2 and err.count(mask(SECRET)) == 2 and mask("second-secret") in err
    assert not hasattr(sys.stdout, "buffer")  # click would write around the guard to a buffer


def test_the_node_knows_its_secrets_file_and_its_companions_secrets(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.env"
    secrets.write_text(f"SERVICE_URL=https://u:{SECRET}@h\n")
    secrets.chmod(0o600)
    (tmp_path / "node.yaml").write_text(yaml.safe_dump({
        "state_dir": str(tmp_path / "state"), "secrets_env_file": str(secrets),
        "companions": [{"name": "webui", "image": "ghcr.io/open-webui/open-webui:main", "secrets": ["SIGNING"],
                        "environment": {"WEBUI_SECRET_KEY": "k3y-value", "SIGNING": "s1gning", "NAME": "chat",
                                        "DB_PASSWORD": "${DB_PASSWORD}"}}]}))
    found = node_secrets(load_node(str(tmp_path / "node.yaml")))
    assert found.values == {f"https://u:{SECRET}@h", "k3y-value", "s1gning"}  # a ${VAR} reference is none
    assert found.keys == {"SERVICE_URL", "SIGNING"}


def test_env_files_mark_all_their_values_when_private_and_secret_names_always(tmp_path: Path) -> None:
    private, shared = tmp_path / "webui.env", tmp_path / ".env"
    private.write_text("SIGNING=s1gning-key\nPORT=8080\n")
    private.chmod(0o600)
    shared.write_text("DB_PASSWORD=dbpass-123\nVLLM_IMAGE=vllm/vllm-openai:v0.11.0\n")
    shared.chmod(0o644)
    assert marked_values([private, shared, tmp_path / "missing.env"]) == {"s1gning-key", "dbpass-123"}


def test_init_marks_a_companions_variables_that_hold_a_marked_value(tmp_path: Path) -> None:
    """Compose's config inlines .env and env_file: init finds each companion variable holding a
    value they marked, lists it in `secrets:`, masks it in all it prints and writes the file 0600."""
    box = LiveService(name="vllm", container="p-vllm-1", status="running", image_ref="vllm/vllm-openai",
                      image_id="sha256:0", runs_vllm=True)
    webui = LiveService(name="webui", container="p-webui-1", status="running", image_ref="open-webui",
                        image_id="sha256:1", runs_vllm=False)  # a companion is a service Compose runs
    project = LiveProject(name="p", working_dir=tmp_path, services={"vllm": box, "webui": webui},
                          config_files=[tmp_path / "docker-compose.yml"], env_files=[])
    doc = {"services": {"vllm": {"image": "vllm/vllm-openai", "command": ["vllm", "serve", "/models/m"]},
                        "webui": {"image": "ghcr.io/open-webui/open-webui:main", "environment": {
                            "DATABASE_URL": "postgres://app:dbpass-123@db/app", "WEBUI_NAME": "chat",
                            "ADMIN_PASSWORD": "inline-pw"}}}}
    d = Discovery(compose=doc, compose_text=b"", chosen=project, access=devices.DeviceAccess(device_dir=None),
                  device_dir=tmp_path / "dri", secret_values=frozenset({"dbpass-123"}))
    result = plan(d, tmp_path / "state")
    [webui] = result.config["companions"]
    assert webui["secrets"] == ["DATABASE_URL"] and result.secret
    shown = result.text(masked=True) + str(result.to_dict()) + " ".join(f.shown() for f in result.facts)
    assert "dbpass-123" not in shown and "inline-pw" not in shown and mask("inline-pw") in shown
    assert "dbpass-123" in result.text()  # the file init writes (0600) holds the value
    assert any("the companions hold secrets (ADMIN_PASSWORD, DATABASE_URL)" in n for n in result.notes)


def test_a_node_config_others_can_read_that_holds_secrets_is_named_with_the_fix(tmp_path: Path) -> None:
    """A hand-written config (init writes one with secrets 0600): its companions' secrets, by name or
    marked, and a token in a webhook's URL are named with `chmod 600 FILE`, their values never; a
    private file, or one holding only references and settings about secrets, says nothing."""
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({
        "state_dir": str(tmp_path / "state"), "secrets_env_file": "/etc/b70/secrets.env",
        "secret_variables": ["API_USERS"], "notify": {"webhooks": [f"https://hooks.example/b70?token={SECRET}"]},
        "companions": [{"name": "webui", "image": "ghcr.io/open-webui/open-webui:main", "secrets": ["SIGNING"],
                        "environment": {"WEBUI_SECRET_KEY": "k3y-value", "SIGNING": "s1gning", "NAME": "chat",
                                        "DB_PASSWORD": "${DB_PASSWORD}"}}]}))
    config.chmod(0o644)
    said = exposed_config(config)
    assert said == (f"{config} holds secrets (SIGNING, WEBUI_SECRET_KEY, webhooks) and is mode 644: others can "
                    f"read them; chmod 600 {config}")
    config.chmod(0o640)
    assert exposed_config(config) is not None and "mode 640" in str(exposed_config(config))
    config.chmod(0o600)
    assert exposed_config(config) is None
    config.write_text(yaml.safe_dump({"secrets_env_file": "/etc/b70/secrets.env", "companions": [
        {"name": "webui", "image": "ghcr.io/open-webui/open-webui:main",
         "environment": {"WEBUI_SECRET_KEY": "${WEBUI_SECRET_KEY}", "NAME": "chat"}}]}))
    config.chmod(0o644)
    assert exposed_config(config) is None and exposed_config(None) is None


def test_every_command_that_reads_an_exposed_node_config_warns_once_and_goes_on(tmp_path: Path) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "companions": [
        {"name": "webui", "image": "ghcr.io/open-webui/open-webui:main",
         "environment": {"WEBUI_SECRET_KEY": "k3y-value"}}]}))
    config.chmod(0o644)
    shown = run_cli(config, "history", in_process=True)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.count("\n") == 1 and "k3y-value" not in shown.stdout + shown.stderr
    assert shown.stderr == (f"warning: {config} holds secrets (WEBUI_SECRET_KEY) and is mode 644: others can read "
                            f"them; chmod 600 {config}\n")
    config.chmod(0o600)
    assert run_cli(config, "history", in_process=True).stderr == ""
