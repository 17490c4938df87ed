"""The read-only commands at scale: `history` pages (newest 20 and a hint; `-n`, `--all`,
`--json` for more), plain rows on a pipe, and each command imports only what it uses (the
timings themselves are benchmarks/scale_bench.py's, not a test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kit.scratch import Scratch
from simkit import run_cli

from b70deploy.state.revisions import RevisionStore

FILES = {"docker-compose.yml": b"services: {}\n", ".env": b"VLLM_IMAGE='x'\n"}


def revisions(state: Path, count: int) -> None:
    store = RevisionStore(state)
    for n in range(1, count + 1):
        # No image id: whether an image is gone is the keep tests' (tests/actions/test_keep_engine.py).
        rev = store.create(stack=f"s{n % 3}", kind="switch", files=FILES, image_ref="img:1", image_id=None,
                           repo_digest=None, operator="me", message=f"m{n}", created="2026-11-30T00:00:00")
        store.update_status(rev.number, outcome="superseded", facts={"kv_cache_tokens": 1000 + n})


@pytest.fixture
def node25(scratch: Scratch) -> Scratch:
    scratch.copy_shipped()
    revisions(scratch.root / "state", 25)
    return scratch


def rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()[1:]]


def test_history_shows_the_newest_20_and_says_how_to_see_more(node25: Scratch) -> None:
    r = run_cli(None, "--config", str(node25.config), "history", in_process=True)
    assert r.returncode == 0
    assert [row[0] for row in rows(r.stdout)] == [str(n) for n in range(6, 26)]
    assert r.stdout.splitlines()[0].split()[:4] == ["rev", "stack", "kind", "outcome"]
    assert r.stderr.strip() == "20 newest of 25 revisions; --all or -n N for more"


@pytest.mark.parametrize(("args", "numbers"), [(("-n", "3"), [23, 24, 25]), (("--all",), list(range(1, 26))),
                                               (("-n", "0"), list(range(1, 26)))])
def test_history_n_and_all(node25: Scratch, args: tuple[str, ...], numbers: list[int]) -> None:
    r = run_cli(None, "--config", str(node25.config), "history", *args, in_process=True)
    assert r.returncode == 0
    assert [int(row[0]) for row in rows(r.stdout)] == numbers
    assert r.stderr == ""  # asked for: no hint


def test_history_json_is_every_revision_unless_n(node25: Scratch) -> None:
    r = run_cli(None, "--config", str(node25.config), "history", "--json", in_process=True)
    assert [e["number"] for e in json.loads(r.stdout)] == list(range(1, 26))
    r = run_cli(None, "--config", str(node25.config), "history", "--json", "-n", "2", in_process=True)
    assert [e["number"] for e in json.loads(r.stdout)] == [24, 25]


def test_plain_rows_on_a_pipe_are_aligned_and_unfolded(node25: Scratch) -> None:
    long = "a message far longer than any terminal " * 8
    store = RevisionStore(node25.root / "state")
    store.create(stack="s", kind="switch", files=FILES, image_ref="img:1", image_id=None, repo_digest=None,
                 operator="me", message=long.strip(), created="2026-11-30T00:00:00")
    r = run_cli(None, "--config", str(node25.config), "history", "-n", "2", in_process=True)
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and lines[-1].endswith(long.strip())  # one line per row, never folded
    start = lines[0].index("message")
    assert lines[1][start:].startswith("m25") and lines[2][start:].startswith("a message")
    assert all(line == line.rstrip() for line in lines)


# command -> modules it must not import (top-level package names): what it does not use.
BUDGET = {
    ("history",): ("docker", "paramiko", "jinja2", "rich", "tenacity", "dotenv", "psutil", "filelock", "pydantic"),
    ("history", "--all"): ("docker", "paramiko", "jinja2", "rich", "pydantic"),
    # status asks the engine through the docker CLI and /health through urllib (issue 13: < 300 ms).
    ("status",): ("docker", "paramiko", "requests", "jinja2", "rich", "tenacity", "dotenv", "psutil", "filelock",
                  "pydantic"),
    ("render", "w4a16", "--no-docker"): ("docker", "paramiko", "requests", "rich"),
    ("audit",): ("docker", "paramiko", "requests", "jinja2", "rich", "tenacity", "psutil", "pydantic"),
    ("stacks",): ("docker", "paramiko", "jinja2", "rich", "requests"),
    ("lint", "--all", "--no-docker"): ("docker", "paramiko", "rich"),
}
# What a command imports only on the first run on a node config: the schema that validates it,
# before its settings are cached (config/node_cache.py).
FIRST_RUN = {"pydantic"}


@pytest.mark.parametrize("args", list(BUDGET), ids=" ".join)
def test_a_command_imports_only_what_it_uses(node25: Scratch, args: tuple[str, ...]) -> None:
    probe = ("import sys\nfrom b70deploy.cli import main\n"
             f"try:\n    main(['--config', {str(node25.config)!r}, *{list(args)!r}])\nexcept SystemExit:\n    pass\n"
             "print('LOADED=' + ','.join(sorted({m.split('.')[0] for m in sys.modules "
             "if type(sys.modules[m]).__name__ == 'module'})))")
    for run, forbidden in (("first", set(BUDGET[args]) - FIRST_RUN), ("second", set(BUDGET[args]))):
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
        loaded = set(proc.stdout.strip().splitlines()[-1].removeprefix("LOADED=").split(","))
        assert not loaded & forbidden, (run, proc.stderr)
        assert "b70deploy" in loaded

