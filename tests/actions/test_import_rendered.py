"""A saved copy of a compose file b70deploy itself rendered imports like a hand-made one (issue 23):
its warm-boot cache bind and cache variables are the render's own, not the stack's."""

from __future__ import annotations

import pytest
import yaml
from kit.simnode import SimNode

pytestmark = pytest.mark.docker


def test_a_rendered_copy_imports_without_a_missing_cache_mount(node: SimNode) -> None:
    out = node.root / "saved"
    node.cli("render", "alpha", "--out", str(out), check=True)
    service = yaml.safe_load((out / "docker-compose.yml").read_text())["services"]["vllm"]
    assert any(v.get("source") == "${CACHE_DIR:?}" for v in service["volumes"] if isinstance(v, dict))

    r = node.cli("import", str(out / "docker-compose.yml"), "--as", "alpha")
    assert r.returncode == 0, r.stderr
    assert "mount-missing" not in r.stdout + r.stderr
    [row] = node.json("history")
    assert (row["kind"], row["stack"], row["outcome"]) == ("import", "alpha", "unproven")
    made = node.json("stack", "from-compose", str(out / "docker-compose.yml"), "--name", "again",
                     "--out", str(node.root / "again.yaml"))
    stack = made["stack_doc"]
    assert not [m for m in stack.get("mounts", []) if m["target"] == "/var/cache/b70deploy"]
    assert not set(stack.get("env", {})) & {"VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "SYCL_CACHE_DIR"}
