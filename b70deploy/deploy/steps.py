"""The switch as a visible list of steps, each with its compensation.

    preflight -> record -> snapshot -> drain -> verify -> activate -> wait-healthy
      -> check -> commit -> restore

`switch` and `rollback` share it; they differ only in where the files come from (a fresh
render, or the exact bytes of an earlier revision). Old and new cannot run side by side on
one GPU, so the old stack is stopped first, and a failed new stack costs a second cold load
to bring the old one back: the two waits have their own timeouts.
"""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config.node import Node
from ..config.schema import Stack
from ..docker import engine, proc
from ..docker.compose import Compose
from ..errors import OperationError, UserError
from ..render.files import COMPOSE_FILE
from ..state.fsio import fsync_dir, write_atomic
from ..state.revisions import Revision, RevisionStore, file_mode
from ..ui.progress import Reporter
from . import health
from .health import WaitResult
from .runner import Runner, Step

VLLM = "vllm"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def operator() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


@dataclass
class Deployment:
    """Everything one switch or rollback run knows; the steps read and fill it."""

    node: Node
    reporter: Reporter
    kind: Literal["switch", "rollback"]
    stack: Stack
    files: dict[str, bytes]
    image: engine.ImageInfo
    message: str
    auto_rollback: bool = True
    timeout: float = 720.0
    rollback_timeout: float = 720.0
    verify_wait: float = 30.0
    restored_from: int | None = None
    preflight: Callable[[Deployment], list[str]] | None = None  # extra checks (lint); returns warnings
    diagnose: health.Diagnose | None = None
    check_boot: Callable[[Deployment, list[str]], tuple[dict[str, Any], list[str]]] | None = None
    runner: Runner[Deployment] | None = None
    revision: Revision | None = None
    previous: Revision | None = None
    activated: bool = False
    wait: WaitResult | None = None
    rollback_wait: WaitResult | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    checks_passed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)  # lint findings (b70deploy.lint.Finding)
    secret_keys: frozenset[str] = frozenset()            # runtime env keys never to print

    @property
    def store(self) -> RevisionStore:
        return RevisionStore(self.node.state_dir)

    @property
    def compose(self) -> Compose:
        return Compose(self.node.deploy_dir, self.node.project)

    @property
    def health_url(self) -> str:
        return f"http://{self.node.address}:{self.node.config.ports.prod}/health"

    @property
    def base_url(self) -> str:
        return f"http://{self.node.address}:{self.node.config.ports.prod}"

    @property
    def companions(self) -> list[str]:
        return [c.name for c in self.node.config.companions]


# ---------------------------------------------------------------- deploy-dir files


def deployed_names(deploy_dir: Path) -> list[str]:
    """Files of ours in the deploy dir: compose, env files and patched files."""
    names = [n for n in (COMPOSE_FILE, ".env", "vllm.env") if (deploy_dir / n).is_file()]
    patches = deploy_dir / "patches"
    if patches.is_dir():
        names += sorted(p.relative_to(deploy_dir).as_posix() for p in patches.rglob("*") if p.is_file())
    return names


def write_deploy_files(deploy_dir: Path, files: dict[str, bytes]) -> None:
    """Make the deploy dir hold exactly `files`: each written atomically, strays removed."""
    deploy_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(deploy_dir / name, data, mode=file_mode(name))
    for name in deployed_names(deploy_dir):
        if name not in files:
            (deploy_dir / name).unlink()
    fsync_dir(deploy_dir)


def compose_check(files: dict[str, bytes], project: str) -> None:
    """`docker compose config` on the files: unresolved or empty interpolation (the post's
    env_file pitfall) fails here, before anything stops."""
    from ..lint.gather import compose_config

    doc, error = compose_config(files, project)
    if doc is None:
        raise UserError(f"docker compose config rejects the files: {error}",
                        fix="see `b70deploy render`; every ${VAR} must be set in .env")
    command = doc["services"][VLLM].get("command") or []
    model_at = 2 if command[:2] == ["vllm", "serve"] else 0
    if len(command) <= model_at or not str(command[model_at]).strip() or str(command[model_at]).startswith("-"):
        raise UserError("the model argument is empty after interpolation",
                        fix="set VLLM_MODEL in the .env beside the compose file (env_file: does not feed ${VAR})")


