"""The root command group and shared context: a thin layer that parses flags, builds an
action from b70deploy.actions and prints what it returns.

The root group is lazy: a command's module (and the libraries it needs) is imported only
when that command runs, so `b70deploy --help` stays fast. `COMMANDS` names each command's
module and its summary, the first line of its help: the root `--help` shows it without importing
the module, and the command's own `--help` starts with it (its docstring holds the rest). Every
command that changes the node or the state dir prints through `mutate` (the reporter, the exit
line) around an action that runs inside actions/mutating.py (the lock, the audit line,
notifications). Exit codes: 0 ok, 1 the operation failed, 2 bad input (nothing changed).
"""

from __future__ import annotations

import gc
import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import click

from ..docker.endpoint import activate  # stdlib only: safe for the root --help
from .complete import node_names

if TYPE_CHECKING:
    from pathlib import Path

    from ..config.node import Node
    from ..ui.progress import Reporter

EPILOG_EXIT = "Exit codes: 0 ok, 1 operation failed, 2 bad input (nothing changed)."


class Ctx:
    def __init__(self, config: str | None, stacks_dir: str | None, node_name: str | None = None) -> None:
        self.config_path = config
        self.stacks_dir = stacks_dir
        self.node_name = node_name
        self._node: Node | None = None
        self._exposed_said = False

    @property
    def node(self) -> Node:
        if self._node is None:
            # Lazy: the root group loads this module for `b70deploy --help`, and config.node pulls
            # in yaml, and pydantic until the config is cached (test_help_imports_no_heavy_module).
            from ..config.node import load_node

            self._node = load_node(self.config_path, stacks_dir=self.stacks_dir, name=self.node_name)
            activate(self._node.docker_env)  # this process now talks to that node's engine
            from ..ui.notice import node_secrets
            from ..ui.output import guard

            guard(node_secrets(self._node))  # no output of this command shows one of the node's secrets
            self._say_if_exposed(self._node.source)
            command = click.get_current_context(silent=True)
            if command is not None:  # the first command on a node makes its state dir: cache its settings then
                command.call_on_close(self._node.remember)
            changes = command is not None and _full_name(command) in MUTATING and not command.params.get("dry_run")
            if self._node.source is None and changes:
                from ..actions.mutating import refuse_defaults

                refuse_defaults(self._node)  # before its own checks: the first thing to fix is this
            elif self._node.source is None:
                from ..ui.output import warn

                warn("no node config found: using the built-in defaults (project b70, 0.0.0.0:8000, /models); "
                     "`b70deploy init` writes one for this node")
        return self._node

    def nodes(self, select: str) -> list[Node]:
        from ..config.node import load_nodes  # lazy, as in `node` above: keeps the root --help light

        nodes = load_nodes(self.config_path, select=select, stacks_dir=self.stacks_dir)
        if nodes:
            self._say_if_exposed(nodes[0].source)
        return nodes

    def _say_if_exposed(self, source: Path | None) -> None:
        """Once a run: the node config holds a secret in clear and others may read it (a warning; the
        command goes on)."""
        from ..ui.notice import exposed_config
        from ..ui.output import warn

        if self._exposed_said:
            return
        self._exposed_said = True
        exposed = exposed_config(source)
        if exposed:
            warn(exposed)


pass_ctx = click.make_pass_decorator(Ctx)

# The commands that change the node or the state dir (tests/cli/test_mutating.py checks each runs
# through `mutate`, and that every other command is listed there with why it is not one).
MUTATING = frozenset({"switch", "rollback", "resume", "drain", "restore", "gc", "up", "down", "pin", "unpin",
                      "prune", "unlock", "adopt", "import", "bench cycle", "fsck"})


