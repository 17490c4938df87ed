"""Every command that changes the node or the state dir goes through the one mutating wrapper:
the CLI's `mutate` (reporter, exit line) around an action run inside actions/mutating.py (the
lock first, one audit line, notifications). Read from the source, and seen from outside: a
held lock refuses each of them before anything happens, and each run leaves its audit line."""

from __future__ import annotations

import ast
import inspect
import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
from kit.scratch import Scratch
from simkit import run_cli

import b70deploy
from b70deploy.cli.base import MUTATING, cli

# The commands that change the node or the state dir: cli/base.py's MUTATING. A new command goes
# there or in OTHERS.
# watch changes the node only by rolling back, and each of its rollbacks is `Rollback.run`, inside
# the wrapper (the source check below holds every lock to actions/mutating.py).
OTHERS = {
    "watch": "acts through Rollback.run",
    **{c: "reads only" for c in ("stacks", "show", "render", "diff", "lint", "diagnose", "verify", "status", "history",
                                 "logs", "audit")},
    **{c: "writes only files the operator names, or results" for c in (
        "init", "draft fix", "patch from-file", "stack from-compose", "export k8s", "sim build", "sim models", "bench",
        "door", "bench sweep", "bench compare", "capture", "replay")},
}


def _commands() -> Iterator[tuple[str, click.Command]]:
    """Every command and subcommand, by its full name ("bench cycle")."""
    root = click.Context(cli)

    def walk(prefix: str, group: click.Group, ctx: click.Context) -> Iterator[tuple[str, click.Command]]:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            full = f"{prefix} {name}".strip()
            if not isinstance(command, click.Group) or command.invoke_without_command:  # `bench` runs; `sim` lists
                yield full, command
            if isinstance(command, click.Group):
                yield from walk(full, command, click.Context(command, parent=ctx))

    yield from walk("", cli, root)


def _calls(fn: object) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def test_every_command_is_listed_as_mutating_or_not() -> None:
    names = {name for name, _ in _commands()}
    assert not MUTATING & set(OTHERS)
    assert names == MUTATING | set(OTHERS), (sorted(names - MUTATING - set(OTHERS)),
                                             sorted((MUTATING | set(OTHERS)) - names))


def test_every_mutating_command_goes_through_the_wrapper() -> None:
    """The CLI half: each mutating command prints through `mutate`; the others never do."""
    for name, command in _commands():
        assert command.callback is not None
        calls = _calls(command.callback) | {c for f in _helpers(command.callback) for c in _calls(f)}
        assert ("mutate" in calls) == (name in MUTATING), name


def _helpers(fn: object) -> list[object]:
    """The module-level helpers a command calls (switch and rollback share `_rollout`)."""
    module = sys.modules[fn.__module__]  # type: ignore[attr-defined]
    return [getattr(module, c) for c in _calls(fn) if c.startswith("_") and callable(getattr(module, c, None))]


# The only places that take the deploy lock or write the audit log: the state dir itself, the
# wrapper, and the notifier's own line for a receiver that failed.
ALLOWED = {"actions/mutating.py", "ui/notify.py"}


def test_only_the_wrapper_takes_the_lock_or_writes_the_audit_log() -> None:
    root = Path(b70deploy.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("state/") or rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            audit_write = isinstance(f, ast.Attribute) and f.attr == "record" and \
                isinstance(f.value, ast.Attribute) and f.value.attr == "audit"
            if name in ("lock", "DeployLock", "AuditLog") or audit_write:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, "\n".join(found)


HOLD = """
import sys, time
from pathlib import Path
from b70deploy.state.lock import DeployLock
lock = DeployLock(Path(sys.argv[1]), "switch eagle3").acquire()
print("held", flush=True)
time.sleep(120)
"""


def _holder(state: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(state)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


# What each refused command is, with arguments that would otherwise run it.
REFUSED = [("switch", "alpha", "--yes"), ("rollback", "--yes"), ("up", "alpha", "--dark"), ("down", "--dark"),
           ("gc",), ("restore",), ("pin", "1"), ("unpin", "1"), ("unlock",), ("adopt",), ("fsck", "--repair")]


def test_a_held_lock_refuses_each_mutating_command_at_once(scratch: Scratch) -> None:
    state = scratch.root / "state"
    holder = _holder(state)
    try:
        # All at once, each its own process: pin, unpin and fsck --repair wait 10 s for the lock
        # (actions/bookkeeping.py, fsck.py) before they refuse; one after another took 30 s.
        with ThreadPoolExecutor(max_workers=len(REFUSED)) as pool:
            runs = list(pool.map(lambda args: run_cli(scratch.config, *args, timeout=60), REFUSED))
        for args, r in zip(REFUSED, runs, strict=True):
            assert r.returncode == 1, (args, r.stdout, r.stderr)
            assert f"the node is locked by pid {holder.pid}" in r.stderr and "switch eagle3" in r.stderr, args
    finally:
        holder.kill()
        holder.wait()
    assert not (state / "audit.log").exists()  # refused before anything: no line, as for a busy switch
    assert not (state / "revisions").exists()


def test_unlock_clears_only_a_stale_lock_and_the_small_changes_are_audited(scratch: Scratch) -> None:
    """unlock and down --dark never wrote the audit log; through the wrapper they do."""
    state = scratch.root / "state"
    holder = _holder(state)
    try:
        busy = run_cli(scratch.config, "unlock", in_process=True)
        assert busy.returncode == 1 and f"pid {holder.pid}" in busy.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    cleared = run_cli(scratch.config, "unlock", in_process=True, check=True)
    assert f"cleared the stale lock of pid {holder.pid}" in cleared.stdout
    assert run_cli(scratch.config, "unlock", in_process=True, check=True).stdout.strip() == "no stale lock"
    assert run_cli(scratch.config, "down", "--dark", in_process=True, check=True).stdout.strip() == "no dark stack"
    audit = json.loads(run_cli(scratch.config, "audit", "--json", in_process=True, check=True).stdout)
    assert [(a["command"], a["outcome"]) for a in audit] == [("unlock", "ok"), ("unlock", "ok"),
                                                              ("down --dark", "ok")]
    assert audit[0]["cleared"].startswith(f"pid {holder.pid} ") and audit[1]["cleared"] is None
