"""Kubernetes export helpers for tests (issue 38): schema validation of every object against
three Kubernetes versions, the files a switch writes with patched files made from the sim
image's stand-in vllm package (no engine), Kubernetes' own $(VAR) expansion, and the secret
canaries."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from b70deploy.config.node import Node
from b70deploy.config.schema import Stack, Standby
from b70deploy.config.secrets_file import load_secrets
from b70deploy.render.draft import served_draft_path
from b70deploy.render.files import Rendered, render
from b70deploy.render.gpu import access_for
from b70deploy.render.patches import deploy_files, find_patch, materialize, mounts_for
from b70deploy.sim.vllm_tree import VARIANTS, Variant, vllm_files

VERSIONS = ("1.35", "1.36", "1.37")  # 1.37 and the last two minor versions
CANARY = "hf_CANARY_7f3e$(HOME)$$9"  # a secret whose bytes must never leave vllm.env
OVERRIDE = "CANARY-override-41c2"    # a secret value over one of the stack's own env keys


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        for version in VERSIONS:
            assert kubernetes_validate.validate(obj, version, strict=True) == version, (obj["kind"], version)


class SimImage:
    """An image's vllm package as the sim images carry it (b70deploy/sim/vllm_tree.py): what
    materialize reads a patch's original file from, without an engine."""

    def __init__(self, variant: Variant) -> None:
        self.variant, self.files = variant, vllm_files(variant)

    def image_id(self, image_ref: str) -> str:
        return "sha256:" + "cd" * 32

    def vllm_package_dir(self, image_ref: str) -> str | None:
        return f"{self.variant.site_packages}/vllm"

    def vllm_version(self, image_ref: str) -> str | None:
        return self.variant.version

    def read_file(self, image_ref: str, path: str) -> bytes | None:
        text = self.files.get(path.removeprefix(self.variant.site_packages + "/"))
        return None if text is None else text.encode()


def switch_render(node: Node, stack: Stack) -> Rendered:
    """The files a switch writes for `stack` (docker/produce.py's render call), the patched files
    made from the sim image of the stack's entrypoint style; standby off, as the export renders."""
    variant = VARIANTS[0] if stack.entrypoint_style == "bash-c" else VARIANTS[1]
    patched = materialize([find_patch(node.patches_dir, p) for p in stack.patches], stack.image, SimImage(variant))
    secrets, _ = load_secrets(node.secrets_env_file)
    stack = stack.model_copy(update={"standby": Standby()})
    return render(stack, node, access_for(node, stack), secrets=secrets, mounts=mounts_for(patched),
                  patch_files=deploy_files(patched), draft_path=served_draft_path(stack, node.config.models_target))


def kube_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of command, args and env values: `$$` -> `$`, `$(NAME)` -> its value
    when defined, anything else as written (kubernetes/kubernetes
    third_party/forked/golang/expansion/expand.go, the cases of its expand_test.go)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)
