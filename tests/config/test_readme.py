"""The README documents what the code has: every shipped stack, every node config key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kit.scratch import SHIPPED_STACKS

from b70deploy.config.schema import Companion, NodeConfig, Ports, Timeouts

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_stack_in_table(name: str) -> None:
    assert f"| `{name}` |" in README


def test_every_node_config_key_documented() -> None:
    keys = [f"`{k}`" for k in NodeConfig.model_fields if k not in ("ports", "timeouts")]
    keys += [f"`ports.{k}`" for k in Ports.model_fields]
    keys += [f"`timeouts.{k}`" for k in Timeouts.model_fields]
    keys += [f"`{k}`" for k in Companion.model_fields]
    missing = [k for k in keys if k not in README]
    assert not missing


def test_placeholder_sections_present() -> None:
    for title in ("## Switch and rollback", "## Lint and patches", "## Bench", "## Quick start", "make demo",
                  "make test"):
        assert title in README


def test_lint_table_lists_exactly_the_finding_ids() -> None:
    from b70deploy.lint.findings import STACK_INVALID
    from b70deploy.lint.rules import RULES

    section = README.split("## Lint and patches", 1)[1].split("\n\n**", 1)[0]
    documented = {cell for row in section.splitlines() if row.startswith("| `")
                  for cell in re.findall(r"`([a-z0-9-]+)`", row.split("|")[1])}
    assert documented == {rid for rids, _ in RULES for rid in rids} | {STACK_INVALID}
