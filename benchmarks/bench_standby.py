"""The clients' way back with hot standby (issue 24), beside stop-first, in one run.

Two sim nodes on the real Docker engine, both behind the front door and both on the same image (the
sim reporting vLLM 0.32.0 on XPU, where vLLM has sleep mode: vllm/platforms/interface.py:231-236 in
0.32.0): one with `standby: sleep`, one with `standby: off` (stop-first). On each, after switching to
alpha and then beta (alpha then sleeps on the standby node), `--runs` times:

  failed switch   to `crash` (the report's Marlin crash at boot): back on the stack it left
  rollback        `b70deploy rollback` to the revision before (asleep on the standby node)

Measured, with a few clients (the `openai` client, one streaming chat completion after another,
through the door):
  back after failure   from the journaled failure (`step-failed`) to the first full answer that ended
                       after it: how long the clients wait once the tool knows the new stack failed
  clients outage       the longest span without a full answer, from the command's start to 1 s after
                       its end (bench_door.py's measure)
  command seconds      the CLI's own time, start to exit
each as the median of the runs with min and max. The sim's boot is --boot seconds (the cold path
pays it; a wake pays the sim's B70SIM_WAKE_SECONDS, default 0.5, its model of vLLM's wake).

    python benchmarks/bench_standby.py --json benchmarks/results/standby.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench_door import Clients, Node, door_flags, make_node, outcome
from switch_bench import SIM_TAGS, docker, event_ts, journal_run, log, machine, report, stats

SITE = "/opt/venv/lib/python3.12/site-packages"  # the bash-c variant's (b70deploy/sim/vllm_tree.py)
MARLIN = "vllm/model_executor/layers/quantization/utils/marlin_utils.py"


def image_032(tag: str, folder: Path) -> None:
    """The sim image with vLLM 0.32.0 in its `vllm` package and that release's XPU carve-out of Marlin
    (upstream since 0.23: patches/marlin-xpu-carveout.yaml), so the stacks render without the patch."""
    from b70deploy.sim.vllm_tree import VARIANTS, vllm_files

    (folder / MARLIN).parent.mkdir(parents=True)
    (folder / "vllm" / "__init__.py").write_text('"""b70sim stand-in."""\n\n__version__ = "0.32.0"\n')
    rocm = "    if current_platform.is_rocm():\n        return False"
    (folder / MARLIN).write_text(vllm_files(VARIANTS[0])[MARLIN].replace(
        rocm, "    if current_platform.is_rocm() or current_platform.is_xpu():\n        return False", 1))
    (folder / "Dockerfile").write_text(f"FROM {SIM_TAGS['bash-c']}\nCOPY vllm/__init__.py {SITE}/vllm/__init__.py\n"
                                       f"COPY {MARLIN} {SITE}/{MARLIN}\n")
    built = subprocess.run(["docker", "build", "-q", "-t", tag, str(folder)], capture_output=True, text=True,
                           timeout=300, check=False)
    if built.returncode != 0:
        raise RuntimeError(f"docker build: {built.stderr}")


def standby_node(*, sleep: bool, boot: float, hold: float) -> Node:
    root = Path(tempfile.mkdtemp(prefix="b70standby-bench-"))
    node = make_node(root, door=True, boot=boot, hold=hold)
    b = node.bench
    tag = f"{b.project}/vllm:v032"
    image_032(tag, root / "image")
    b.tags["v032"] = tag
    cfg = yaml.safe_load(b.config.read_text())
    cfg["image_map"]["intel/vllm:latest"] = tag
    cfg["standby"] = "sleep" if sleep else "off"
    cfg["companions"] = []
    b.config.write_text(yaml.safe_dump(cfg))
    b.projects += [f"{b.project}-r{n}" for n in range(1, 64)]  # the slots' compose projects, for cleanup
    return node


def first_answer_after(answers: list[tuple[float, float, bool, str]], t: float) -> float | None:
    ends = sorted(e for _, e, ok, _ in answers if ok and e > t)
    return ends[0] if ends else None


def measure(node: Node, argv: list[str], *, must_fail: bool, clients: int) -> dict[str, Any]:
    with Clients(node.bench.prod_port, n=clients) as c:
        time.sleep(1.0)  # the clients are answered before the operation starts
        start = time.time()
        r = node.cli(*argv)
        end = time.time()
        deadline = time.monotonic() + 30
        while first_answer_after(c.answers, end) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(max(0.0, end + 1.0 - time.time()))
    if not any(ok for _, _, ok, _ in c.answers):  # no answers would read as no outage
        raise RuntimeError(f"the clients had no answer at all: {c.answers[:3]}")
    if (r.returncode != 0) != must_fail:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    events = journal_run(node.bench.state)
    known = event_ts(events, "step-failed") if must_fail else start
    back = first_answer_after(c.answers, known)
    failed = [why for s, e, ok, why in c.answers if not ok and e >= start]
    return {"command_s": round(end - start, 3), "back_s": round(back - known, 3) if back is not None else None,
            "outage_s": outcome(c.answers, start, end + 1.0)["outage_s"],
            "client_failures": len(failed), "failure_kinds": sorted(set(failed))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    nodes: dict[str, Node] = {}
    try:
        for name, sleep in (("standby", True), ("stop-first", False)):
            nodes[name] = standby_node(sleep=sleep, boot=args.boot, hold=args.hold)
        results: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for name, node in nodes.items():
            for stack in ("alpha", "beta"):  # warm-up, not counted: on the standby node alpha then sleeps
                r = node.cli("switch", stack, "--yes")
                if r.returncode != 0:
                    raise RuntimeError(f"warm-up switch to {stack} failed:\n{r.stdout}\n{r.stderr}")
            got: dict[str, list[dict[str, Any]]] = {"failed switch": [], "rollback": []}
            for i in range(args.runs):
                got["failed switch"].append(measure(node, ["switch", "crash", "--yes"], must_fail=True,
                                                    clients=args.clients))
                got["rollback"].append(measure(node, ["rollback", "--yes"], must_fail=False, clients=args.clients))
                log(f"{name} run {i + 1}: {got['failed switch'][-1]} / {got['rollback'][-1]}")
            results[name] = got
        summary = {name: {op: {"back_s": stats([m["back_s"] for m in ms]),
                               "outage_s": stats([m["outage_s"] for m in ms]),
                               "command_s": stats([m["command_s"] for m in ms]),
                               "client_failures": sum(m["client_failures"] for m in ms)}
                          for op, ms in got.items()} for name, got in results.items()}
        return {"machine": machine(), "boot_seconds": args.boot, "runs": args.runs, "clients": args.clients,
                "summary": summary, "measurements": results}
    finally:
        for node in nodes.values():
            remove_node(node)


def remove_node(node: Node) -> None:
    """A bench node's containers and files, the networks of its standby slots' projects, and the door's
    network, which the cleanup could not remove while the slots (removed after it) were joined to it."""
    node.bench.cleanup()
    for n in range(1, 64):
        for net in docker("network", "ls", "-q", "--filter", f"name={node.bench.project}-r{n}_",
                          check=False).stdout.split():
            docker("network", "rm", net, check=False)
    docker("network", "rm", f"{node.bench.project}_default", check=False)


def table(result: dict[str, Any]) -> str:
    def fmt(st: dict[str, Any]) -> str:
        if not st.get("n"):
            return "-"
        return f"{st['median']:.2f} (min {st['min']:.2f}, max {st['max']:.2f})"

    lines = [f"sim boot {result['boot_seconds']:g} s; {result['clients']} clients through the door; "
             f"medians of {result['runs']} with min and max, seconds",
             f"{'operation':<14} {'node':<11} {'back after failure':<30} {'clients outage':<30} "
             f"{'command':<30} client failures"]
    for name, ops in result["summary"].items():
        for op, st in ops.items():
            back = fmt(st["back_s"]) if op == "failed switch" else "-"
            lines.append(f"{op:<14} {name:<11} {back:<30} {fmt(st['outage_s']):<30} {fmt(st['command_s']):<30} "
                         f"{st['client_failures']}")
    lines.append("back after failure: from the journaled failure to the first full answer after it; clients outage: "
                 "the longest span without a full answer, from the command's start to 1 s after its end")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    door_flags(p, boot=10.0)
    p.add_argument("--runs", type=int, default=5, help="runs of each operation per node (default 5)")
    p.add_argument("--json", type=Path, help="write every measurement and the summary here")
    return report(run, table, p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
