"""The example nodes of examples/ (one per platform) load, render valid Compose and lint clean
without Docker, with their models folder pointed at the sim's model files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from b70deploy.config.node import load_node
from b70deploy.lint import lint_stack
from b70deploy.lint.gather import context
from b70deploy.render.files import COMPOSE_FILE

EXAMPLES = Path(__file__).parents[2] / "examples"
SCHEMA = json.loads((Path(__file__).parents[1] / "fixtures/compose-spec/compose-spec.json").read_text())


@pytest.mark.parametrize("platform", ["nvidia", "rocm", "cpu"])
def test_example_lints_clean(tmp_path: Path, models_dir: Path, platform: str) -> None:
    folder = tmp_path / platform
    shutil.copytree(EXAMPLES / platform, folder)
    cfg = yaml.safe_load((folder / "node.yaml").read_text())
    cfg.update(models_dir=str(models_dir), state_dir=str(tmp_path / "state"), deploy_dir=str(tmp_path / "deploy"))
    if platform == "rocm":  # the host's /dev nodes are not this test's: none, so render notes and lint go on
        cfg.update(device_dir=str(tmp_path / "no-dri"), kfd_device=str(tmp_path / "no-kfd"))
    (folder / "node.yaml").write_text(yaml.safe_dump(cfg))
    node = load_node(str(folder / "node.yaml"))
    names = node.catalogue().names()
    assert names
    for name in names:
        ctx = context(node, node.catalogue().load(name), docker=False)
        findings = lint_stack(ctx)
        assert findings == [], [f.one_line() for f in findings]
        jsonschema.Draft7Validator(SCHEMA).validate(yaml.safe_load(ctx.rendered.files[COMPOSE_FILE]))
