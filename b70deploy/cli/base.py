"""The root command group and shared context: a thin layer that parses flags and calls b70deploy.actions.

Heavy imports (pydantic, docker, requests) happen inside commands, so `--help` is fast.
Exit codes: 0 ok, 1 the operation failed, 2 bad input (nothing changed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..config.node import Node

EPILOG_EXIT = "Exit codes: 0 ok, 1 operation failed, 2 bad input (nothing changed)."


class Ctx:
    def __init__(self, config: str | None, stacks_dir: str | None, node_name: str | None = None) -> None:
        self.config_path = config
        self.stacks_dir = stacks_dir
        self.node_name = node_name
        self._node: Node | None = None

    @property
    def node(self) -> Node:
        if self._node is None:
            from ..config.node import load_node
            from ..docker.endpoint import activate

            self._node = load_node(self.config_path, stacks_dir=self.stacks_dir, name=self.node_name)
            activate(self._node.docker_env)  # this process now talks to that node's engine
        return self._node

    def nodes(self, select: str) -> list[Node]:
        from ..config.node import load_nodes

        return load_nodes(self.config_path, select=select, stacks_dir=self.stacks_dir)


pass_ctx = click.make_pass_decorator(Ctx)


@click.group(epilog=EPILOG_EXIT, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config", metavar="FILE", envvar="B70DEPLOY_CONFIG",
              help="Node config (default: $B70DEPLOY_CONFIG, ./b70deploy.yaml, /etc/b70deploy/node.yaml).")
@click.option("--stacks-dir", metavar="DIR", envvar="B70DEPLOY_STACKS",
              help="Stack catalogue folder (default: node config's stacks_dir, else the shipped one).")
@click.option("--node", "node_name", metavar="NAME", envvar="B70DEPLOY_NODE",
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