# ---------------------------------------------------------------- steps


def _preflight(d: Deployment) -> None:
    if d.preflight is not None:
        d.warnings += d.preflight(d)  # a switch: lint (which runs compose config itself)
    else:
        compose_check(d.files, d.node.project)  # a rollback: the old bytes must still resolve
    for w in d.warnings:
        d.reporter.info(f"warning: {w}")


def _record(d: Deployment) -> None:
    d.previous = d.store.current()
    d.revision = d.store.create(
        stack=d.stack.name, kind=d.kind, files=d.files, image_ref=d.image.ref, image_id=d.image.id,
        repo_digest=d.image.repo_digest, operator=operator(), message=d.message, created=now_iso(),
        restored_from=d.restored_from, stack_doc=d.stack.model_dump(mode="json"))
    assert d.runner is not None
    d.runner.note(revision=d.revision.number, previous=d.previous.number if d.previous else None)
    d.reporter.info(f"revision {d.revision.number} ({d.stack.name}); previous: "
                    + (f"{d.previous.number} ({d.previous.meta.stack})" if d.previous else "none"))


def _unrecord(d: Deployment) -> None:
    if d.revision is not None and d.store.get(d.revision.number).status.outcome == "pending":
        d.store.update_status(d.revision.number, outcome="failed" if d.activated else "aborted", updated=now_iso())


def _snapshot(d: Deployment) -> None:
    """Keep what the deploy dir holds now, if no revision has those bytes (a hand-made or
    hand-edited deployment), so `rollback` can bring it back."""
    present = deployed_names(d.node.deploy_dir)
    if not present:
        d.reporter.info("deploy dir is empty: first deployment on this node")
        return
    live = {n: (d.node.deploy_dir / n).read_bytes() for n in present}
    if d.previous is not None and d.previous.read_files() == live:
        d.reporter.info(f"deploy dir matches revision {d.previous.number}")
        return
    image_ref = _dotenv_value(live.get(".env", b""), "VLLM_IMAGE") or "unknown"
    image_id = None
    if image_ref != "unknown" and engine.image_present(image_ref):
        image_id = engine.image_info(image_ref).id
    adopted = d.store.create(stack=_label_stack(live) or "adopted", kind="adopt", files=live, image_ref=image_ref,
                             image_id=image_id, repo_digest=None, operator=operator(),
                             message="snapshot of the live deploy dir before a switch", created=now_iso())
    healthy = health.probe_health(d.health_url) == 200
    d.store.update_status(adopted.number, outcome="deployed" if healthy else "superseded", updated=now_iso())
    d.previous = d.store.get(adopted.number)
    assert d.runner is not None
    d.runner.note(previous=adopted.number, adopted=adopted.number)
    d.reporter.info(f"live files differed from every revision: kept them as revision {adopted.number}")


def _dotenv_value(data: bytes, key: str) -> str | None:
    import io

    from dotenv import dotenv_values

    return dotenv_values(stream=io.StringIO(data.decode(errors="replace"))).get(key)


def _label_stack(files: dict[str, bytes]) -> str | None:
    import re

    m = re.search(rb'b70deploy\.stack: "([a-z0-9][a-z0-9._-]*)"', files.get(COMPOSE_FILE, b""))
    return m.group(1).decode() if m else None


def _drain(d: Deployment) -> None:
    if not (d.node.deploy_dir / COMPOSE_FILE).is_file():
        d.reporter.info("nothing deployed yet: nothing to drain")
        return
    services = [VLLM, *d.companions]
    proc.run(d.compose.stop(services), timeout=120)
    d.reporter.info(f"stopped {', '.join(services)} (compose stop: the router's health check moves traffic away)")


