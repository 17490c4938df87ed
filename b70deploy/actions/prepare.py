"""Load a stack for a node and render it: the first half of render, diff, lint and switch."""

from __future__ import annotations

from dataclasses import dataclass

from .. import devices as devices_mod
from ..node import Node
from ..render import Rendered, render
from ..schema import Stack
from ..secrets_file import load_secrets


@dataclass(frozen=True)
class Prepared:
    stack: Stack
    rendered: Rendered
    warnings: tuple[str, ...]


def prepare(node: Node, name: str, *, port: int | None = None, project: str | None = None) -> Prepared:
    stack = node.catalogue().load(name)
    access = devices_mod.scan(node.device_dir, node.config.gids)
    secrets, warnings = load_secrets(node.secrets_env_file)
    rendered = render(stack, node, access, secrets=secrets, port=port, project=project)
    return Prepared(stack=stack, rendered=rendered, warnings=tuple(warnings))
