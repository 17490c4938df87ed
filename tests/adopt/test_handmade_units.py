"""The pure parts of taking over a hand-run node: which files a compose file reads from its
folder, the command -> stack mapping lint uses, init's config from what discovery found,
which revision `rollback STACK` picks, the drift check of a moved image tag, and the masking
of an adopted env_file in `diff REV REV`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import Scratch

from b70deploy.actions.handmade import PatchRecord, check_drift, folder_files, lint_stack_of
from b70deploy.actions.init import Discovery, Fact, plan
from b70deploy.actions.inspect import diff_revisions, differences
from b70deploy.actions.rollback import handmade_origin
from b70deploy.config.compose_folder import Reference, references
from b70deploy.config.node import load_node
from b70deploy.config.schema import NodeConfig
from b70deploy.deploy.deploydir import deployed_names
from b70deploy.docker.discover import LiveProject, LiveService
from b70deploy.docker.image_inspect import ImageFacts
from b70deploy.errors import UserError
from b70deploy.render.devices import DeviceAccess
from b70deploy.render.patches import sha256
from b70deploy.state.revisions import RevisionStore
from b70deploy.state.statedir import StateDir

COMPOSE = """
services:
  vllm:
    image: ${VLLM_IMAGE}
    env_file: vllm023.env
    volumes:
      - ${MODELS_DIR}:/models:ro
      - ./vllm-patches/marlin_utils.py:/opt/vllm/marlin_utils.py:ro
      - hf-cache:/root/.cache
      - /etc/localtime:/etc/localtime:ro
      - type: bind
        source: ./extra/../tuning.json
        target: /opt/tuning.json
  open-webui:
    env_file: [webui.env, {path: ../outside.env}]
    volumes: [{type: volume, source: data, target: /data}]
