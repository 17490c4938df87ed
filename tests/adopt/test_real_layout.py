"""The operator's real node, on the real engine: a layout built to differ from day one's in every
way the field report's own hand-run box does (its author's public launch script and patch folder
were the model). Weights bound at /llms with the models below huggingface/, not at /models; an
open-webui companion with a named data volume, a container_name and a security_opt; the marlin
fix mounted by absolute path from outside the compose folder, a file the image lacks, a whole
directory, and sitecustomize.py through PYTHONPATH; a saved TurboQuant copy whose command is
`bash -c "python3 -c '...' && vllm serve ..."`; an image whose WORKDIR holds a vllm/ folder
that shadows the installed package.

Through init, adopt, both imports, a switch to a catalogue stack, then rollback to the adopted
revision by stack name, to the TurboQuant copy, and to the adopted revision by number. Each step
is checked from outside: the container's image, argv and mounts by inspection, a completion from
the port, the companion's data file and name, the deploy dir's bytes. Last, with the models
folder gone from the host, the switch exits 2 at preflight and the old stack still answers."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import simkit
import yaml
from kit.simnode import completion, docker, service_box

from b70deploy.sim.box import write_models
from b70deploy.sim.vllm_tree import GPTQ_REL, MARLIN_REL, VARIANTS, vllm_files

pytestmark = pytest.mark.docker

SITE = next(v.site_packages for v in VARIANTS if v.name == "bash-c")
MARLIN_TARGET = f"{SITE}/vllm/{MARLIN_REL}"
GPTQ_TARGET = f"{SITE}/vllm/{GPTQ_REL}"
TQ_DIR = f"{SITE}/vllm/model_executor/layers/quantization/turboquant"
WEIGHTS = "/llms/huggingface/Qwen"
NGRAM = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'
COMMON = ["--host", "0.0.0.0", "--port", "8000", "--dtype", "float16", "--max-model-len", "262144",
          "--enable-prefix-caching", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
PRELUDE = "python3 -c 'import sys; sys.path.insert(0, \"/opt\"); import turboquant_register'"
WEBUI_DATA = "/app/backend/data"


def shadowed_image(base: str, tag: str) -> None:
    """`base` with WORKDIR /workspace holding a copy of the vllm/ tree (the report's fix 4: a
    working dir that shadows the installed package for `python3 -c`, not for the `vllm` script)."""
    box = docker("create", base, "true").stdout.strip()
    try:
        with tempfile.TemporaryDirectory(prefix="b70test-shadow-") as tmp:
            for rel, text in vllm_files(next(v for v in VARIANTS if v.name == "bash-c")).items():
                (Path(tmp) / "workspace" / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / "workspace" / rel).write_text(text)
            assert docker("cp", f"{tmp}/workspace", f"{box}:/workspace").returncode == 0
        assert docker("commit", "--change", "WORKDIR /workspace", box, tag).returncode == 0
    finally:
        docker("rm", "-f", box, check=False)


@dataclass
class RealNode:
    root: Path
    folder: Path
    outside: Path
    llms: Path
    project: str
    port: int
    tags: dict[str, str]
    webui_name: str
    config: Path
    originals: dict[str, bytes]

    def cli(self, *args: str, code: int | None = 0, config: bool = True) -> subprocess.CompletedProcess[str]:
        r = simkit.run_cli(self.config if config else None, *args, timeout=300)
        if code is not None:
            assert r.returncode == code, (args, r.stdout, r.stderr)
        return r

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def completion(self, model: str) -> dict[str, Any]:
        return completion(self.port, model)

    def vllm_box(self) -> dict[str, Any]:
        return service_box(self.project)

    def mounts(self) -> dict[str, str]:
        """The vllm container's mounts, target -> source, as the engine reports them."""
        return {m["Destination"]: m["Source"] for m in self.vllm_box()["Mounts"]}

    def webui_db(self) -> str:
        """The first line of webui.db (its random id), read by the container of that name once its
        process has started (the companions step starts it and returns)."""
        deadline = time.monotonic() + 30
        while True:
            out = docker("exec", self.webui_name, "cat", f"{WEBUI_DATA}/webui.db", check=False)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.splitlines()[0]
            assert time.monotonic() < deadline, out.stderr
            time.sleep(0.2)

    def image_id(self, tag: str) -> str:
        return docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()


