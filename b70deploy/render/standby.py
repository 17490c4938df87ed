"""Hot standby's render rules (pure): whether a stack may sleep on its node, and what that renders.

A stack that may sleep runs with `--enable-sleep-mode` and VLLM_SERVER_DEV_MODE=1, the variable
that attaches vLLM's /sleep, /wake_up and /is_sleeping (vllm/entrypoints/serve/sleep/api_router.py:52-56,
0.21.0). The front door refuses those routes to clients (render/door.py), so standby needs the door.

Whether the image's vLLM can sleep on the node's platform is vLLM's Platform.is_sleep_mode_available()
(vllm/platforms/interface.py): CUDA and ROCm in 0.21.0 (:191-196), CUDA, ROCm and XPU in 0.32.0
(:231-236); issue 24 names 0.23 as the release that added XPU. Elsewhere vLLM exits at start-up with
"Sleep mode is not supported on current platform." (vllm/config/model.py:508 in 0.21.0), so such a
stack renders without the flag and its switch stops first, with a note.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    from ..config.node import Node
    from ..config.schema import Stack, Standby

SLEEP_FLAG = "--enable-sleep-mode"
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}
XPU_SLEEP_FROM = (0, 23)
# major.minor of a vLLM version string ("0.21.1.dev17+g0a4756bb5" -> 0, 21); render/patches.py imports
# this package's files module, so its own parser is out of reach from here.
_MINOR = re.compile(r"^v?(\d+)\.(\d+)")


def standby_of(stack: Stack, node: Node) -> Standby:
    """The stack's own `standby:`, else the node's."""
    return stack.standby if stack.standby is not None else node.config.standby


def can_sleep(platform: str, vllm_version: str | None) -> bool | None:
    """Platform.is_sleep_mode_available() for that vLLM on that platform; None: the version is not known
    (no Docker) and the platform's answer depends on it."""
    if platform in ("cuda", "rocm"):
        return True
    if platform != "xpu":
        return False
    m = _MINOR.match(vllm_version or "")
    return None if m is None else (int(m.group(1)), int(m.group(2))) >= XPU_SLEEP_FROM


def wanted(stack: Stack, node: Node) -> bool:
    """The stack asks to sleep; refused in one line on a node without the door."""
    if not standby_of(stack, node).sleeps:
        return False
    if not node.config.door.enabled:
        raise UserError("standby: sleep needs the front door (door.enabled is false): vLLM's sleep routes come "
                        "with its development endpoints, which only the door keeps from clients",
                        where=f"stack {stack.name}: standby",
                        fix=f"set door.enabled: true in {node.source}, or standby: off")
    return True


def sleeps(stack: Stack, node: Node, vllm_version: str | None) -> bool:
    """Render the stack with sleep mode: asked for, and not known to be refused by this vLLM on this platform."""
    return wanted(stack, node) and can_sleep(node.config.platform, vllm_version) is not False


def cannot_sleep_note(stack: Stack, node: Node, vllm_version: str | None) -> str | None:
    """The one-line note for a stack that asks to sleep where its vLLM cannot; None otherwise."""
    if not wanted(stack, node) or can_sleep(node.config.platform, vllm_version) is not False:
        return None
    what = f"vLLM {vllm_version}" if vllm_version else "vLLM"
    return (f"standby: {what} has no sleep mode on platform {node.config.platform} "
            "(Platform.is_sleep_mode_available: CUDA and ROCm, XPU from 0.23): rendered without "
            f"{SLEEP_FLAG}; the switch stops the live stack first")


def rendered_to_sleep(compose: bytes) -> bool:
    """The rendered compose file runs vLLM with sleep mode (the flag, and the dev-mode variable beside it)."""
    return SLEEP_FLAG.encode() in compose


def level_of(stack: Stack, node: Node) -> int:
    """The sleep level: the one set, else 1 (the weights kept in host RAM, so /wake_up alone brings the
    stack back; level 2 drops them and a wake then needs them reloaded: vllm/v1/worker/gpu_worker.py
    sleep/wake_up, 0.21.0). lint standby-host-ram checks that host RAM holds them."""
    return standby_of(stack, node).level or 1
