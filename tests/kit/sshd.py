"""A real OpenSSH server on loopback in front of one of the extra engines (kit/engines.py), so an
inventory node can be `docker_host: ssh://root@127.0.0.1:PORT` (the `ssh_engine` fixture in
tests/actions/conftest.py).

Everything lives in one temp folder and nothing of the system's ssh set-up is read or changed:

- sshd: `/usr/sbin/sshd -D -e -f <dir>/sshd_config`, its own ed25519 host key, `ListenAddress
  127.0.0.1` on a free port, keys only (PasswordAuthentication and KbdInteractiveAuthentication
  no, UsePAM no), `AuthorizedKeysFile <dir>/authorized_keys` (StrictModes no: the folder is
  under /tmp, which is world-writable). Its one privilege-separation folder, /run/sshd, is made
  if missing (the packaged service makes the same at boot); it is left in place, as another
  sshd may be using it.
- The client key, made here by ssh-keygen, is authorized with a forced command,
  `restrict,command="DOCKER_HOST=unix://<engine sock> exec docker system dial-stdio"`: whatever
  the client asks to run (the docker CLI and Compose send `docker system dial-stdio`, the SDK the
  same), the session is a dial-stdio to that engine's socket, not the host's default engine.
- The client side: ssh reads ~/.ssh from the passwd entry's home, not $HOME, so a temp HOME
  would not reach it. Instead `<dir>/bin/ssh`, first on the PATH given to b70deploy, runs
  `/usr/bin/ssh -F <dir>/ssh_config "$@"`: IdentityFile the test key, IdentitiesOnly,
  UserKnownHostsFile <dir>/known_hosts (holding `[127.0.0.1]:PORT <host key>`), no global known
  hosts, StrictHostKeyChecking yes, BatchMode yes (never a prompt), and the connection sharing
  docs/multinode.md advises operators to use (ControlMaster auto, ControlPersist): a docker
  call costs a session on an open connection, not a new login (about 0.1 s instead of 0.3 s
  here; the SDK makes a session per request). sshd logs each session at LogLevel VERBOSE.
  The docker CLI, Compose and the SDK (use_ssh_client=True) all run `ssh` from PATH, so all
  three go through it, exactly as they would through an operator's ~/.ssh/config.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself: it must be started by absolute path
SSH = "/usr/bin/ssh"


@dataclass
class SshServer:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def docker_host(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach the engine over this server: the wrapper first on PATH."""
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"}

    @property
    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")

    def accepted(self) -> int:
        """How many sessions sshd started (each docker call over ssh is at least one; several
        may share one connection, see ControlMaster below)."""
        return self.log.count("Starting session: forced-command")


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True,
                   capture_output=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(root: Path, engine_sock: Path) -> SshServer:
    """sshd on 127.0.0.1 whose one authorized key dials `engine_sock`; waits until it listens."""
    root.mkdir(parents=True, exist_ok=True)
    _keygen(root / "host_key", "b70test-sshd-host")
    _keygen(root / "id_ed25519", "b70test-client")
    pub = (root / "id_ed25519.pub").read_text().strip()
    forced = f"DOCKER_HOST=unix://{engine_sock} exec docker system dial-stdio"
    (root / "authorized_keys").write_text(f'restrict,command="{forced}" {pub}\n')
    port = _free_port()
    (root / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'host_key'}", f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
        "UsePAM no", "StrictModes no", "LogLevel VERBOSE", ""]))
    host_pub = " ".join((root / "host_key.pub").read_text().split()[:2])
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    (root / "ssh_config").write_text("\n".join([
        "Host *", f"  IdentityFile {root / 'id_ed25519'}", "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {root / 'known_hosts'}", "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes", "  BatchMode yes", "  ConnectTimeout 10",
        "  ControlMaster auto", f"  ControlPath {root}/cm-%C", "  ControlPersist 30", ""]))
    (root / "bin").mkdir(exist_ok=True)
    wrapper = root / "bin" / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {SSH} -F {root / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    check = subprocess.run([SSHD, "-t", "-f", str(root / "sshd_config")], capture_output=True, text=True,
                           check=False)
    if check.returncode != 0:
        raise RuntimeError(f"sshd -t: {check.stderr.strip()}")
    log = (root / "sshd.log").open("wb")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    server = SshServer(root, port, proc)
    deadline = time.monotonic() + 15
    while "Server listening" not in server.log:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(server)
            raise RuntimeError(f"sshd did not start: {server.log[-1000:]}")
        time.sleep(0.05)
    return server


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop(server: SshServer) -> None:
    """sshd and the sessions it still serves: each connection's sshd runs in a session of its own
    (setsid), so they are found as the listener's descendants before it goes, then ended."""
    if server.proc.poll() is not None:
        return
    sessions = _descendants(server.proc.pid)
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=10)
    for pid in sessions:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
