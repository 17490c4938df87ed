"""What a look reads: the error rate from /metrics (counter deltas between looks, on a real vLLM
0.21's /metrics text served over loopback), and the log read again when the probes saw trouble."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.serving import serving

from b70deploy.bench.metrics import finished_requests
from b70deploy.config.node import load_node
from b70deploy.docker.containers import ContainerState
from b70deploy.watch import observe
from b70deploy.watch.observe import Deaths, Observer

REAL = (Path(__file__).parents[1] / "fixtures" / "vllm-0.21.0-cpu" / "metrics.txt").read_text()


def with_counts(length: int, error: int) -> str:
    label = 'vllm:request_success_total{engine="0",finished_reason="%s",model_name="tiny-a"} '
    return REAL.replace(label % "length" + "4.0", label % "length" + f"{length}.0") \
               .replace(label % "error" + "0.0", label % "error" + f"{error}.0")


@pytest.fixture
def metrics() -> Iterator[tuple[int, list[str]]]:
    served = [REAL]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = served[-1].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as port:
        yield port, served


def test_the_real_counter_parses_by_finished_reason() -> None:
    assert finished_requests(REAL) == {"stop": 0.0, "length": 4.0, "abort": 0.0, "error": 0.0, "repetition": 0.0}


def test_error_rate_between_looks(tmp_path: Path, metrics: tuple[int, list[str]]) -> None:
    port, served = metrics
    (tmp_path / "node.yaml").write_text(yaml.safe_dump({
        "state_dir": str(tmp_path / "s"), "ports": {"prod": port, "dark": port + 1},
        "watch": {"max_error_rate": 0.5, "min_requests": 10}}))
    node = load_node(str(tmp_path / "node.yaml"))
    observer = Observer(node, Deaths(node))
    assert observer._error_rate() is None  # the first reading only sets the baseline
    served.append(with_counts(length=10, error=5))  # 6 more, too few to judge
    assert observer._error_rate() is None
    served.append(with_counts(length=12, error=15))  # 12 more, 10 of them errors
    assert observer._error_rate() == "10 of 12 requests since the last look ended in an error"
    served.append(with_counts(length=30, error=16))  # 19 more, 1 error
    assert observer._error_rate() is None


def test_a_failure_the_probes_see_after_the_log_was_read_is_diagnosed_from_a_second_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine died between the look's read of the log and its smoke test (loaded run 10:
    the alert came without its cause). The smoke's 500 came after vLLM logged the cause, so the
    look reads the log again; the log is a real vLLM 0.21.0 CPU build's death."""
    died = (Path(__file__).parents[1] / "fixtures" / "vllm-0.21.0-cpu" / "die-after-ready.log").read_text()
    boot = (Path(__file__).parents[1] / "fixtures" / "vllm-0.21.0-cpu" / "boot.log").read_text()
    reads = iter([boot, died])
    monkeypatch.setattr(observe.engine, "container_log", lambda container, tail: next(reads))
    monkeypatch.setattr(observe, "probe_health", lambda url: 200)
    monkeypatch.setattr(observe, "run_smoke", lambda url, stack, timeout, key: ([], ["capital: HTTP 500"]))
    (tmp_path / "node.yaml").write_text(yaml.safe_dump({"state_dir": str(tmp_path / "s")}))
    node = load_node(str(tmp_path / "node.yaml"))
    observer = Observer(node, Deaths(node), stack_of=lambda node, rev: None)  # type: ignore[arg-type,return-value]
    observer._error_rate = lambda: None  # type: ignore[method-assign]
    running = ContainerState(status="running", exit_code=None, restart_count=0, started_at="", image_id=None)
    problems = observer._problems(None, object(), running, 0.0, 1e6)  # type: ignore[arg-type]
    assert [p.kind for p in problems] == ["smoke"]
    assert problems[0].diagnosis is not None and "[cpu-attention-unsupported]" in problems[0].diagnosis
    assert next(reads, "both read") == "both read"