"""


def test_references_are_the_folders_own_files_only() -> None:
    assert references(COMPOSE) == [
        Reference("vllm023.env", "env_file", "vllm"),
        Reference("vllm-patches/marlin_utils.py", "mount", "vllm", "/opt/vllm/marlin_utils.py"),
        Reference("tuning.json", "mount", "vllm", "/opt/tuning.json"),
        Reference("webui.env", "env_file", "open-webui"),
    ]
    assert references("services: [") == [] and references("just text") == []


def test_deployed_names_include_what_the_compose_file_reads(tmp_path: Path) -> None:
    (tmp_path / "docker-compose.yml").write_text(COMPOSE)
    for name in (".env", "vllm023.env", "vllm-patches/marlin_utils.py", "docker-compose.yml.tq-rollback"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "tuning.json").mkdir()  # a mounted folder is the operator's, never copied
    assert deployed_names(tmp_path) == ["docker-compose.yml", ".env", "vllm023.env", "vllm-patches/marlin_utils.py"]


REPORT_NGRAM = ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-W4A16", "--served-model-name", "qwen3-30b-a3b-w4a16",
                "qwen3-30b-tq-256k", "--port", "8000", "--dtype", "float16", "--max-model-len", "262144",
                "--kv-cache-dtype", "fp8", "--no-enable-prefix-caching", "--tool-call-parser", "hermes",
                "--enable-auto-tool-choice", "--async-scheduling", "--speculative-config",
                '{"method":"eagle3","model":"/models/Qwen/Qwen3-30B-A3B-EAGLE3.b70-mpe262144",'
                '"num_speculative_tokens":3,"draft_tensor_parallel_size":1}']


MODELS = {"type": "bind", "source": "/llms", "target": "/models", "read_only": True}


def test_the_hand_made_command_maps_to_the_stack_lint_reads() -> None:
    service = {"image": "intel/vllm:latest", "command": REPORT_NGRAM, "volumes": [MODELS],
               "entrypoint": ["/bin/bash", "-c", 'source /opt/intel/oneapi/setvars.sh --force && exec "$@"', "--"]}
    stack = lint_stack_of("eagle3", service, None, "qwen3-30b-a3b")
    assert stack is not None
    assert (stack.model.path, stack.served_model_names, stack.dtype, stack.max_model_len, stack.kv_cache_dtype) == \
        ("Qwen/Qwen3-30B-A3B-W4A16", ["qwen3-30b-a3b-w4a16", "qwen3-30b-tq-256k"], "float16", 262144, "fp8")
    assert not stack.prefix_caching and stack.tool_calling.parser == "hermes" and stack.model_family == "qwen3-30b-a3b"
    assert stack.speculative is not None and stack.speculative.method == "eagle3"
    # The draft copy's name says which draft and which max_position_embeddings it carries.
    assert stack.speculative.model == "Qwen/Qwen3-30B-A3B-EAGLE3"
    assert stack.speculative.draft_max_position_embeddings == 262144
    assert stack.extra_args == ["--async-scheduling"]   # unknown flags are kept, not dropped
    served = lint_stack_of("tq", {**service, "entrypoint": ["vllm", "serve"], "command": REPORT_NGRAM[2:]}, None)
    assert served is not None and served.entrypoint_style == "vllm-serve"
    assert lint_stack_of("x", {**service, "command": ["vllm", "serve", "/data/model"]}, None) is None
    # A length the stack cannot hold stays a flag, verbatim: the same command, nothing refused.
    lots = lint_stack_of("x", {**service, "command": ["vllm", "serve", "/models/m", "--max-model-len", "lots"]}, None)
    assert lots is not None and lots.max_model_len is None and lots.extra_args == ["--max-model-len", "lots"]


def discovery(services: dict[str, Any], *, files: list[str] | None = None, vllm_service: str = "vllm",
              gids: dict[str, int] | None = None) -> Discovery:
    folder = Path("/apps/b70-vllm")
    live = LiveProject(name="b70-vllm", working_dir=folder,
                       config_files=[folder / f for f in (files or ["docker-compose.yml"])], env_files=[])
    for name in services:
        live.services[name] = LiveService(name, f"b70-vllm-{name}-1", "running", "img", "sha256:1",
                                          runs_vllm=name == vllm_service)
    text = yaml.safe_dump({"services": {"vllm": {"env_file": "vllm023.env"}}}).encode()
    return Discovery(compose={"services": services}, compose_text=text, chosen=live,
                     access=DeviceAccess(Path("/dev/dri") if gids else None, gids or {}, ()),
                     device_dir=Path("/dev/dri"))


VLLM_SPEC = {"image": "intel/vllm:latest",
             "ports": [{"target": 8000, "published": "8000", "host_ip": "192.168.0.61", "protocol": "tcp"}],
             "volumes": [{"type": "bind", "source": "/srv/models", "target": "/models", "read_only": True}]}
WEBUI_SPEC = {"image": "ghcr.io/open-webui/open-webui:main", "ports": [{"target": 8080, "published": "3000"}],
              "environment": {"OPENAI_API_BASE_URL": "http://vllm:8000/v1", "WEBUI_SECRET_KEY": "hunter2"}}


def test_init_writes_the_report_node_from_what_it_found() -> None:
    got = plan(discovery({"vllm": VLLM_SPEC, "open-webui": WEBUI_SPEC}, gids={"render": 992, "video": 44}),
               Path("/var/lib/b70deploy"))
    cfg = got.config
    assert cfg["project"] == "b70-vllm" and cfg["deploy_dir"] == "/apps/b70-vllm"
    assert cfg["gids"] == {"render": 992, "video": 44} and cfg["device_dir"] == "/dev/dri"
    assert cfg["ports"] == {"prod": 8000, "dark": 8001} and cfg["bind_address"] == "192.168.0.61"
    assert cfg["models_dir"] == "/srv/models" and cfg["secrets_env_file"] == "/apps/b70-vllm/vllm023.env"
    # The companion's own OPENAI_API_BASE_URL is kept (nothing renders one); the secret is masked when shown.
    assert cfg["companions"] == [{"name": "open-webui", "image": WEBUI_SPEC["image"], "port": 3000,
                                  "container_port": 8080, "environment": WEBUI_SPEC["environment"]}]
    assert got.secret and "hunter2" not in str(got.to_dict()) and "hunter2" not in str([f.shown() for f in got.facts])
    sources = {f.key: f.source for f in got.facts}
    assert "label com.docker.compose.project" in sources["project"] and "/dev/dri" in sources["gids"]
    assert got.text().startswith("# b70deploy node config") and yaml.safe_load(got.text()) == cfg


def test_init_takes_the_weights_bind_whatever_its_target() -> None:
    """The report's node: /llms:/llms, the model at huggingface/Qwen/...; a companion with a named
    data volume (by the engine's name), a container_name, and a key a switch cannot keep."""
    vllm = {**VLLM_SPEC, "volumes": [{"type": "bind", "source": "/llms", "target": "/llms", "read_only": True}],
            "command": ["bash", "-c", "python3 -c 'import x' && vllm serve /llms/huggingface/Qwen/M --port 8000"]}
    webui = {**WEBUI_SPEC, "container_name": "open-webui", "security_opt": ["seccomp=unconfined"],
             "volumes": [{"type": "volume", "source": "open-webui", "target": "/app/backend/data"}]}
    # `docker compose config` names the volume as the engine has it: the project's prefix in front.
    doc = {"volumes": {"open-webui": {"name": "b70-vllm_open-webui"}}, "services": {"vllm": vllm, "open-webui": webui}}
    got = plan(dataclasses.replace(discovery({"vllm": vllm, "open-webui": webui}), compose=doc))
    cfg = got.config
    assert cfg["models_dir"] == "/llms/huggingface" and cfg["models_target"] == "/llms/huggingface"
    [comp] = cfg["companions"]
    assert comp["container_name"] == "open-webui"
    assert comp["volumes"] == [{"source": "b70-vllm_open-webui", "target": "/app/backend/data", "read_only": False}]
    assert comp["compose"] == {"security_opt": ["seccomp=unconfined"]}  # carried, through its passthrough


def test_init_reads_vllm_however_it_is_started() -> None:
    """Issue 33: flags only under the image's python -m ENTRYPOINT (vllm-project/vllm docker/Dockerfile at
    0000977e), a hub id whose cache HF_HOME names, the container port 4997: init writes hf_cache, its
    target and the port published for 4997. An external start script hides the server: the service
    named vllm is taken, with a note."""
    image = ImageFacts(ref="vllm/vllm-openai:v0.9.0", id="sha256:1",
                       entrypoint=["python3", "-m", "vllm.entrypoints.openai.api_server"], cmd=None,
                       entrypoint_style="other")
    vllm = {"image": image.ref, "command": ["--model", "Qwen/Qwen3-0.6B", "--port", "4997"],
            "environment": {"HF_HOME": "/hf"}, "volumes": [{"type": "bind", "source": "/srv/hf", "target": "/hf"}],
            "ports": [{"target": 9400, "published": "9400"}, {"target": 4997, "published": "18000"}]}
    got = plan(dataclasses.replace(discovery({"vllm": vllm}), image=image))
    assert got.config["hf_cache"] == "/srv/hf" and got.config["hf_cache_target"] == "/hf"
    assert got.config["ports"]["prod"] == 18000 and "models_dir" not in got.config
    script = {"image": "vllm/vllm-openai:v0.10.1", "entrypoint": ["/bin/bash", "/scripts/start.sh"]}
    hidden = plan(discovery({"vllm": script, "db": {"image": "postgres:16"}}, vllm_service="none"))
    assert hidden.config.get("service", "vllm") == "vllm" and [c["name"] for c in hidden.config["companions"]] == ["db"]
    assert any("start script" in n for n in hidden.notes)


def test_init_says_what_it_could_not_find() -> None:
    got = plan(discovery({"vllm": {"image": "x"}}, files=["compose.yaml", "gpu.override.yml"]))
    assert got.config["device_dir"] is None
    notes = " | ".join(got.notes)
    assert "no GPU device nodes" in notes and "publishes no port" in notes and "has no command" in notes
    assert got.config["compose_files"] == ["compose.yaml", "gpu.override.yml"]  # the label's files, in -f order
    # A vLLM service of another name is the node's `service:` (every command then uses that name).
    named = plan(discovery({"llm": {"image": "x"}, "proxy": {"image": "caddy:2"}}, vllm_service="llm")).config
    assert named["service"] == "llm" and [c["name"] for c in named["companions"]] == ["proxy"]
    with pytest.raises(UserError, match="runs vLLM"):
        plan(discovery({"web": {"image": "x"}}, vllm_service="none"))
    empty = Discovery(compose=None, compose_text=b"", chosen=None, access=DeviceAccess(None),
                      device_dir=Path("/dev/dri"))
    assert "no running vLLM compose project" in " ".join(plan(empty).notes)
    assert Fact("ports.prod", 8000, "x").shown() == "8000"


def _store(tmp_path: Path) -> RevisionStore:
    store = RevisionStore(tmp_path)
    common: dict[str, Any] = {"image_ref": "img", "image_id": "sha256:1", "repo_digest": None, "operator": "t",
                              "message": "", "created": "now"}
    store.create(stack="ngram", kind="adopt", files={"a": b"1"}, outcome="deployed", **common)
    store.create(stack="tq-256k", kind="import", files={"a": b"2"}, outcome="unproven", **common)
    store.create(stack="tq-256k", kind="rollback", files={"a": b"2"}, restored_from=2, **common)
    store.update_status(3, outcome="failed")
    store.create(stack="w4a16", kind="switch", files={"a": b"3"}, **common)  # pending: never ran
    return store


def test_rollback_by_name_takes_a_healthy_revision_or_an_unproven_import(tmp_path: Path) -> None:
    store = _store(tmp_path)
    picked = store.latest_restorable("tq-256k")
    assert picked is not None and picked.number == 2   # the failed run of it is skipped, the import is not
    found = store.latest_restorable("ngram")
    assert found is not None and found.number == 1
    assert store.latest_restorable("w4a16") is None
    assert store.latest_healthy("tq-256k") is None      # history's meaning of healthy is unchanged


def test_a_rollback_to_an_import_is_still_hand_made(tmp_path: Path) -> None:
    store = _store(tmp_path)
    state = StateDir(tmp_path)
    origin = handmade_origin(state, store.get(3))       # the rollback that restored import 2
    assert origin is not None and origin.number == 2
    assert handmade_origin(state, store.get(4)) is None  # rendered by a switch


class Image:
    """An image as render.patches.ImageFiles sees it: its id now and its files."""

    def __init__(self, image_id: str, files: dict[str, bytes]) -> None:
        self.id, self.files = image_id, files

    def image_id(self, ref: str) -> str:
        return self.id

    def read_file(self, ref: str, path: str) -> bytes | None:
        return self.files.get(path)

    def vllm_package_dir(self, ref: str) -> str | None:
        return "/opt/venv/lib/python3.12/site-packages/vllm"

    def vllm_version(self, ref: str) -> str | None:
        return "0.21.1.dev17+g0a4756bb5"


ORIGINAL = b"def check(layer):\n    if is_rocm():\n        return False\n    return True\n"
FIXED = ORIGINAL.replace(b"if is_rocm():", b"if is_rocm() or is_xpu():")
DIFF = ("--- a/t.py\n+++ b/t.py\n@@ -1,3 +1,3 @@\n def check(layer):\n-    if is_rocm():\n"
        "+    if is_rocm() or is_xpu():\n         return False\n")


def test_a_moved_tag_is_caught_when_it_changed_a_replaced_file(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    record = PatchRecord(file="vllm-patches/t.py", target="/t.py", package_target=None, image_id="sha256:old",
                         vllm_version=None, original_sha256=sha256(ORIGINAL), sha256=sha256(FIXED), diff=DIFF)
    rev = store.create(stack="ngram", kind="adopt", files={"vllm-patches/t.py": FIXED}, image_ref="intel/vllm:latest",
                       image_id="sha256:old", repo_digest=None, operator="t", message="", created="now",
                       patches=[record.to_dict()], outcome="deployed")
    assert check_drift(rev, "intel/vllm:latest", Image("sha256:old", {})) == []
    same = check_drift(rev, "intel/vllm:latest", Image("sha256:new", {"/t.py": ORIGINAL}))
    assert "unchanged in the new image" in same[-1]
    reworded = ORIGINAL.replace(b"if is_rocm():", b"if current_platform.is_rocm():")
    with pytest.raises(UserError, match="no longer applies") as err:
        check_drift(rev, "intel/vllm:latest", Image("sha256:new", {"/t.py": reworded}))
    assert "docker tag sha256:old intel/vllm:latest" in str(err.value)
    with pytest.raises(UserError, match="still applies"):
        check_drift(rev, "intel/vllm:latest", Image("sha256:new", {"/t.py": ORIGINAL + b"# more\n"}))


def test_diff_of_two_adopted_revisions_masks_every_runtime_env_value(scratch: Scratch) -> None:
    node = load_node(str(scratch.config))
    store = RevisionStore(node.state_dir)
    for n, zone in ((1, "0"), (2, "1")):
        store.create(stack="ngram", kind="adopt", image_ref="img", image_id=None, repo_digest=None, operator="t",
                     message="", created="now", outcome="deployed",
                     files={".env": f"VLLM_PORT=800{n}\n".encode(),
                            "vllm023.env": f"ZE_AFFINITY_MASK=zone{zone}\nHF_TOKEN=tok{n}\n".encode()})
    text, _ = diff_revisions(node, 1, 2)
    assert "zone0" not in text and "zone1" not in text and "tok1" not in text and "tok2" not in text
    assert "ZE_AFFINITY_MASK=****(sha256:" in text and "VLLM_PORT=8002" in text   # .env stays readable


def test_status_names_the_revision_a_deploy_dir_holds_instead_of_undoing_it(scratch: Scratch) -> None:
    """The report's way back by hand: revision 1's files copied into the deploy dir while revision 2
    is current. status says which revision the bytes are and gives adopt, not `rollback 2`."""
    node = load_node(str(scratch.config))
    store = RevisionStore(node.state_dir)
    files = {1: {"docker-compose.yml": b"services: {vllm: {image: hand}}\n"},
             2: {"docker-compose.yml": b"services: {vllm: {image: rendered}}\n"}}
    for n, kind in ((1, "adopt"), (2, "switch")):
        store.create(stack="ngram" if n == 1 else "eagle3", kind=kind, image_ref="img", image_id=None,  # type: ignore[arg-type]
                     repo_digest=None, operator="t", message="", created="now", outcome="deployed", files=files[n])
    store.set_current(2)
    node.deploy_dir.mkdir(parents=True, exist_ok=True)
    (node.deploy_dir / "docker-compose.yml").write_bytes(files[1]["docker-compose.yml"])
    current = store.current()
    assert current is not None
    found, fix = differences(node, store, current, {"container": {"status": "running"}, "lock": None})
    assert found == ["the deploy dir holds revision 1's files (ngram, adopt), not revision 2's"]
    assert fix is not None and fix.startswith("b70deploy adopt") and "rollback" not in fix


def test_init_picks_a_dark_port_no_service_of_the_project_publishes() -> None:
    """Issue 39, point 2: prod + 1 was the companion's published port, listed two lines above."""
    webui = {**WEBUI_SPEC, "ports": [{"target": 8080, "published": "8001"}]}
    proxy = {"image": "caddy:2", "ports": [{"target": 80, "published": "8002"}]}
    got = plan(discovery({"vllm": VLLM_SPEC, "open-webui": webui, "proxy": proxy}))
    assert got.config["ports"] == {"prod": 8000, "dark": 8003}


def test_init_takes_the_project_as_compose_ran_it() -> None:
    """Issue 33: the files and profiles of the running project, the service named among several
    vLLM services (the variant not started is no companion), the node-wide keys of the running
    service and the project's networks, the device folder from its device map, companions'
    environment as written."""
    vllm = {**VLLM_SPEC, "profiles": ["nvidia"], "security_opt": ["label=disable"], "group_add": ["44", "992"],
            "devices": [{"source": "/srv/dri", "target": "/dev/dri", "permissions": "rwm"}], "ipc": "host",
            "shm_size": "17179869184", "ulimits": {"memlock": -1}, "runtime": "nvidia",
            "networks": {"appnet": None}}
    embed = {**VLLM_SPEC, "profiles": ["nvidia"], "ports": []}
    variant = {**VLLM_SPEC, "profiles": ["amd"]}
    router = {"image": "litellm", "environment": {"DATABASE_URL": "postgresql://u:secret@db/x", "A": "x$$y"}}
    services = {"vllm": vllm, "embed": embed, "vllm-amd": variant, "router": router}
    d = discovery(services, files=["docker-compose.yml", "docker-compose.override.yml"])
    d.chosen.services.pop("vllm-amd")       # behind a profile nobody started: no container
    d.chosen.services["embed"] = dataclasses.replace(d.chosen.services["embed"], runs_vllm=True)
    doc = {"services": services, "networks": {"appnet": {"name": "fixed-net", "ipam": {}},
                                              "default": {"name": "b70-vllm_default", "ipam": {}}}}
    written = {"services": {"router": {"environment": {"DATABASE_URL": "${DATABASE_URL}", "A": "x$$y"}}}}
    got = plan(dataclasses.replace(d, compose=doc, written=written, device_dir=Path("/srv/dri"))).config
    assert got["compose_files"] == ["docker-compose.yml", "docker-compose.override.yml"]
    assert got["profiles"] == ["nvidia"]
    assert "service" not in got                       # `vllm` among several: the one the tool switches
    assert got["compose"] == {"networks": {"appnet": None}, "security_opt": ["label=disable"], "ipc": "host",
                              "shm_size": "17179869184", "ulimits": {"memlock": -1}, "runtime": "nvidia",
                              "devices": ["/srv/dri:/dev/dri"], "group_add": ["44", "992"]}
    assert got["networks"] == {"appnet": {"name": "fixed-net"}}
    comps = {c["name"]: c for c in got["companions"]}
    assert sorted(comps) == ["embed", "router"]       # the other vLLM service is kept as a companion, as it is
    assert comps["router"]["environment"] == {"DATABASE_URL": "${DATABASE_URL}", "A": "x$$y"}
    NodeConfig.model_validate({k: v for k, v in got.items() if k != "state_dir"})
    # Two vLLM services, neither named vllm: which one is asked for.
    two = discovery({"chat": VLLM_SPEC, "embed": VLLM_SPEC}, vllm_service="chat")
    two.chosen.services["embed"] = dataclasses.replace(two.chosen.services["embed"], runs_vllm=True)
    with pytest.raises(UserError, match="runs vLLM in 2 services") as e:
        plan(two)
    assert "--service NAME" in (e.value.fix or "")
    assert plan(dataclasses.replace(two, service="embed")).config["service"] == "embed"


def test_the_running_vllms_api_key_goes_to_a_0600_secrets_file_never_into_the_config(tmp_path: Path) -> None:
    """vLLM asks /v1 for a key (its --api-key): init gives every rendered stack VLLM_API_KEY through a
    secrets_env_file it writes (0600), unless the service has an env_file (then a note says to add it)."""
    d = dataclasses.replace(discovery({"vllm": VLLM_SPEC}), api_key="sk-unit-canary",
                            compose_text=yaml.safe_dump({"services": {"vllm": {"image": "x"}}}).encode())
    got = plan(d, tmp_path / "state")
    path = str(tmp_path / "state" / "vllm-secrets.env")
    assert got.config["secrets_env_file"] == path
    assert got.secret_files == {path: "VLLM_API_KEY=sk-unit-canary\n"}
    assert "sk-unit-canary" not in got.text() + repr(got.to_dict())
    with_env_file = plan(dataclasses.replace(discovery({"vllm": VLLM_SPEC}), api_key="sk-unit-canary"), tmp_path)
    assert with_env_file.secret_files == {} and with_env_file.config["secrets_env_file"].endswith("vllm023.env")
    assert any("VLLM_API_KEY=<the key>" in n for n in with_env_file.notes)


def test_a_file_given_after_the_first_reads_its_binds_from_the_project_folder(tmp_path: Path) -> None:
    """Compose resolves every file's relative paths against the project directory (the first file's
    folder): naptha-node's `-f node/compose-files/vllm-models/X.yml` binds `./node/inference/...`."""
    (tmp_path / "docker-compose.yml").write_text("services:\n  db:\n    image: postgres:16\n")
    model = tmp_path / "node" / "compose-files" / "m.yml"
    model.parent.mkdir(parents=True)
    model.write_text("services:\n  vllm:\n    image: vllm/vllm-openai:latest\n    volumes:\n"
                     "      - ./node/configs/template.jinja:/usr/app/template.jinja\n")
    (tmp_path / "node" / "configs").mkdir()
    (tmp_path / "node" / "configs" / "template.jinja").write_text("{{ messages }}")
    files = folder_files(tmp_path / "docker-compose.yml", None, [(model, "node/compose-files/m.yml")])
    assert files["node/configs/template.jinja"] == b"{{ messages }}"
    assert files["node/compose-files/m.yml"] == model.read_bytes()


def test_init_lists_the_marked_variables_labels_interpolate() -> None:
    """A Traefik basic-auth label on each service, interpolated from the project's .env: a value the
    operator marked (a 0600 env file's) or under a secret name becomes a secret_variable; a label
    variable holding neither (the router's host) does not, nor a `$$` that Compose keeps literal."""
    auth = "admin:$apr1$H6uskkkW$IgXLP6ewTrSuBkTrqE8wj/"
    written = {"services": {
        "vllm": {"labels": {"traefik.http.middlewares.api.basicauth.users": "${API_USERS}",
                            "traefik.http.routers.api.rule": "Host(`${API_HOST}`)"}},
        "open-webui": {"labels": ["traefik.http.middlewares.ui.basicauth.users=${UI_AUTH}", "x=$$NOT_A_VAR"]}}}
    d = dataclasses.replace(discovery({"vllm": VLLM_SPEC, "open-webui": WEBUI_SPEC}), written=written,
                            variables={"API_USERS": auth, "API_HOST": "llm.example.org", "UI_AUTH": "u:$2y$05$x",
                                       "NOT_A_VAR": "marked-too"},
                            secret_values=frozenset({auth, "marked-too"}))
    got = plan(d)
    assert got.config["secret_variables"] == ["API_USERS", "UI_AUTH"]  # UI_AUTH: by its name
    assert "secret_variables" in {f.key for f in got.facts}
    # The labels as written, beside the values their references need (a switch renders both, issue 33):
    # the config then holds a secret, so it is written 0600 and printed masked.
    assert got.config["compose"]["labels"] == written["services"]["vllm"]["labels"]
    assert got.config["variables"] == {"API_HOST": "llm.example.org", "API_USERS": auth}
    [webui] = got.config["companions"]
    assert webui["compose"]["labels"] == {"traefik.http.middlewares.ui.basicauth.users": "${UI_AUTH}",
                                          "x": "$$NOT_A_VAR"}
    assert webui["variables"] == {"UI_AUTH": "u:$2y$05$x"}
    assert got.secret and auth not in got.text(masked=True) and "u:$2y$05$x" not in got.text(masked=True)


def test_init_moves_a_secret_label_written_inline_into_the_env() -> None:
    """A basic-auth label written inline (htpasswd, `$$` as Compose reads it): the node config renders it
    as `${B70_LABEL_...}` and keeps its value, the `$` the container gets, for the rendered 0600 .env;
    the variable is a secret_variable, masked in what init prints; a b70deploy.* label is the tool's."""
    written = {"services": {
        "vllm": {"labels": ["traefik.enable=true", "traefik.http.middlewares.api.basicauth.users=admin:$$apr1$$xy",
                            "b70deploy.stack=old"]},
        "open-webui": {"labels": {"caddy.basicauth.bob": "hash$$1"}}}}
    d = dataclasses.replace(discovery({"vllm": VLLM_SPEC, "open-webui": WEBUI_SPEC}), written=written)
    got = plan(d)
    name = "B70_LABEL_VLLM_TRAEFIK_HTTP_MIDDLEWARES_API_BASICAUTH_USERS"
    assert got.config["compose"]["labels"] == {"traefik.enable": "true",
                                               "traefik.http.middlewares.api.basicauth.users": f"${{{name}}}"}
    assert got.config["variables"] == {name: "admin:$apr1$xy"} and got.config["secret_variables"] == [name]
    [webui] = got.config["companions"]
    assert webui["compose"]["labels"] == {"caddy.basicauth.bob": "${B70_LABEL_OPEN_WEBUI_CADDY_BASICAUTH_BOB}"}
    assert webui["variables"] == {"B70_LABEL_OPEN_WEBUI_CADDY_BASICAUTH_BOB": "hash$1"}
    assert webui["secrets"] == ["B70_LABEL_OPEN_WEBUI_CADDY_BASICAUTH_BOB"]
    shown = got.text(masked=True)
    assert "admin:$apr1$xy" not in shown and "hash$1" not in shown and got.secret
