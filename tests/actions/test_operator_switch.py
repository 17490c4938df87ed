"""On the real engine: a node whose vLLM service has its operator's name (`service: vllm-server`),
a stack with `compose:` keys (limits, a healthcheck, a static address on the project network,
expose for a proxy), switched in and then to another stack: Docker gives the container what the
passthrough says, the tool's probes reach it on the loopback port, a companion reaches it by name."""

from __future__ import annotations

import json
import secrets

import pytest
import yaml
from kit.simnode import SimNode, docker

pytestmark = pytest.mark.docker

HEALTH = ["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health')"]


def test_a_named_service_with_passthrough_keys_switches_in_and_on(node: SimNode) -> None:
    subnet = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(250)}"
    cfg = yaml.safe_load(node.config.read_text())
    cfg |= {"service": "vllm-server", "networks": {"default": {"ipam": {"config": [{"subnet": f"{subnet}.0/24"}]}}}}
    # The companion waits on the vllm service's healthcheck, as a proxy in front of it does.
    cfg["companions"][0]["compose"] = {"depends_on": {"vllm-server": {"condition": "service_healthy"}}}
    node.config.write_text(yaml.safe_dump(cfg))
    passthrough = {"pids_limit": 2048, "ulimits": {"nofile": {"soft": 4096, "hard": 8192}}, "cap_drop": ["NET_RAW"],
                   "mem_limit": "8g", "expose": ["8000"], "healthcheck": {"test": HEALTH, "interval": "2s"},
                   "networks": {"default": {"ipv4_address": f"{subnet}.10"}}}
    for name, base in (("passthru", "alpha"), ("passthru-b", "beta")):
        (node.root / "stacks" / f"{name}.yaml").write_text(yaml.safe_dump({"extends": base, "compose": passthrough}))

    for name in ("passthru", "passthru-b"):
        r = node.cli("switch", name, "--yes", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        ids = node.containers("vllm-server")
        assert len(ids) == 1 and not node.containers("vllm"), ids
        attrs = json.loads(docker("inspect", ids[0]).stdout)[0]
        host = attrs["HostConfig"]
        assert attrs["Config"]["Labels"]["b70deploy.stack"] == name
        assert host["PidsLimit"] == 2048 and host["Memory"] == 8 * 2**30
        assert host["CapDrop"] in (["NET_RAW"], ["CAP_NET_RAW"])  # the engine's spelling varies by version
        assert host["Ulimits"] == [{"Name": "nofile", "Soft": 4096, "Hard": 8192}]
        assert host["PortBindings"]["8000/tcp"] == [{"HostIp": "127.0.0.1", "HostPort": str(node.prod)}]
        nets = attrs["NetworkSettings"]["Networks"]
        assert [n["IPAddress"] for n in nets.values()] == [f"{subnet}.10"]
        assert node.answers("vllm-server") == name
        webui = node.containers("webui")
        assert webui, "the companion started"
        env = json.loads(docker("inspect", "-f", "{{json .Config.Env}}", webui[0]).stdout)
        assert not any(e.startswith("OPENAI_API_BASE_URL=") for e in env)  # never given what it did not have
