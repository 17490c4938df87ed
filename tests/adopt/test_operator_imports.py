"""`import` carries the compose files operators really write (tests/fixtures/compose/), as the
bytes they are: a python -m launcher, an entrypoint script that builds its flags from the
environment, a bash -lc script, a hub model with its cache, ROCm's devices, and a vLLM service
not named `vllm` (the node config names it). Each becomes an unproven revision holding the
file, the .env and the files it reads from its folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import simkit
import yaml

from b70deploy.config.node import load_node
from b70deploy.state.statedir import StateDir

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compose"
ALL = ["nvidia-hub", "python-m", "python-m-command", "entrypoint-script", "bash-lc", "rocm", "vllm-server"]


def _folder(root: Path, name: str, image: str) -> Path:
    """The fixture with the sim image for its own (import pins an image the engine has), the
    weights and the hub cache it binds."""
    folder = root / name
    folder.mkdir()
    for src in (FIXTURES / name).iterdir():
        text = src.read_text()
        if src.name == "docker-compose.yml":
            text = re.sub(r"(?m)^(    image: )(?!caddy).*$", rf"\g<1>{image}", text)
        (folder / src.name).write_text(text)
    (folder / "models" / "Qwen" / "Qwen3-0.6B").mkdir(parents=True)
    (folder / "models" / "Qwen" / "Qwen3-0.6B" / "config.json").write_text("{}")
    for cache in (folder / "hf", root / "hf-cache"):
        snap = cache / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / "0123abc"
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "config.json").write_text("{}")
    (folder / ".env").write_text(f"HF_CACHE={root / 'hf-cache'}\nHF_TOKEN=hf_canary_0d1e\n")
    return folder


@pytest.mark.parametrize("name", ALL)
def test_import_carries_the_file_as_it_is(tmp_path: Path, sim_images: dict[str, str], name: str) -> None:
    folder = _folder(tmp_path, name, sim_images["serve"])
    service = next(iter(yaml.safe_load((folder / "docker-compose.yml").read_text())["services"]))
    project = simkit.unique("imp")
    cfg = {"project": project, "deploy_dir": str(tmp_path / "deploy"), "state_dir": str(tmp_path / "state"),
           "models_dir": str(folder / "models"), "device_dir": None, "service": service}
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump(cfg))
    try:
        result = simkit.run_cli(config, "import", str(folder / "docker-compose.yml"), "--as", name, "--json",
                                in_process=True)
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        assert out["created"] and out["stack"] == name
        assert "hf_canary" not in result.stdout + result.stderr
        rev = StateDir(load_node(str(config)).state_dir).revisions.get(out["revision"])
        files = rev.read_files()
        assert files["docker-compose.yml"] == (folder / "docker-compose.yml").read_bytes()
        assert files[".env"] == (folder / ".env").read_bytes()
        if name == "entrypoint-script":  # the script it runs is the deployment's too
            assert files["start.sh"] == (folder / "start.sh").read_bytes()
        assert rev.status.outcome == "unproven"
    finally:
        simkit.remove_keep_tags(project)


def test_import_names_the_service_it_looked_for(tmp_path: Path, sim_images: dict[str, str]) -> None:
    """A node config that names no service (vllm) refuses a file whose vLLM service is vllm-server,
    in one line that says how to name it."""
    folder = _folder(tmp_path, "vllm-server", sim_images["serve"])
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"project": simkit.unique("imp"), "state_dir": str(tmp_path / "state"),
                                      "deploy_dir": str(tmp_path / "deploy"), "device_dir": None}))
    result = simkit.run_cli(config, "import", str(folder / "docker-compose.yml"), "--as", "s", in_process=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "no service 'vllm' with an image in the compose file (it has proxy, vllm-server)" in result.stderr
    assert "service: NAME" in result.stderr and not (tmp_path / "state" / "revisions").exists()


def test_import_takes_the_projects_files_and_profile(tmp_path: Path, sim_images: dict[str, str]) -> None:
    """A saved copy of a project Compose ran as `-f compose.yaml -f compose.override.yaml --profile managed`
    (its vLLM behind a profile, as bklinkradt/arc-b70-llm-stack's): `import -f -f --profile` stores each file
    under the node's compose_files name, read with the node's profiles; a profile the node does not run
    is refused in one line, nothing stored (a rollback runs every revision with the node's profiles)."""
    folder = tmp_path / "saved"
    (folder / "models" / "Qwen" / "Qwen3-0.6B").mkdir(parents=True)
    (folder / "models" / "Qwen" / "Qwen3-0.6B" / "config.json").write_text("{}")
    (folder / "compose.yaml.small").write_text(yaml.safe_dump({"services": {"vllm": {
        "image": sim_images["serve"], "profiles": ["managed"], "command": ["/models/Qwen/Qwen3-0.6B"],
        "volumes": ["./models:/models:ro"], "ports": ["127.0.0.1:18000:8000"]}}}))
    (folder / "compose.override.yaml").write_text(yaml.safe_dump({"services": {"vllm": {
        "environment": {"VLLM_LOGGING_LEVEL": "INFO"}}}}))
    (folder / ".env").write_text("")
    project = simkit.unique("imp")
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({
        "project": project, "deploy_dir": str(tmp_path / "deploy"), "state_dir": str(tmp_path / "state"),
        "models_dir": str(folder / "models"), "device_dir": None, "profiles": ["managed"],
        "compose_files": ["compose.yaml", "compose.override.yaml"]}))
    argv = ["import", "-f", str(folder / "compose.yaml.small"), "-f", str(folder / "compose.override.yaml"),
            "--as", "small"]
    try:
        refused = simkit.run_cli(config, *argv, "--profile", "gpu", in_process=True)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "--profile gpu: the node runs profiles [managed]" in refused.stderr and "profiles:" in refused.stderr
        assert not (tmp_path / "state" / "revisions").exists()
        result = simkit.run_cli(config, *argv, "--profile", "managed", "--json", in_process=True)
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        files = StateDir(load_node(str(config)).state_dir).revisions.get(out["revision"]).read_files()
        assert files["compose.yaml"] == (folder / "compose.yaml.small").read_bytes()
        assert files["compose.override.yaml"] == (folder / "compose.override.yaml").read_bytes()
        assert "docker-compose.yml" not in files and not any("does not map" in w for w in out["warnings"])
    finally:
        simkit.remove_keep_tags(project)
