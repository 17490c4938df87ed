"""The simulated vLLM in a thread on loopback: a real HTTP server without an engine, for tests
of what the sim serves and of the tool's HTTP checks against it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from b70deploy.sim import server as sim

Serve = Callable[..., str]


@contextmanager
def loopback_sims(decode_tps: str) -> Iterator[Serve]:
    """serve(*flags, model=..., **env) -> the URL of a sim on 127.0.0.1 serving `m` with hermes
    tool calls (boot 0); every one started is stopped on exit."""
    running: list[tuple[sim.Server, threading.Thread]] = []

    def start(*flags: str, model: str = "/models/Qwen/Qwen3-30B-A3B", **env: str) -> str:
        info: dict[str, sim.Server] = {}
        ready = threading.Event()

        def on_ready(httpd: sim.Server) -> None:
            info["httpd"] = httpd
            ready.set()

        knobs = {"B70SIM_BOOT_SECONDS": "0", "B70SIM_DECODE_TPS": decode_tps, "B70SIM_PREFILL_TPS": "1e6", **env}
        argv = [model, "--served-model-name", "m", "--max-model-len", "8192", "--enable-auto-tool-choice",
                "--tool-call-parser", "hermes", "--host", "127.0.0.1", "--port", "0", *flags]
        thread = threading.Thread(target=sim.serve, args=(argv, knobs, on_ready), daemon=True)
        thread.start()
        assert ready.wait(10)
        running.append((info["httpd"], thread))
        return f"http://127.0.0.1:{info['httpd'].server_address[1]}"

    try:
        yield start
    finally:
        for httpd, thread in running:
            httpd.shutdown()
            thread.join(5)
