"""Bad input to init, adopt and import: one line naming the file and the fix, exit 2, and
nothing written (no node config, no revision, no state dir)."""

from __future__ import annotations

from pathlib import Path

import pytest
import simkit
import yaml

pytestmark = pytest.mark.docker


@pytest.fixture
def node_cfg(tmp_path: Path, docker_engine: None) -> Path:
    folder = tmp_path / "b70-vllm"
    folder.mkdir()
    cfg = {"project": simkit.unique("none"), "deploy_dir": str(folder), "state_dir": str(tmp_path / "state"),
           "models_dir": str(tmp_path), "device_dir": None}
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def hand_compose(folder: Path, name: str, *, image: str = "${VLLM_IMAGE:?set it in .env}",
                 env_file: str | None = None) -> Path:
    vllm: dict[str, object] = {"image": image, "command": ["vllm", "serve", "/models/m"]}
    if env_file:
        vllm["env_file"] = env_file
    path = folder / name
    path.write_text(yaml.safe_dump({"services": {"vllm": vllm}}))
    return path


def fails(config: Path | None, *args: str, says: str) -> None:
    r = simkit.run_cli(config, *args, in_process=True)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "; fix: " in lines[0], r.stderr
    assert says in lines[0], lines[0]
    assert "Traceback" not in r.stderr


def nothing_written(config: Path) -> None:
    """No revision, no journal, no audit line (the lock file and the image cache may exist)."""
    state = config.parent / "state"
    assert not [p for p in ("revisions", "journal.jsonl", "audit.log") if (state / p).exists()]


def test_import_refuses_what_it_cannot_keep(node_cfg: Path) -> None:
    folder = node_cfg.parent / "b70-vllm"
    fails(node_cfg, "import", str(folder / "docker-compose.yml.gone"), says="cannot read")
    missing_env = hand_compose(folder, "docker-compose.yml.tq-rollback", env_file="vllm023.env")
    fails(node_cfg, "import", str(missing_env), "--as", "tq-256k", says="env_file vllm023.env of service vllm")
    (folder / "vllm023.env").write_text("HF_TOKEN=x\n")
    fails(node_cfg, "import", str(missing_env), "--as", "tq-256k", says="docker compose config rejects the files")
    absent = f"{simkit.unique('img')}/vllm:gone"
    (folder / ".env.tq-rollback").write_text(f"VLLM_IMAGE={absent}\n")
    fails(node_cfg, "import", str(missing_env), "--as", "tq-256k", says=f"image {absent} is not on this engine")
    fails(node_cfg, "import", str(missing_env), "--as", "TQ 256k", says="stack name (--as) 'TQ 256k' is not allowed")
    listed = hand_compose(folder, "docker-compose.yml.listed", env_file="secrets.list")
    fails(node_cfg, "import", str(listed), says="env_file secrets.list of service vllm does not end in .env")
    plain = hand_compose(folder, "docker-compose.yml")
    fails(node_cfg, "import", str(plain), says="names no stack")
    nothing_written(node_cfg)


def test_adopt_and_rollback_say_what_is_missing(node_cfg: Path) -> None:
    fails(node_cfg, "adopt", says="no vllm container in compose project")
    fails(node_cfg, "rollback", "tq-256k", "--yes", says="ever ran healthy or was imported")
    assert not (node_cfg.parent / "state" / "revisions").exists()


def test_init_names_an_unknown_project_and_writes_nothing(tmp_path: Path, docker_engine: None) -> None:
    target = tmp_path / "node.yaml"
    fails(None, "init", "--config", str(target), "--project", simkit.unique("nothing"),
          says="no container of compose project")
    assert not target.exists()