def _restore_previous(d: Deployment) -> None:
    """Compensation of drain: the previous revision serving again, companions started."""
    if d.previous is None:
        d.reporter.info("no previous revision: the node is left without a running stack")
        return
    restore_services(d.node, d.reporter, timeout=d.rollback_timeout, diagnose=d.diagnose)


def _verify(d: Deployment) -> None:
    from .verify import readings, remote_readings

    cfg = d.node.config
    deadline = time.monotonic() + d.verify_wait
    while True:
        if d.node.on_this_host:
            got = readings(port=cfg.ports.prod, feeders=cfg.feeders, load_threshold=cfg.load_threshold)
        else:
            got = remote_readings(d.node.address, cfg.ports.prod)
        bad = [r for r in got if not r.ok]
        if not bad:
            for r in got:
                d.reporter.info(f"{r.name}: {r.detail}")
            return
        if time.monotonic() >= deadline:
            text = "; ".join(f"{r.name}: {r.detail}" for r in bad)
            if d.kind == "rollback":
                d.reporter.info(f"warning: node not idle ({text}); rolling back anyway")
                return
            raise OperationError(f"node not idle after {d.verify_wait:.0f} s: {text}")
        time.sleep(1.0)


def _activate(d: Deployment) -> None:
    d.activated = True
    write_deploy_files(d.node.deploy_dir, d.files)
    proc.run(d.compose.up([VLLM]), timeout=300)
    d.reporter.info(f"started {VLLM} from revision {d.revision.number if d.revision else '?'}")


def _reactivate_previous(d: Deployment) -> None:
    """Compensation of activate: keep the failed boot's log, then bring back the previous revision."""
    if d.wait is None or d.wait.healthy:
        _save_log(d)  # it failed after booting (checks): the whole log, read from the engine
    if d.previous is None:
        proc.run(d.compose.stop([VLLM]), timeout=120, check=False)
        d.reporter.info("no previous revision to return to: vllm stopped")
        return
    d.reporter.info(f"rolling back to revision {d.previous.number} ({d.previous.meta.stack})")
    if d.previous.meta.image_id and not engine.image_present(d.previous.meta.image_id):
        raise OperationError(f"the image that ran revision {d.previous.number} ({d.previous.meta.image_id}) is gone")
    write_deploy_files(d.node.deploy_dir, d.previous.read_files())
    proc.run(d.compose.up([VLLM]), timeout=300)
    d.rollback_wait = health.wait_healthy(
        project=d.node.project, service=VLLM, health_url=d.health_url, timeout=d.rollback_timeout,
        max_interval=d.node.config.timeouts.poll_interval, reporter=d.reporter, diagnose=d.diagnose)
    if not d.rollback_wait.healthy:
        raise OperationError(f"revision {d.previous.number} did not come back: {d.rollback_wait.reason}")
    d.reporter.info(f"revision {d.previous.number} healthy again in {d.rollback_wait.elapsed:.1f} s")


def _save_log(d: Deployment, lines: list[str] | None = None) -> None:
    """Keep the boot's log with the revision: the lines the follower read, or the engine's copy."""
    if d.revision is None:
        return
    if lines is not None:
        text = "\n".join(lines) + "\n" if lines else ""
    else:
        container = engine.find_container(d.node.project, VLLM)
        text = engine.container_log(container) if container is not None else ""
    if text:
        d.store.save_log(d.revision.number, text)


def _wait_healthy(d: Deployment) -> None:
    d.wait = health.wait_healthy(
        project=d.node.project, service=VLLM, health_url=d.health_url, timeout=d.timeout,
        max_interval=d.node.config.timeouts.poll_interval, reporter=d.reporter, diagnose=d.diagnose,
        stall_after=d.node.config.timeouts.stall)
    _save_log(d, d.wait.log_lines)  # already in memory: reporting a crash waits on no API call
    if not d.wait.healthy:
        raise OperationError(d.wait.reason)
    d.facts["time_to_healthy"] = round(d.wait.elapsed, 2)
    d.reporter.info(f"/health 200 after {d.wait.elapsed:.1f} s")


