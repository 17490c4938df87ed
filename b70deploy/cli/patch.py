"""Patch definition commands: `patch from-file`."""

from __future__ import annotations

from pathlib import Path

import click

from ..actions.patch_from_file import PatchFromFile
from ..ui.output import emit_json
from . import options
from .base import Ctx, pass_ctx


@click.group(epilog="Example: b70deploy patch from-file vllm-patches/marlin_utils.py --target "
                    "model_executor/layers/quantization/utils/marlin_utils.py --image intel/vllm:latest "
                    "--name marlin-local")
def patch() -> None:
    pass  # a group: its summary is in COMMANDS (base.py), its commands below


@patch.command("from-file", epilog="Example: b70deploy patch from-file /apps/b70-vllm/vllm-patches/marlin_utils.py "
                                   "--target model_executor/layers/quantization/utils/marlin_utils.py "
                                   "--image intel/vllm:latest --name marlin-local --json")
@click.argument("file", metavar="FILE")
@click.option("--target", required=True, metavar="PATH_IN_IMAGE",
              help="The file FILE corrects: its absolute path in the image, or its path inside the vllm package.")
@click.option("--image", required=True, metavar="REF", help="The image whose file FILE corrects (on this engine).")
@click.option("--name", required=True, help="The patch's name; the file is <patches dir>/NAME.yaml.")
@options.as_json("what was written")
@pass_ctx
def from_file(ctx: Ctx, file: str, target: str, image: str, name: str, as_json: bool) -> None:
    """Write a patch definition from a corrected file on disk: the smallest find/replace edits
    (else a diff) against the image's own file, so a switch to an image whose file has changed
    stops with the line that no longer matches. Refuses to overwrite a file."""
    done = PatchFromFile(ctx.node, Path(file), target, image, name).run()
    if as_json:
        emit_json(done.to_json())
        return
    kind = f"{len(done.spec.edits)} edit(s)" if done.spec.edits else "a unified diff"
    click.echo(f"wrote {done.path} ({kind} of {done.spec.target}, for vLLM "
               f"{', '.join(done.spec.applies_to.vllm_versions)}); add `patches: [{name}]` to a stack to use it")