def _full_name(ctx: click.Context) -> str:
    """A command's name below the root group: "bench cycle"."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(names))



class Command(NamedTuple):
    module: str   # in b70deploy.cli
    summary: str  # the one source of the command's first help line: the root --help shows it unimported


COMMANDS: dict[str, Command] = {
    "stacks": Command("catalogue", 'List the stack catalogue.'),
    "show": Command("catalogue", "Show STACK after `extends:` and the node's overlay are merged."),
    "render": Command("catalogue", "Render STACK into the files a switch writes; nothing on the node is touched."),
    "diff": Command("catalogue", "What `switch STACK` would change in the deploy dir, or how two revisions differ "
                             "(files and boot facts)."),
    "lint": Command("lint", 'Preflight STACK(s): every failure the post hit, caught before a boot.'),
    "diagnose": Command("lint", 'Name the fatal signature in a vLLM boot log, with the fix, and the boot facts it '
                                'states.'),
    "draft": Command("lint", 'EAGLE draft tools.'),
    "switch": Command("deploy", 'Switch the node to STACK: preflight, drain, verify, activate, wait healthy, check, '
                                'commit.'),
    "rollback": Command("deploy", "Bring back an earlier revision's exact files, pinned to the image id that ran "
                                  "them."),
    "resume": Command("deploy", 'Finish (or, if it was undoing, undo) a run that was killed; see `status`.'),
    "drain": Command("deploy", 'Stop vllm and its companions (compose stop; never firewall rules) so the router '
                               'drains.'),
    "verify": Command("deploy", 'Check the node is idle: prod port, feeder connections, load average.'),
    "restore": Command("deploy", 'Start the current revision again after a drain and wait for /health (not a '
                                 'rollback).'),
    "door": Command("door", "The front door: where it points, what it holds, its last switch; --build makes its "
                            "image."),
    "status": Command("records", 'What runs now: revision, stack, health, boot facts, image, interrupted runs.'),
    "history": Command("records", 'Every revision: stack, outcome, image, KV tokens, time to healthy.'),
    "logs": Command("revisions", 'Print the container log kept with REVISION (failed boots keep theirs).'),
    "pin": Command("revisions", 'Keep REVISION forever (prune skips it).'),
    "unpin": Command("revisions", 'Let prune remove REVISION again.'),
    "prune": Command("revisions", 'Delete old revisions, keeping the newest N, every pinned one and the current one.'),
    "gc": Command("deploy", 'Remove what no revision needs: keep tags (and images) no revision left runs, unused '
                            'caches.'),
    "audit": Command("revisions", 'The audit log: who ran which mutating command, when, and how it ended.'),
    "unlock": Command("revisions", 'Clear a stale lock left by a killed run (refused while its process runs).'),
    "fsck": Command("revisions", "Check the revision store: hashes, records, index, current, images; --repair "
                                 "mends."),
    "up": Command("deploy", 'Run STACK on the dark port for benchmarking; production files are never touched.'),
    "down": Command("deploy", 'Stop and remove the dark stack.'),
    "bench": Command("bench", 'Measure prefill, decode or aggregate tok/s of a server (one results file per run).'),
    "capture": Command("bench", 'Fail-open proxy: tee /v1 request bodies (and response metadata) to disk, always '
                                'forward.'),
    "replay": Command("bench", 'Send captured requests verbatim; report outcome, tok/s and acceptance per request.'),
    "patch": Command("patch", 'Make patch definitions from corrected files.'),
    "watch": Command("watch", 'Supervise the node after each switch: bake window, automatic rollback, alerts, drift.'),
    "sim": Command("sim", 'The simulated vLLM node (no GPU, no registry).'),
    "stack": Command("stack", 'Make stack files from what already runs.'),
    "export": Command("export", "Write STACK (or a revision) as manifests for another orchestrator: Kubernetes."),
    "init": Command("adopt", "Discover the node and write its config: GPU platform, gids, compose project, port, "
                             "models dir, companions."),
    "adopt": Command("adopt", "Record the live hand-made deployment as a revision (kind adopt); nothing is restarted."),
    "import": Command("adopt", "Keep a saved compose copy as a revision of STACK (kind import) that `rollback STACK` "
                               "runs."),
}


class LazyGroup(click.Group):
    """Imports a command's module when the command is looked up, not before."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"{__package__}.{COMMANDS[cmd_name].module}")
        # A command named for a Python keyword (`import`) is defined as `import_`.
        command = getattr(module, cmd_name, None) or getattr(module, f"{cmd_name}_")
        assert isinstance(command, click.Command)
        summary = COMMANDS[cmd_name].summary
        if not (command.help or "").startswith(summary):  # once per process: the docstring has the rest
            command.help = f"{summary}\n\n{inspect.cleandoc(command.help)}" if command.help else summary
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            names = self.list_commands(ctx)
            limit = formatter.width - 6 - max(len(n) for n in names)  # as click.Group does
            # A bare Command cuts the text as the real one would, without importing it.
            formatter.write_dl([(n, click.Command(n, help=COMMANDS[n].summary).get_short_help_str(limit))
                                for n in names])


@click.group(cls=LazyGroup, epilog=EPILOG_EXIT, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config", metavar="FILE", envvar="B70DEPLOY_CONFIG",
              help="Node config (default: $B70DEPLOY_CONFIG, ./b70deploy.yaml, /etc/b70deploy/node.yaml).")
@click.option("--stacks-dir", metavar="DIR", envvar="B70DEPLOY_STACKS",
              help="Stack catalogue folder (default: node config's stacks_dir, else the shipped one).")
@click.option("--node", "node_name", metavar="NAME", envvar="B70DEPLOY_NODE", shell_complete=node_names,
              help="With an inventory (nodes: in the config): the node a command acts on.")
@click.version_option(package_name="b70deploy")
@click.pass_context
def cli(click_ctx: click.Context, config: str | None, stacks_dir: str | None, node_name: str | None) -> None:
    """Deploy vLLM Compose stacks on a GPU node: health-gated switch, one-command rollback.

    \b
    Example:
      b70deploy stacks
      b70deploy render eagle3
    """
    click_ctx.obj = Ctx(config, stacks_dir, node_name)
    if not gc.isenabled():  # `run` held collections off while the command's modules loaded (click
        gc.freeze()  # imports it before this callback): what they made lives as long as the process
        gc.enable()


T = TypeVar("T")


def mutate(run: Callable[[Reporter], T], *, quiet: bool = False, live: bool = True,
           end: Callable[[T], None] | None = None) -> T:
    """The CLI's half of every mutating command: the progress reporter (live on a terminal, or
    plain lines; `quiet` under --json) closed however `run` ends, then `end`, the exit line
    (it may exit non-zero). The action's half, lock and audit, is actions/mutating.py."""
    from ..ui.progress import PlainReporter, make_reporter

    reporter: Reporter = make_reporter(quiet=quiet) if live else PlainReporter()
    try:
        result = run(reporter)
    finally:
        reporter.close()
    if end is not None:
        end(result)
    return result
