"""Shell completion as the shells ask for it (click's protocol: the COMP_WORDS of a command line
in the environment, one candidate a line back): stack names, revision numbers, node names."""

from __future__ import annotations

from pathlib import Path

import yaml
from kit.scratch import MINIMAL_STACK, Scratch
from simkit import run_cli

from b70deploy.state.revisions import RevisionStore


def complete(config: Path, line: str, shell: str = "bash") -> list[str]:
    words = ["b70deploy", "--config", str(config), *line.split(" ")]
    env = {"_B70DEPLOY_COMPLETE": f"{shell}_complete", "COMP_WORDS": " ".join(words),
           "COMP_CWORD": str(len(words) - 1)}
    r = run_cli(None, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return [ln.split(",", 1)[1] for ln in r.stdout.splitlines() if ln]  # bash: "TYPE,VALUE"


def test_stack_names_revisions_and_nodes_complete(scratch: Scratch) -> None:
    for name in ("w4a16", "w4a16-131k", "eagle3"):
        scratch.write_stack(name, MINIMAL_STACK)
    store = RevisionStore(scratch.root / "state")
    for stack in ("w4a16", "eagle3"):
        store.create(stack=stack, kind="switch", files={"docker-compose.yml": b"services: {}\n"}, image_ref="i:1",
                     image_id=None, repo_digest=None, operator="me@host", message="", created="2026-12-01T00:00:00")
    assert complete(scratch.config, "switch w4") == ["w4a16", "w4a16-131k"]
    assert complete(scratch.config, "lint w4a16 e") == ["eagle3"]
    assert complete(scratch.config, "logs ") == ["2", "1"]  # the newest first
    assert complete(scratch.config, "rollback ") == ["eagle3", "w4a16", "w4a16-131k", "2", "1"]
    cfg = yaml.safe_load(scratch.config.read_text())
    scratch.config.write_text(yaml.safe_dump({**cfg, "nodes": {"gpu1": {}, "gpu2": {}}}))
    assert complete(scratch.config, "history --node g") == ["gpu1", "gpu2"]


def test_a_broken_config_completes_nothing_and_prints_no_error(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("ports: [not, a, mapping\n")
    assert complete(bad, "switch ") == []
    assert complete(tmp_path / "absent.yaml", "logs ") == []
