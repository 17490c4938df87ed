"""Simulator commands: build the fake vLLM images used by tests and `make demo`."""

from __future__ import annotations

from pathlib import Path

import click

from ..sim.box import MODELS, write_models
from ..sim.image import build as build_images
from ..ui.output import emit_json
from . import options


@click.group(epilog="Example: b70deploy sim build --json")
def sim() -> None:
    pass  # a group: its summary is in COMMANDS (base.py), its commands below


@sim.command(epilog="Example: b70deploy sim build --force")
@click.option("--force", is_flag=True, help="Rebuild even when the inputs are unchanged.")
@options.as_json("the result")
def build(force: bool, as_json: bool) -> None:
    """Build b70sim/vllm:bash-c, :serve and :bash-c-drift with `docker import` (skipped when up to date)."""
    results = build_images(force=force)
    if as_json:
        emit_json([{"tag": r.tag, "status": r.status, "size_bytes": r.size_bytes,
                    "seconds": round(r.seconds, 2), "inputs": r.inputs} for r in results])
        return
    for r in results:
        click.echo(f"{r.tag}: {r.status} ({r.size_bytes / 1e6:.1f} MB, {r.seconds:.1f} s)")
    built = sum(r.status == "built" for r in results)
    click.echo(f"sim images: {built} built, {len(results) - built} up to date")


@sim.command(epilog="Example: b70deploy sim models /tmp/demo/models")
@click.argument("folder", type=click.Path(file_okay=False))
def models(folder: str) -> None:
    """Write the post's model folders (config.json files, sparse weights) into FOLDER."""
    write_models(Path(folder))
    click.echo(f"wrote {len(MODELS)} simulated model folders into {folder}")
