"""What lint reads for hot standby from this host: the model folder's size and MemAvailable, only for a
stack that sleeps at level 1."""

from __future__ import annotations

from kit.scratch import MINIMAL_STACK, Scratch

from b70deploy.config.node import load_node
from b70deploy.lint import lint_stack
from b70deploy.lint.gather import context


def test_level_1_reads_the_weights_and_the_hosts_memory(scratch: Scratch) -> None:
    model = scratch.root / "models" / MINIMAL_STACK["model"]["path"]
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    scratch.write_stack("one", {**MINIMAL_STACK, "standby": {"mode": "sleep", "level": 1}})
    scratch.write_stack("plain", MINIMAL_STACK)
    node = load_node(str(scratch.write_config({"door": {"enabled": True}, "platform": "cuda"})))
    ctx = context(node, node.catalogue().load("one"), docker=False)
    assert ctx.weights_bytes == 4096 + 2 and ctx.host_available is not None and ctx.host_available > 0
    assert not [f for f in lint_stack(ctx) if f.id == "standby-host-ram"]  # 4 KiB fit
    plain = context(node, node.catalogue().load("plain"), docker=False)
    assert plain.weights_bytes is None and plain.host_available is None  # not asked: no standby
