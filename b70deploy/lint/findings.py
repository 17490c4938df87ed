"""What a lint rule reads (LintContext) and what it reports (Finding)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..config.node import Node
from ..config.schema import Stack
from ..render.files import Rendered
from ..render.patches import PatchedFile
from .kv import MeasuredKV

if TYPE_CHECKING:
    from ..docker.image_inspect import ImageFacts  # an annotation only: --no-docker never loads the SDK

Severity = Literal["error", "warning"]
STACK_INVALID = "stack-invalid"  # the one finding no rule emits: the stack file does not load


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    message: str
    fix: str
    stack: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def one_line(self) -> str:
        who = f"{self.stack}: " if self.stack else ""
        return f"{who}{self.severity} [{self.id}] {self.message}; fix: {self.fix}"

    def as_warning(self) -> str:
        """The line after a printer's `warning: `: the severity word only where it is not "warning"
        (an import's error-level finding is still shown as one)."""
        return self.one_line().replace("warning [", "[", 1) if self.severity == "warning" else self.one_line()


@dataclass
class LintContext:
    """Everything the rules look at. Fields left None mean "not checked" (no Docker, no models dir)."""

    node: Node
    stack: Stack
    rendered: Rendered
    models_dir: Path | None = None
    models_dir_missing: Path | None = None          # the node's models folder, absent on this host
    image: ImageFacts | None = None
    image_error: str | None = None
    compose_config: dict[str, Any] | None = None    # `docker compose config --format json`
    compose_error: str | None = None
    patch_errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # patch -> (rule id, message)
    patched: list[PatchedFile] = field(default_factory=list)
    patches_upstream: list[str] = field(default_factory=list)  # a note per patch this vLLM fixed itself
    port_owner: str | None = None                   # who holds the prod port, when not our project
    subnet_owner: str | None = None                 # the engine's network the host door's subnet overlaps, in words
    measured_kv: MeasuredKV | None = None           # a previous boot's KV memory, from the state dir
    gpu_missing: list[str] = field(default_factory=list)  # what the engine lacks for the stack's GPU access
    skipped: list[str] = field(default_factory=list)
    # Hot standby's level 1 (weights to host RAM): read only for a stack that may sleep, on this host.
    host_available: int | None = None              # MemAvailable of /proc/meminfo, bytes
    weights_bytes: int | None = None               # the model folder's size, bytes