def compose_file(node_paths: dict[str, str], *, command: list[str], extra_mounts: list[str]) -> str:
    vllm: dict[str, Any] = {
        "image": "${VLLM_IMAGE}", "profiles": ["gpu"], "command": command, "env_file": "vllm023.env",
        "environment": {"PYTHONPATH": f"/opt/tq:{SITE}"},
        "ports": ["127.0.0.1:${VLLM_PORT}:8000"], "shm_size": "16g", "ipc": "host",
        "volumes": [f"{node_paths['llms']}:/llms:ro",
                    f"{node_paths['outside']}/sitecustomize.py:/opt/tq/sitecustomize.py:ro", *extra_mounts]}
    webui = {"image": "${WEBUI_IMAGE}", "profiles": ["gpu"], "container_name": node_paths["webui"],
             "command": ["sim-webui", "--port", "8080", "--data", WEBUI_DATA],
             "security_opt": ["seccomp=unconfined"], "ports": ["127.0.0.1:${WEBUI_PORT}:8080"],
             "volumes": [f"webui-data:{WEBUI_DATA}"]}
    return yaml.safe_dump({"services": {"vllm": vllm, "open-webui": webui}, "volumes": {"webui-data": {}}},
                          sort_keys=False)


@pytest.fixture
def real_node(tmp_path: Path, sim_images: dict[str, str], free_port: Callable[[], int]) -> Iterator[RealNode]:
    project = simkit.unique("real")
    folder, outside, llms = tmp_path / project, tmp_path / "opt-patches", tmp_path / "llms"
    folder.mkdir()
    tags = {"prod": f"{project}/vllm:latest", "tq": f"{project}/vllm-xpu:0.19.0-tr5"}
    webui_name = f"{project}-open-webui"
    port, webui_port = free_port(), free_port()
    node = RealNode(root=tmp_path, folder=folder, outside=outside, llms=llms, project=project, port=port, tags=tags,
                    webui_name=webui_name, config=tmp_path / "node.yaml", originals={})
    try:
        shadowed_image(sim_images["bash-c"], tags["prod"])
        docker("tag", sim_images["bash-c"], tags["tq"])
        write_models(llms / "huggingface")
        marlin = simkit.image_file(tags["prod"], MARLIN_TARGET).decode()
        gptq = simkit.image_file(tags["tq"], GPTQ_TARGET).decode()
        hand = {
            # Outside the compose folder, by absolute path: the marlin fix (replaces an image file),
            # the TurboQuant registration (a file the image lacks), its quantizer (a directory).
            "vllm-patches/marlin_utils.py": marlin.replace(
                "if current_platform.is_rocm():", "if current_platform.is_rocm() or current_platform.is_xpu():"),
            "vllm-patches/gptq.py": gptq.replace(
                "if current_platform.is_cuda_alike():",
                "if current_platform.is_cuda_alike() or current_platform.is_xpu():"),
            "turboquant_register.py": "# registers the TurboQuant KV presets (stand-in)\n",
            "turboquant/__init__.py": '"""TurboQuant quantizer (stand-in)."""\n',
            "turboquant/quantizer.py": "BITS = {'k3v4_nc': (3, 4)}\n",
            "sitecustomize.py": "# loaded at start by every Python on PYTHONPATH (the report's import hooks)\n",
        }
        for name, text in hand.items():
            (outside / name).parent.mkdir(parents=True, exist_ok=True)
            (outside / name).write_text(text)
        paths = {"llms": str(llms), "outside": str(outside), "webui": webui_name}
        prod_mounts = [f"{outside}/vllm-patches/marlin_utils.py:{MARLIN_TARGET}:ro",
                       f"{outside}/turboquant_register.py:/opt/turboquant_register.py:ro",
                       f"{outside}/turboquant:{TQ_DIR}:ro"]
        w4a16 = ["vllm", "serve", f"{WEIGHTS}/Qwen3-30B-A3B-W4A16", "--served-model-name", "qwen3-30b-a3b-w4a16",
                 "qwen3-30b-tq-256k", *COMMON, "--kv-cache-dtype", "fp8"]
        tq_serve = [f"{WEIGHTS}/Qwen3-30B-A3B-GPTQ-Int4", "--served-model-name", "qwen3-30b-tq-256k", *COMMON,
                    "--kv-cache-dtype", "turboquant_k3v4_nc", "--max-num-seqs", "4"]
        env = f"VLLM_PORT={port}\nWEBUI_IMAGE={tags['tq']}\nWEBUI_PORT={webui_port}\n"
        files = {
            "docker-compose.yml": compose_file(paths, command=[*w4a16, "--speculative-config", NGRAM],
                                               extra_mounts=prod_mounts),
            ".env": f"VLLM_IMAGE={tags['prod']}\n{env}",
            "vllm023.env": "HF_TOKEN=hf_realnodecanary\nB70SIM_BOOT_SECONDS=1\nB70SIM_DECODE_TPS=500\n",
            "docker-compose.yml.pre-ngram": compose_file(paths, command=w4a16, extra_mounts=prod_mounts),
            "docker-compose.yml.tq-rollback": compose_file(
                paths, command=["bash", "-c", f"{PRELUDE} && vllm serve {' '.join(tq_serve)}"],
                extra_mounts=[f"{outside}/vllm-patches/gptq.py:{GPTQ_TARGET}:ro",
                              f"{outside}/turboquant_register.py:/opt/turboquant_register.py:ro",
                              f"{outside}/turboquant:{TQ_DIR}:ro"]),
            ".env.tq-rollback": f"VLLM_IMAGE={tags['tq']}\n{env}",
        }
        for name, text in files.items():
            (folder / name).write_text(text)
            if name.endswith(".env") or ".env." in name:
                os.chmod(folder / name, 0o600)
        node.originals = {n: t.encode() for n, t in files.items()}
        simkit.up_by_hand(folder, f"http://127.0.0.1:{port}/health")
        yield node
    finally:
        simkit.remove_by_project(project)
        docker("rm", "-f", webui_name, check=False)
        docker("volume", "rm", f"{project}_webui-data", check=False)
        simkit.remove_keep_tags(project)
        docker("rmi", *tags.values(), check=False)


