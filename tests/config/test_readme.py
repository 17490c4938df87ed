"""The README and the docs/ pages document what the code has: every shipped stack, every node config key,
every lint rule; the README stays a five-minute read (issue 39: 1,035 lines were the trial's first hour)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kit.scratch import SHIPPED_STACKS

from b70deploy.config.schema import Companion, NodeConfig, Ports, Timeouts

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_stack_in_table(name: str) -> None:
    assert f"| `{name}` |" in DOCS["stacks.md"]


def test_every_node_config_key_documented() -> None:
    keys = [f"`{k}`" for k in NodeConfig.model_fields if k not in ("ports", "timeouts")]
    keys += [f"`ports.{k}`" for k in Ports.model_fields]
    keys += [f"`timeouts.{k}`" for k in Timeouts.model_fields]
    keys += [f"`{k}`" for k in Companion.model_fields]
    missing = [k for k in keys if k not in DOCS["node-config.md"]]
    assert not missing


def test_the_readme_is_short_and_links_every_page() -> None:
    assert len(README.splitlines()) <= 300
    for title in ("## Quick start", "make demo", "make test", "## Day one", "## The main verbs", "## Dependencies"):
        assert title in README
    assert not [name for name in DOCS if f"(docs/{name})" not in README]
    for page, title in (("switch.md", "# Switch and rollback"), ("lint.md", "# Lint and patches"),
                        ("bench.md", "# Bench")):
        assert DOCS[page].startswith(title)


def test_lint_table_lists_exactly_the_finding_ids() -> None:
    from b70deploy.lint.findings import STACK_INVALID
    from b70deploy.lint.rules import RULES

    section = DOCS["lint.md"].split("# Lint and patches", 1)[1].split("\n\n**", 1)[0]
    documented = {cell for row in section.splitlines() if row.startswith("| `")
                  for cell in re.findall(r"`([a-z0-9-]+)`", row.split("|")[1])}
    assert documented == {rid for rids, _ in RULES for rid in rids} | {STACK_INVALID}
