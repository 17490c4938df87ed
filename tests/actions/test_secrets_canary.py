"""A secrets canary on a real switch: the value in the node's secrets_env_file reaches the
container through the revision's vllm.env (0600) and nowhere else the tool writes or prints.

One node (the `node` fixture) with a secrets file: a switch, a second switch, a failed switch
(the `crash` stack, rolled back by the switch itself) and an explicit rollback; then every
read-only command. The canary must be absent from every command's stdout and stderr, the
journal, the audit log and every file under the state dir, except each revision's own
files/vllm.env, which must hold it with mode 0600. One key is secret-looking (HF_TOKEN), one
is not (SERVICE_URL): a value is secret because it came from the secrets file, not by its name.
"""

from __future__ import annotations

import os
import stat
import subprocess
import uuid

import pytest
import yaml
from kit.simnode import SimNode

pytestmark = pytest.mark.docker

CANARY = f"b70canary{uuid.uuid4().hex}"


def with_secrets(node: SimNode) -> None:
    secrets = node.root / "secrets.env"
    secrets.write_text(f"HF_TOKEN={CANARY}-token\nSERVICE_URL=https://user:{CANARY}-url@example.invalid\n")
    os.chmod(secrets, 0o600)
    cfg = yaml.safe_load(node.config.read_text())
    cfg["secrets_env_file"] = str(secrets)
    node.config.write_text(yaml.safe_dump(cfg))


def test_the_secrets_canary_is_only_in_each_revisions_vllm_env(node: SimNode) -> None:
    with_secrets(node)
    ran: list[tuple[str, subprocess.CompletedProcess[str]]] = []

    def cli(*args: str, code: int | None = 0) -> subprocess.CompletedProcess[str]:
        r = node.cli(*args)
        ran.append((" ".join(args), r))
        if code is not None:
            assert r.returncode == code, (args, r.stdout, r.stderr)
        return r

    cli("switch", "alpha", "--yes")
    cli("switch", "beta", "--yes")
    failed = cli("switch", "crash", "--yes", code=1)
    assert "node back on revision 2 (beta), healthy" in failed.stdout, failed.stdout + failed.stderr
    cli("rollback", "--yes")  # back to alpha (revision 1's bytes)
    hist = node.json("history")
    assert [h["outcome"] for h in hist][-2:] == ["failed", "deployed"], hist
    numbers = [h["number"] for h in hist]
    for args in (("status",), ("status", "--json"), ("history",), ("history", "--json"), ("audit",),
                 ("audit", "--json"), ("diff", "beta"), ("diff", "beta", "--json"), ("diff", "1", "2"),
                 ("diff", "2", "3", "--json"), ("render", "alpha"), ("show", "alpha"), ("lint", "alpha"),
                 ("lint", "crash", "--json"), ("stacks",), ("switch", "beta", "--dry-run")):
        cli(*args, code=None)
    for n in numbers:
        cli("logs", str(n), code=None)
        cli("diagnose", str(n), "--json", code=None)

    for what, r in ran:
        assert CANARY not in r.stdout, f"`b70deploy {what}` printed the secret on stdout"
        assert CANARY not in r.stderr, f"`b70deploy {what}` printed the secret on stderr"

    state = node.state
    for name in ("journal.jsonl", "audit.log"):
        assert (state / name).is_file(), name
    saved_logs = list(state.glob("revisions/*/container.log"))
    assert len(saved_logs) == len(numbers), "a revision that ran has no saved container log"
    holders = []
    for path in sorted(p for p in state.rglob("*") if p.is_file()):
        if CANARY.encode() in path.read_bytes():
            holders.append(path)
            rel = path.relative_to(state)
            assert rel.parts[0] == "revisions" and rel.parts[2:] == ("files", "vllm.env"), \
                f"the secret leaked into {rel}"
    env_files = sorted(state.glob("revisions/*/files/vllm.env"))
    assert env_files and holders == env_files, (holders, env_files)  # every revision's own env holds it
    for path in env_files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        text = path.read_text()
        assert f"HF_TOKEN='{CANARY}-token'" in text and f"{CANARY}-url" in text
    deployed = node.deploy / "vllm.env"
    assert stat.S_IMODE(deployed.stat().st_mode) == 0o600 and CANARY in deployed.read_text()