def _check(d: Deployment) -> None:
    from .smoke import run_smoke, served_version

    problems: list[str] = []
    if d.wait is not None:
        lines = d.wait.log_lines
    else:  # a resumed run: the boot it waited for happened in the killed process
        container = engine.find_container(d.node.project, VLLM)
        lines = engine.container_log(container).splitlines() if container is not None else []
    if d.check_boot is not None:
        facts, failed = d.check_boot(d, lines)
        d.facts.update(facts)
        problems += failed
    version = served_version(d.base_url)
    if version:
        d.facts["vllm_version"] = version
    passed, failed = run_smoke(d.base_url, d.stack, timeout=d.node.config.timeouts.smoke)
    d.checks_passed += passed
    for p in passed:
        d.reporter.info(f"ok: {p}")
    problems += failed
    if problems:
        raise OperationError("; ".join(problems))


def _commit(d: Deployment) -> None:
    assert d.revision is not None and d.runner is not None
    timings = dict(d.runner.timings)
    d.store.update_status(d.revision.number, outcome="deployed", facts=d.facts, timings=timings,
                          vllm_version=d.facts.get("vllm_version"), updated=now_iso())
    if d.previous is not None and d.previous.status.outcome == "deployed":
        d.store.update_status(d.previous.number, outcome="superseded", updated=now_iso())
    d.store.set_current(d.revision.number)


def _restore(d: Deployment) -> None:
    if d.companions:
        proc.run(d.compose.up(d.companions, recreate=True), timeout=300)
        d.reporter.info(f"started {', '.join(d.companions)}")


def steps(d: Deployment) -> list[Step[Deployment]]:
    prev = "the previous revision"
    return [
        Step("preflight", "compose config, image present, lint", _preflight),
        Step("record", "store the new files as an immutable revision", _record, _unrecord,
             "mark the revision failed/aborted"),
        Step("snapshot", "keep the live deploy dir if no revision holds it", _snapshot),
        Step("drain", f"compose stop {', '.join([VLLM, *d.companions])}", _drain, _restore_previous,
             f"start {prev} again and wait for /health, then companions"),
        Step("verify", "no live connections on the prod port, feeders quiet, load low", _verify),
        Step("activate", "write files atomically, compose up --force-recreate vllm", _activate,
             _reactivate_previous, f"save the log, write {prev}'s files back, recreate, wait for /health"),
        Step("wait-healthy", "poll /health while watching the container and its log", _wait_healthy),
        Step("check", "boot facts vs expectations, smoke tests", _check),
        Step("commit", "mark the revision deployed and make it current", _commit),
        Step("restore", "start companions", _restore),
    ]


def restore_services(node: Node, reporter: Reporter, *, timeout: float,
                     diagnose: health.Diagnose | None = None) -> WaitResult:
    """Start the deployed revision (not a rollback): vllm up, /health, then companions."""
    if not (node.deploy_dir / COMPOSE_FILE).is_file():
        raise OperationError(f"nothing deployed in {node.deploy_dir}; fix: `b70deploy switch STACK` first")
    compose = Compose(node.deploy_dir, node.project)
    proc.run(compose.up([VLLM], recreate=False), timeout=300)
    result = health.wait_healthy(project=node.project, service=VLLM,
                                 health_url=f"http://{node.address}:{node.config.ports.prod}/health",
                                 timeout=timeout,
                                 max_interval=node.config.timeouts.poll_interval, reporter=reporter,
                                 diagnose=diagnose)
    if not result.healthy:
        raise OperationError(f"vllm did not become healthy: {result.reason}")
    names = [c.name for c in node.config.companions]
    if names:
        proc.run(compose.up(names, recreate=False), timeout=300)
    reporter.info(f"vllm healthy after {result.elapsed:.1f} s" + (f"; started {', '.join(names)}" if names else ""))
    return result
