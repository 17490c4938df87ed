"""`b70deploy export k8s` as an operator runs it (issue 38): every catalogue stack written to a
folder, the patched ones from a revision's stored bytes, and not one byte of the node's secrets in
any file or output; the same input gives the same file; bad input is one line, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from kit.k8s import CANARY, OVERRIDE, switch_render, validate
from kit.lintnode import SIM_BASH_C, write_node
from kit.scratch import SHIPPED_STACKS, Scratch
from simkit import run_cli

from b70deploy.actions.handmade import folder_files
from b70deploy.config.node import load_node
from b70deploy.state.revisions import RevisionStore

DIGEST = "intel/vllm@sha256:" + "ab" * 32


def _node(scratch: Scratch) -> Path:
    scratch.copy_shipped()
    secrets = scratch.root / "secrets.env"
    secrets.write_text(f"HF_TOKEN='{CANARY}'\nSTACK_KEY={OVERRIDE}\n")
    secrets.chmod(0o600)
    return scratch.write_config({"secrets_env_file": str(secrets)})


def _everything(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_every_stack_exported_without_a_secret(scratch: Scratch, tmp_path: Path) -> None:
    config = _node(scratch)
    node = load_node(str(config))
    store = RevisionStore(node.state_dir)
    out, said = tmp_path / "k8s", []
    for name in SHIPPED_STACKS:
        stack = node.catalogue().load(name)
        if stack.patches:  # its patched files come from the image: the revision of a switch that ran it
            rev = store.create(stack=name, kind="switch", files=switch_render(node, stack).files,
                               image_ref=stack.image, image_id="sha256:" + "cd" * 32, repo_digest=DIGEST,
                               operator="t@h", message="", created="2026-12-06T00:00:00+0000",
                               stack_doc=stack.model_dump(mode="json"))
            args = ["--revision", str(rev.number)]
        else:
            args = [name, "--no-docker"]
        for extra in ([], ["--json"]):
            r = run_cli(config, "export", "k8s", *args, "--out", str(out), *extra, in_process=True, check=True)
            said += [r.stdout, r.stderr]
        r = run_cli(config, "export", "k8s", *args, "--namespace", "llm", in_process=True, check=True)
        said += [r.stdout, r.stderr]
        printed = list(yaml.safe_load_all(r.stdout))
        assert {o["metadata"]["namespace"] for o in printed} == {"llm"}
        written = list(yaml.safe_load_all((out / f"b70-{name}.yaml").read_bytes()))
        assert [o["kind"] for o in written] == [o["kind"] for o in printed]
        deployment = written[-1]
        if stack.patches:
            validate(written)
            assert deployment["metadata"]["annotations"]["b70deploy/revision"] == str(rev.number)
            assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == DIGEST
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(f"b70-{n}.yaml" for n in SHIPPED_STACKS)
    first = _everything(out)
    for name in SHIPPED_STACKS:  # once more: the same bytes
        stack = node.catalogue().load(name)
        if not stack.patches:
            run_cli(config, "export", "k8s", name, "--no-docker", "--out", str(out), in_process=True, check=True)
    assert _everything(out) == first
    for blob in (first, "".join(said).encode()):
        assert CANARY.encode() not in blob and OVERRIDE.encode() not in blob
        assert b"hf_CANARY" not in blob and b"override-41c2" not in blob
    summary = json.loads(run_cli(config, "export", "k8s", "qwen35", "--no-docker", "--json",
                                 in_process=True, check=True).stdout)
    assert summary["secret"] == {"name": "b70-qwen35-secrets", "keys": ["HF_TOKEN", "STACK_KEY"]}
    assert [o["kind"] for o in summary["objects"]] == ["Service", "Deployment"]
    model = node.catalogue().load("qwen35").model.path
    assert summary["args"][:3] == ["vllm", "serve", f"{node.config.models_target}/{model}"]


def test_bad_input_is_one_line(scratch: Scratch, tmp_path: Path) -> None:
    config = _node(scratch)
    cases = {
        ("qwen35", "--namespace", "Bad_NS"): "--namespace",
        ("qwen35", "--models-claim", "a/b"): "--models-claim",
        ("w4a16", "--no-docker"): "patch marlin-xpu-carveout",
        ("--revision", "7"): "no revision 7",
        (): "a STACK or --revision N",
        ("qwen35", "--revision", "1"): "a STACK or --revision N",
        ("no-such-stack", "--no-docker"): "no-such-stack",
        ("qwen35", "--no-docker", "--helm-values"): "entrypoint_style bash-c",
    }
    for args, want in cases.items():
        r = run_cli(config, "export", "k8s", *args, "--out", str(tmp_path / "k"), in_process=True)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "k").exists()


@pytest.mark.docker
@pytest.mark.usefixtures("sim_images")
def test_patched_stack_from_the_image(tmp_path: Path) -> None:
    """With the engine, a patched stack's ConfigMaps hold the file as the image's vllm package has
    it, edited: the bytes a switch bind-mounts (the sim image carries the stand-in package)."""
    models = tmp_path / "models"
    models.mkdir()
    config = write_node(tmp_path, models)
    node = load_node(str(config))
    r = run_cli(config, "export", "k8s", "w4a16", "--json", "--out", str(tmp_path / "k"), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout)
    objects = list(yaml.safe_load_all(Path(summary["file"]).read_bytes()))
    validate(objects)
    stack = node.catalogue().load("w4a16")
    want = switch_render(node, stack).files
    [cm] = [o for o in objects if o["kind"] == "ConfigMap"]
    rel = cm["metadata"]["annotations"]["b70deploy/file"]
    assert rel == "patches/marlin-xpu-carveout/marlin_utils.py"
    assert next(iter(cm["data"].values())).encode() == want[rel]
    container = objects[-1]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == stack.image == SIM_BASH_C
    assert summary["args"] == [node.config.models_target + "/" + stack.model.path if a == "${VLLM_MODEL}" else a
                               for a in switch_render(node, stack).command]


OPERATOR = Path(__file__).parents[1] / "fixtures/compose"


def _imported(config: Path, folder: str, env: str, compose_text: str | None = None) -> int:
    """A hand-made deployment kept as `import` keeps it: the compose file and the .env it reads
    (actions/handmade.py folder_files), stored as a revision."""
    copy = config.parent / "operator" / folder  # a copy, with the folders its binds name (the fixtures' README)
    if compose_text is None:
        shutil.copytree(OPERATOR / folder, copy)
        (copy / "hf").mkdir()
    else:
        copy.mkdir(parents=True, exist_ok=True)
        (copy / "docker-compose.yml").write_text(compose_text)
    compose = copy / "docker-compose.yml"
    dotenv = config.parent / f"{folder}.env"
    dotenv.write_text(env)
    node = load_node(str(config))
    rev = RevisionStore(node.state_dir).create(
        stack=folder, kind="import", files=folder_files(compose, dotenv), image_ref="vllm/vllm-openai:v0.10.1",
        image_id="sha256:" + "ef" * 32, repo_digest=None, operator="t@h", message="",
        created="2026-12-06T00:00:00+0000", outcome="unproven")
    return rev.number


def test_operator_compose_revision(scratch: Scratch) -> None:
    """An operator's own compose file (the official image, a hub model, a token from the shell),
    imported: exported with its string command split as Compose splits it, the token only by
    reference, and every object valid."""
    config = scratch.write_config({"platform": "cuda"})
    number = _imported(config, "nvidia-hub", f"HF_TOKEN={CANARY.replace('$', '')}\nHF_CACHE={scratch.root}/hf\n")
    r = run_cli(config, "export", "k8s", "--revision", str(number), "--json", in_process=True, check=True)
    summary = json.loads(r.stdout)
    assert summary["secret"]["keys"] == ["HUGGING_FACE_HUB_TOKEN"]
    assert summary["args"][:4] == ["--model", "Qwen/Qwen3-0.6B", "--served-model-name", "qwen3-0.6b"]
    assert any("runtime" in n for n in summary["notes"])  # a key not exported is named
    r = run_cli(config, "export", "k8s", "--revision", str(number), in_process=True, check=True)
    objects = list(yaml.safe_load_all(r.stdout))
    validate(objects)
    container = objects[-1]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.10.1"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"} in container["env"]
    assert "hf_CANARY" not in r.stdout + r.stderr


def test_a_secret_in_the_command_is_refused(scratch: Scratch) -> None:
    config = scratch.write_config({"platform": "cuda"})
    for command in ('["--model", "m", "--api-key", "${KEY}"]', '["--model", "m", "--api-key=sk-CANARY"]'):
        text = f"services:\n  vllm:\n    image: vllm/vllm-openai:v0.10.1\n    command: {command}\n"
        number = _imported(config, "hand", "KEY=sk-CANARY\n", compose_text=text)
        r = run_cli(config, "export", "k8s", "--revision", str(number), in_process=True)
        assert r.returncode == 2 and "holds a secret" in r.stderr and "sk-CANARY" not in r.stdout + r.stderr


def test_operator_service_behind_a_proxy(scratch: Scratch) -> None:
    """A service not named vllm, expose-only, its hub cache a folder beside the compose file: the
    port is the file's own, the relative folder is named in a note instead of a hostPath, and
    the chart's values are refused (the command has no prefix-caching flag the chart would keep)."""
    config = scratch.write_config({"platform": "cuda", "service": "vllm-server"})
    number = _imported(config, "vllm-server", "")
    r = run_cli(config, "export", "k8s", "--revision", str(number), "--json", in_process=True, check=True)
    summary = json.loads(r.stdout)
    assert any("./hf:/root/.cache/huggingface not exported" in n for n in summary["notes"])
    r = run_cli(config, "export", "k8s", "--revision", str(number), "--hf-cache-claim", "hf", in_process=True,
                check=True)
    objects = list(yaml.safe_load_all(r.stdout))
    validate(objects)
    pod = objects[-1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["ports"][0]["containerPort"] == 8000
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf"}} in pod["volumes"]
    r = run_cli(config, "export", "k8s", "--revision", str(number), "--helm-values", in_process=True)
    assert r.returncode == 2 and "prefix-caching flag" in r.stderr