def test_the_real_layout_is_adopted_whole_and_always_has_a_way_back(real_node: RealNode) -> None:
    node, folder = real_node, real_node.folder
    prod_id, tq_id = node.image_id(node.tags["prod"]), node.image_id(node.tags["tq"])
    data_id = node.webui_db()

    # ---- init: the weights bind at /llms, the models folder above org/name, the companion whole
    out = node.cli("init", "--config", str(node.config), "--project", node.project,
                   "--state-dir", str(node.root / "state"), config=False)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(node.config.read_text())
    assert cfg["models_dir"] == str(node.llms / "huggingface") and cfg["models_target"] == "/llms/huggingface"
    [webui] = cfg["companions"]
    assert webui["container_name"] == node.webui_name
    assert webui["volumes"] == [{"source": f"{node.project}_webui-data", "target": WEBUI_DATA, "read_only": False}]
    assert "security_opt" in webui["compose"], webui   # carried, through the companion's passthrough
    with node.config.open("a") as fh:  # test environment only: the catalogue's images are this test's tags
        fh.write(yaml.safe_dump({
            "image_map": {"intel/vllm:latest": node.tags["prod"], "vllm-xpu:0.19.0-tr5": node.tags["tq"]},
            "stack_overlay": {"settle_seconds": 0.5}, "load_threshold": 1000,
            "timeouts": {"health": 60, "rollback": 60, "poll_interval": 0.2}}))

    # ---- adopt: every mount recorded, wherever its source is
    got = node.json("adopt", "--as", "ngram")
    assert got["revision"] == 1 and got["outcome"] == "deployed"
    kinds = {p["target"]: p.get("kind", "patch") for p in got["patches"]}
    assert kinds == {MARLIN_TARGET: "patch", "/opt/turboquant_register.py": "added", TQ_DIR: "overlay",
                     "/opt/tq/sitecustomize.py": "added"}, got["patches"]
    marlin = next(p for p in got["patches"] if p["target"] == MARLIN_TARGET)
    assert "+    if current_platform.is_rocm() or current_platform.is_xpu():" in marlin["diff"]
    assert all(p["sha256"] for p in got["patches"])

    # ---- import both copies: the plain one and the bash -c one both pass (lint only warns)
    tq = node.json("import", str(folder / "docker-compose.yml.tq-rollback"), "--as", "tq-256k")
    assert tq["revision"] == 2 and {p["target"] for p in tq["patches"]} >= {GPTQ_TARGET, TQ_DIR}
    pre = node.json("import", str(folder / "docker-compose.yml.pre-ngram"), "--as", "w4a16")
    assert pre["revision"] == 3
    made = node.json("stack", "from-compose", str(folder / "docker-compose.yml.tq-rollback"), "--env",
                     str(folder / ".env.tq-rollback"), "--name", "tq-hand", "-o", str(node.root / "tq-hand.yaml"))
    assert made["stack_doc"]["prelude"] == PRELUDE and made["stack_doc"]["kv_cache_dtype"] == "turboquant_k3v4_nc"
    assert made["node"]["models_target"] == "/llms/huggingface"

    # ---- switch eagle3: rendered, weights bound where they are, the patch over the file the server imports
    node.cli("switch", "eagle3", "--yes")
    box = node.vllm_box()
    assert box["Config"]["Labels"].get("b70deploy.stack") == "eagle3" and box["Image"] == prod_id
    mounts = node.mounts()
    assert mounts["/llms/huggingface"] == str(node.llms / "huggingface")
    assert MARLIN_TARGET in mounts and not any(t.startswith("/workspace") for t in mounts)
    assert f"{WEIGHTS}/Qwen3-30B-A3B-W4A16" in box["Args"]
    assert node.completion("qwen3-30b-a3b-w4a16")["model"] == "qwen3-30b-a3b-w4a16"
    assert node.webui_db() == data_id   # same name, same data volume

    # ---- rollback ngram: the adopted bytes, by stack name
    node.cli("rollback", "ngram", "--yes")
    box = node.vllm_box()
    assert NGRAM in box["Args"] and box["Image"] == prod_id and "b70deploy.stack" not in (box["Config"]["Labels"] or {})
    mounts = node.mounts()
    assert mounts[MARLIN_TARGET] == str(node.outside / "vllm-patches/marlin_utils.py")
    assert mounts[TQ_DIR] == str(node.outside / "turboquant") and mounts["/llms"] == str(node.llms)
    for name in ("docker-compose.yml", ".env", "vllm023.env"):
        assert (folder / name).read_bytes() == node.originals[name], name
    assert node.completion("qwen3-30b-a3b-w4a16")["model"] == "qwen3-30b-a3b-w4a16"
    assert node.webui_db() == data_id

    # ---- rollback tq-256k: the bash -c copy, smoke-tested on the one alias it serves
    node.cli("rollback", "tq-256k", "--yes")
    box = node.vllm_box()
    assert box["Image"] == tq_id and box["Path"] == "/bin/bash"
    script = box["Args"][-1]
    assert script.startswith(PRELUDE) and "turboquant_k3v4_nc" in script
    assert node.mounts()[GPTQ_TARGET] == str(node.outside / "vllm-patches/gptq.py")
    assert node.completion("qwen3-30b-tq-256k")["model"] == "qwen3-30b-tq-256k"
    assert node.json("history")[-1]["outcome"] == "deployed"

    # ---- rollback 1: the adopted revision by number, never mapped onto a catalogue stack
    node.cli("rollback", "1", "--yes")
    box = node.vllm_box()
    assert NGRAM in box["Args"] and box["Image"] == prod_id
    assert (folder / "docker-compose.yml").read_bytes() == node.originals["docker-compose.yml"]
    rows = node.json("history")
    assert (rows[-1]["kind"], rows[-1]["restored_from"], rows[-1]["outcome"]) == ("rollback", 1, "deployed")
    status = node.json("status")
    assert status["current"]["number"] == rows[-1]["number"] and status["differs"] == []
    assert node.webui_db() == data_id

    # ---- a recorded mount changed on the host: status and rollback say so
    (node.outside / "turboquant/quantizer.py").write_text("BITS = {}\n")
    assert any("turboquant" in m for m in node.json("status")["mounts_changed"])

    # ---- the models folder gone from the host: the switch stops at preflight, exit 2, old stack serves
    (node.llms / "huggingface").rename(node.llms / "huggingface.away")
    try:
        refused = node.cli("switch", "eagle3", "--yes", code=2)
        assert "models-dir-missing" in refused.stderr, refused.stderr
        assert NGRAM in node.vllm_box()["Args"]
        assert node.completion("qwen3-30b-a3b-w4a16")["model"] == "qwen3-30b-a3b-w4a16"
    finally:
        (node.llms / "huggingface.away").rename(node.llms / "huggingface")
