"""Which companions a stop-first drain leaves running (deploy/companions.py), decided over the real
operators' compose files (tests/fixtures/operators/, each with its SOURCE.md naming repository, path and
commit), every other service of the file taken as a companion. No client of vLLM ever stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from b70deploy.config.compose_folder import own_files, parse_compose
from b70deploy.deploy.companions import kept_running

OPERATORS = Path(__file__).parent.parent / "fixtures" / "operators"
NAPTHA = "napthaai-naptha-node-vllm"
# fixture -> (its compose files in -f order, the vLLM service, the companions that stay)
LAYOUTS = {
    "evdcush-vllm-openwebui": (("docker-compose.yml",), "vllm", ()),  # open-webui names vllm; caddy depends on it
    "louislepage-vllm-openwebui": (("compose.yml",), "vllm-api", ()),  # open-webui: nothing waits for it
    NAPTHA: (("docker-compose.yml", "node/compose-files/vllm-models/Qwen2.5-7B-Instruct.yml"), "Qwen2.5-7B-Instruct",
             ("rabbitmq", "pgvector")),  # litellm and node-app wait for them; litellm itself stops
    "shelldandy-homelab-vllm": (("docker-compose.yml",), "vllm", ()),  # vllm alone
    "bklinkradt-arc-b70-qwen-vllm": (("docker-compose.yml",), "vllm", ()),  # nothing is depended on
}
CLIENTS = {"open-webui", "caddy", "litellm", "node-app", "vllm-2", "vllm-tp2", "grafana", "prometheus"}


def files_of(name: str, compose_files: tuple[str, ...]) -> dict[str, bytes]:
    """The deploy dir an adoption of the fixture holds: its compose files, what they read, its .env."""
    folder = OPERATORS / name
    files = {n: (folder / n).read_bytes() for n in compose_files}
    for n in compose_files:
        files |= {o: (folder / o).read_bytes() for o in own_files(files[n], lambda x: (folder / x).is_file())}
    if (folder / "env-example").is_file():
        files[".env"] = (folder / "env-example").read_bytes()
    return files


def decide(files: dict[str, bytes], old: dict[str, bytes], name: str) -> tuple[str, ...]:
    compose_files, vllm, _ = LAYOUTS[name]
    services = [s for n in compose_files for s in parse_compose(files[n]).get("services") or {}]
    return kept_running(files, old, compose_files=compose_files, vllm=vllm,
                        companions=[s for s in dict.fromkeys(services) if s != vllm])


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_operators_layout_keeps_only_its_backing_services(name: str) -> None:
    files = files_of(name, LAYOUTS[name][0])
    kept = decide(files, dict(files), name)
    assert kept == LAYOUTS[name][2]
    assert not set(kept) & CLIENTS


def test_nothing_stays_when_nothing_runs_yet() -> None:
    files = files_of(NAPTHA, LAYOUTS[NAPTHA][0])
    compose_files, vllm, _ = LAYOUTS[NAPTHA]
    assert kept_running(files, None, compose_files=compose_files, vllm=vllm, companions=["pgvector", "litellm"]) == ()


def test_a_database_whose_definition_or_variables_changed_stops() -> None:
    """It is started again from the new files, never left running its old definition."""
    old = files_of(NAPTHA, LAYOUTS[NAPTHA][0])
    new = dict(old, **{"docker-compose.yml": old["docker-compose.yml"].replace(b'interval: "30s"', b'interval: "5s"')})
    assert decide(new, old, NAPTHA) == ("rabbitmq",)
    new = dict(old, **{".env": old[".env"].replace(b"LOCAL_DB_POSTGRES_PASSWORD=", b"LOCAL_DB_POSTGRES_PASSWORD=x")})
    assert decide(new, old, NAPTHA) == ("rabbitmq",)
    new = dict(old, **{"scripts/init.sh": old["scripts/init.sh"] + b"\n# changed\n"})
    assert decide(new, old, NAPTHA) == ("rabbitmq",)


def test_a_client_others_depend_on_still_stops() -> None:
    """LiteLLM with something waiting for it: its bound config names the vLLM service, so it stops; with the
    config out of the deploy dir (unseen), it stops too; a database that names vllm stops."""
    old = files_of(NAPTHA, LAYOUTS[NAPTHA][0])
    text = old["docker-compose.yml"].replace(b"      rabbitmq:\n        condition: service_healthy\n",
                                             b"      rabbitmq:\n        condition: service_healthy\n"
                                             b"      litellm:\n        condition: service_started\n")
    assert text != old["docker-compose.yml"]
    files = dict(old, **{"docker-compose.yml": text})
    assert "litellm" not in decide(files, dict(files), NAPTHA)
    unseen = {k: v for k, v in files.items() if not k.startswith("node/inference/")}
    assert "litellm" not in decide(unseen, dict(unseen), NAPTHA)
    named = dict(old, **{"scripts/init.sh": old["scripts/init.sh"] + b"\ncurl http://qwen2.5-7b-instruct:8000/v1\n"})
    assert decide(named, dict(named), NAPTHA) == ("rabbitmq",)
