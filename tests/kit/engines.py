"""Three real Docker Engines on this machine, one per inventory node (the `engines` and `fleet`
fixtures are in tests/actions/conftest.py).

Each is its own dockerd (and the containerd it starts) with its own socket, data root, exec
root and pid file under one temp folder; vfs storage. What works here (dockerd 20.10):

    ip link add b70mn<id>N type bridge; ip addr add 10.213.<200+N>.1/24 dev ...; ip link set ... up
    dockerd --host unix://<dir>/dN.sock --data-root <dir>/dataN --exec-root <dir>/execN
            --pidfile <dir>/dN.pid --storage-driver vfs --bridge b70mn<id>N --iptables=false
            --ip-masq=false --default-address-pool base=10.213.<16N>.0/20,size=24

Each engine gets a default bridge of its own, made here. Never `--bridge none`: dockerd then
DELETES the host's docker0 at start-up, which breaks the shared engine's default network
(seen here: "could not find bridge docker0"). Never the default docker0/--bip either: that
is the shared engine's. Compose makes its project network (a user-defined bridge) from the
engine's own address pool, apart from the other engines'. --iptables=false: these engines
never touch the host's rules, which the shared engine manages; ports are still published on
127.0.0.1 by docker-proxy (the userland proxy), which is all /health, smoke and the probe
need. Teardown removes every container, stops the daemon (TERM, then KILL), unmounts what is
left under its dirs, deletes them and the bridge.

Engine N's subnets are fixed, so each set of engines has a lock of its own, held from its start
to its teardown, also across test sessions on this machine: engines 1-3 (or 5-7) serve the
rolling tests (FLEET), engine 4 (or 8) the ssh node (SSH_ENGINE), so the two modules can run on
two xdist workers side by side (tests/conftest.py ONE_WORKER), and a second test session on the
machine takes the other set instead of waiting for the first session to end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml
from filelock import FileLock, Timeout
from simkit import run_cli, run_json, unavailable

# Sets of engines to choose from, each (lock name, engine indices); a lock is a file in the temp dir.
FLEET = (("engines", (1, 2, 3)), ("engines-b", (5, 6, 7)))  # the three nodes of the rolling tests
SSH_ENGINE = (("ssh-engine", (4,)), ("ssh-engine-b", (8,)))  # the engine behind sshd


@dataclass
class Engine:
    index: int
    root: Path
    proc: subprocess.Popen[bytes]
    bridge: str

    @property
    def sock(self) -> Path:
        return self.root / f"d{self.index}.sock"

    @property
    def host(self) -> str:
        return f"unix://{self.sock}"

    def docker(self, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["docker", "-H", self.host, *args], capture_output=True, text=True, timeout=timeout,
                                check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"docker -H {self.host} {' '.join(args)}: {result.stderr}")
        return result


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _start(index: int, root: Path, bridge: str) -> Engine:
    _ip("link", "add", bridge, "type", "bridge")
    _ip("addr", "add", f"10.213.{200 + index}.1/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    data, execroot = root / f"data{index}", root / f"exec{index}"
    log = (root / f"d{index}.log").open("wb")
    argv = ["dockerd", "--host", f"unix://{root}/d{index}.sock", "--data-root", str(data), "--exec-root",
            str(execroot), "--pidfile", str(root / f"d{index}.pid"), "--storage-driver", "vfs", "--bridge", bridge,
            "--iptables=false", "--ip-masq=false", "--default-address-pool",
            f"base=10.213.{16 * index}.0/20,size=24"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Engine(index, root, proc, bridge)


def _stop(engine: Engine) -> None:
    if engine.proc.poll() is None:
        ids = engine.docker("ps", "-aq").stdout.split()
        if ids:
            engine.docker("rm", "-f", *ids)
        engine.proc.send_signal(signal.SIGTERM)
        try:
            engine.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(engine.proc.pid, signal.SIGKILL)
            engine.proc.wait(timeout=10)


def _unmount_under(root: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(root))]
    for m in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, check=False)


def _free_set(choices: Sequence[tuple[str, Sequence[int]]]) -> tuple[FileLock, Sequence[int]]:
    """The first set whose lock is free, locked; when all are taken, the first, once it is free
    (waiting, rather than failing on a taken address)."""
    for name, indices in choices:
        lock = FileLock(os.path.join(tempfile.gettempdir(), f"b70test-{name}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        return lock, indices
    name, indices = choices[0]
    lock = FileLock(os.path.join(tempfile.gettempdir(), f"b70test-{name}.lock"))
    lock.acquire(timeout=900)
    return lock, indices


@contextmanager
def started(choices: Sequence[tuple[str, Sequence[int]]], image: str) -> Iterator[list[Engine]]:
    """The engines of the first free set of `choices` (FLEET or SSH_ENGINE), running, with `image`
    loaded from the shared engine; all of it removed on exit."""
    lock, indices = _free_set(choices)  # held until the engines are gone
    had_docker0 = Path("/sys/class/net/docker0").exists()
    # A short path: a unix socket path is limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="b70mn-", dir="/tmp"))
    tag = uuid.uuid4().hex[:6]
    bridges = {i: f"b70mn{tag}{i}" for i in indices}  # at most 15 characters
    engines: list[Engine] = []
    try:
        try:
            for i in indices:
                engines.append(_start(i, root, bridges[i]))
            deadline = time.monotonic() + 60
            for e in engines:
                while e.docker("version", "--format", "{{.Server.Version}}", timeout=10).returncode != 0:
                    if e.proc.poll() is not None or time.monotonic() > deadline:
                        log = (root / f"d{e.index}.log").read_text(errors="replace")[-2000:]
                        unavailable(f"dockerd {e.index} did not start: {log}")
                    time.sleep(0.1)
            # The shared engine's default bridge must survive our engines (see the module docstring).
            assert Path("/sys/class/net/docker0").exists() or not had_docker0, "an extra dockerd removed docker0"
            saved = subprocess.run(["docker", "save", image], capture_output=True, check=True).stdout
            for e in engines:
                subprocess.run(["docker", "-H", e.host, "load"], input=saved, capture_output=True, check=True)
            yield engines
        finally:
            for e in engines:
                _stop(e)
            _unmount_under(root)
            shutil.rmtree(root, ignore_errors=True)
            for bridge in bridges.values():
                subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
    finally:
        lock.release()


def write_stacks(folder: Path, image: str, *, gamma_crashes: bool = False) -> None:
    folder.mkdir(parents=True)
    base: dict[str, Any] = {
        "image": image, "entrypoint_style": "bash-c", "model_family": "qwen3-30b-a3b",
        "model": {"path": "Qwen/Qwen3-30B-A3B-W4A16", "quantization": "compressed-tensors"},
        "served_model_names": ["qwen3-30b-a3b-w4a16"], "dtype": "float16", "max_model_len": 131072,
        "kv_cache_dtype": "fp8", "tool_calling": {"parser": "hermes", "auto_tool_choice": True},
        "patches": ["marlin-xpu-carveout"],
        "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris", "max_tokens": 4},
                  "tool_call": False, "aliases": True}}
    gamma: dict[str, Any] = {"extends": "alpha", "max_model_len": 65536}
    if gamma_crashes:
        gamma["env"] = {"B70SIM_FAIL": "marlin"}
    docs = {"alpha": base, "beta": {"extends": "alpha", "max_model_len": 262144}, "gamma": gamma}
    for name, doc in docs.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))


@dataclass
class Fleet:
    root: Path
    config: Path
    engines: list[Engine]
    names: list[str]
    ports: dict[str, int]
    project: str
    env: dict[str, str] = field(default_factory=dict)

    def cli(self, *args: str, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess[str]:
        return run_cli(self.config, *args, env=self.env, timeout=timeout, check=check)

    def json(self, *args: str) -> Any:
        return run_json(self.config, *args, env=self.env)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"


@dataclass
class Probe:
    """Polls every node's /health every 0.2 s, as a router's health check would."""

    urls: dict[str, str]
    interval: float = 0.2
    samples: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _healthy(self, url: str) -> bool:
        try:
            return requests.get(f"{url}/health", timeout=0.5).status_code == 200
        except requests.RequestException:
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), sum(self._healthy(u) for u in self.urls.values())))
            self._stop.wait(self.interval)

    def __enter__(self) -> Probe:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(5)

    @property
    def minimum(self) -> int:
        return min(n for _, n in self.samples)
