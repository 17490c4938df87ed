"""How the read-only CLI scales: 10,000 revisions and a catalogue of 1,000 stacks (issue 13, item 4).

Builds one throwaway node (a temp folder) and times whole `b70deploy` processes on it:
`status`, `history` (every row), `history -n 20`, `stacks`, `lint --all --no-docker`,
`render STACK --no-docker` and `--help`, each with hyperfine (warm-up runs, then `--runs`
counted runs; median, min and max), for two checkouts side by side: BEFORE (a checkout given
by `--before`, e.g. a worktree of main at a7331d0) and AFTER (this checkout), each run with
PYTHONPATH and the working directory at its checkout (compiled to bytecode first) and stdout
a pipe (plain rows), on its own copy of the state dir (an older checkout may rewrite the
index in its own format).

How the node is built:
  - revisions: the first `--api-revisions` (200) through the real API (`RevisionStore.create`
    with the files and merged stack of one rendered stack, then `update_status` as a switch
    does), the rest up to `--revisions` (10,000) copies of those folders with meta.json's
    number and parent set to their own; the store's own index repair then adds the copies
    (creating all of them through the API takes the better part of an hour on this machine:
    each create fsyncs a dozen times and rewrites the whole index);
  - stacks: the 7 shipped stacks copied under 143 suffixes (`w4a16-g007` extends
    `w4a16-131k-g007`, ...), the first 1,000 of them, so `extends:` chains are as deep as the
    shipped ones;
  - a node config on a compose project with no containers and a prod port nothing listens
    on: `status` asks the engine and probes /health as it would on a node (both answer
    "nothing there" at once).

    python benchmarks/scale_bench.py --before /work/wt-scale-base --json benchmarks/results/scale.json

Nothing outside the temp folder is written (but the `--json`/`--text` outputs); it is removed
in a `finally`, also on Ctrl-C. `--keep DIR` builds into DIR and keeps it (a second call reuses
it), for profiling by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "stacks"
RENDERED = "w4a16"  # the stack whose rendered files every revision holds, and that `render` times
GROUPS = 143        # 7 shipped stacks x 143 suffixes >= 1,000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_stacks(dest: Path, count: int) -> list[str]:
    """`count` stacks: the shipped ones under suffixes, parents always before their children."""
    shipped = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(SHIPPED.glob("*.yaml"))}
    order = sorted(shipped, key=lambda n: _depth(shipped, n))  # parents first: a cut keeps chains whole
    dest.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    for group in range(GROUPS):
        for stem in order:
            if len(names) == count:
                return names
            doc = dict(shipped[stem])
            if doc.get("extends"):
                doc["extends"] = f"{doc['extends']}-g{group:03d}"
            name = f"{stem}-g{group:03d}"
            (dest / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
            names.append(name)
    return names


def _depth(docs: dict[str, dict[str, Any]], name: str) -> int:
    parent = docs[name].get("extends")
    return 0 if not parent else 1 + _depth(docs, parent)


def write_config(root: Path, stacks: Path) -> Path:
    cfg = {"deploy_dir": str(root / "deploy"), "state_dir": str(root / "state"), "stacks_dir": str(stacks),
           "models_dir": str(root / "models"), "device_dir": None, "project": f"b70scale{os.getpid()}",
           "ports": {"prod": free_port(), "dark": free_port()}}
    path = root / "node.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def build_revisions(state: Path, deploy: Path, files: dict[str, bytes], stack_doc: dict[str, Any],
                    count: int, real: int) -> dict[str, float]:
    """`real` revisions through the revision API (create, then update_status as a switch does),
    then copies of those folders up to `count`, with meta.json's number and parent set to the
    copy's own, and the index rebuilt by the store itself. Creating all 10,000 through the API
    would take the better part of an hour here: each create fsyncs a dozen times and rewrites
    the whole index. Returns the seconds each phase took."""
    sys.path.insert(0, str(REPO))
    from b70deploy.state.fsio import write_tree
    from b70deploy.state.revisions import RevisionStore

    store = RevisionStore(state)
    t0 = time.perf_counter()
    for n in range(1, real + 1):
        rev = store.create(stack=f"{RENDERED}-g000", kind="switch", files=files, image_ref="intel/vllm:0.14.1-xpu",
                           image_id="sha256:" + f"{n:064x}", repo_digest=None, operator="bench",
                           message=f"switch {n}", created=f"2026-11-30T07:{n // 60 % 60:02d}:{n % 60:02d}Z",
                           stack_doc=stack_doc)
        store.update_status(rev.number, outcome="superseded",
                            facts={"kv_cache_tokens": 270592 + n, "time_to_healthy": 231.0})
    t1 = time.perf_counter()
    for n in range(real + 1, count + 1):
        src = store.root / f"{(n - 1) % real + 1:06d}"
        dest = store.root / f"{n:06d}"
        shutil.copytree(src, dest)
        meta = json.loads((dest / "meta.json").read_text())
        meta.update(number=n, parent=n - 1, message=f"switch {n}")
        (dest / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    t2 = time.perf_counter()
    store.update_status(count, outcome="deployed")  # finds the index stale: adds the copies
    store.set_current(count)
    write_tree(deploy, files)
    t3 = time.perf_counter()
    return {"api_seconds": round(t1 - t0, 1), "api_revisions": real, "copy_seconds": round(t2 - t1, 1),
            "index_repair_seconds": round(t3 - t2, 1)}


def shown_stack(config: Path) -> dict[str, Any]:
    """The merged stack a switch records with its revision (`show --json` prints the same)."""
    out = subprocess.run([sys.executable, "-m", "b70deploy.cli", "--config", str(config), "show",
                          f"{RENDERED}-g000", "--json"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return dict(json.loads(out.stdout))


def rendered_files(config: Path) -> dict[str, bytes]:
    out = subprocess.run([sys.executable, "-m", "b70deploy.cli", "--config", str(config), "render",
                          f"{RENDERED}-g000", "--no-docker", "--json"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    # --json masks secrets; the render has none (no secrets file), so these are the real bytes.
    return {n: text.encode() for n, text in json.loads(out.stdout)["files"].items()}


def build(root: Path, revisions: int, stacks: int, real: int) -> dict[str, Any]:
    marker = root / "built.json"
    if marker.is_file():
        return dict(json.loads(marker.read_text()))
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    names = build_stacks(root / "stacks", stacks)
    config = write_config(root, root / "stacks")
    stacks_seconds = time.perf_counter() - t
    print(f"  {len(names)} stacks written", file=sys.stderr)
    built = build_revisions(root / "state", root / "deploy", rendered_files(config), shown_stack(config),
                            revisions, real)
    info = {"config": str(config), "stacks": len(names), "render": f"{RENDERED}-g000", "revisions": revisions,
            "build": {**built, "stacks_seconds": round(stacks_seconds, 2)}}
    marker.write_text(json.dumps(info))
    return info


# ---------------------------------------------------------------- timing


SMALL = 200  # revisions in the state dir that `lint` is timed on by both sides (see commands)


def commands(info: dict[str, Any], before_all_rows: list[str]) -> list[tuple[str, list[str] | None, list[str], str]]:
    """(label, argv before (None: not timed), argv after, state dir), each argv after
    `b70deploy --config CONFIG` (`--help` takes none). `history` prints the newest 20 rows and
    `--all` every row (`before_all_rows`: a checkout before a7331d0 printed every row by default
    and knows no `--all`). Before a7331d0, `lint` read every revision once per stack it found no
    KV measurement for: over 10,000 revisions and 1,000 stacks that is hours, so `lint` is timed
    by both sides on a state dir of the first 200 revisions, and by the after side alone on all
    10,000."""
    lint = ["lint", "--all", "--no-docker"]
    rows: list[tuple[str, list[str] | None, list[str], str]] = [
        ("status", ["status"], ["status"], "full"),
        ("history (default)", ["history"], ["history"], "full"),
        ("history, every row", before_all_rows, ["history", "--all"], "full"),
        ("history -n 20", ["history", "-n", "20"], ["history", "-n", "20"], "full"),
        ("stacks", ["stacks"], ["stacks"], "full"),
        (f"lint --all --no-docker ({SMALL} revs)", lint, lint, "small"),
        ("lint --all --no-docker", None, lint, "full"),
        ("render STACK --no-docker", ["render", info["render"], "--no-docker"],
         ["render", info["render"], "--no-docker"], "full"),
        ("--help", ["--help"], ["--help"], "full"),
    ]
    return rows


def small_state(root: Path, count: int) -> Path:
    """The first `count` revisions of the built state dir, the index repaired by the store."""
    small = root / "state-small"
    if not small.is_dir():
        sys.path.insert(0, str(REPO))
        from b70deploy.state.revisions import RevisionStore

        (small / "revisions").mkdir(parents=True)
        for n in range(1, count + 1):
            shutil.copytree(root / "state" / "revisions" / f"{n:06d}", small / "revisions" / f"{n:06d}")
        (small / "revisions" / "current").write_text(f"{count}\n")
        RevisionStore(small).index()
    return small


def side_config(root: Path, side: str, state: str, info: dict[str, Any]) -> Path:
    """The node config of one side: its own copy of the state dir (an older checkout may rewrite
    the index in its own format), everything else shared."""
    source = root / "state" if state == "full" else small_state(root, min(SMALL, info["revisions"]))
    copy = root / f"{source.name}-{side}"
    if not copy.is_dir():
        shutil.copytree(source, copy, symlinks=True)
    cfg = yaml.safe_load(Path(info["config"]).read_text())
    cfg["state_dir"] = str(copy)
    path = root / f"node-{side}-{state}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def hyperfine(label: str, argv: list[str], runs: int, warmup: int, out: Path, cwd: Path) -> dict[str, Any]:
    """hyperfine's numbers for one command line, run without a shell (-N) in `cwd`; output to a pipe."""
    subprocess.run(["hyperfine", "-N", "--style", "none", "--runs", str(runs), "--warmup", str(warmup),
                    "--ignore-failure", "--export-json", str(out), f"--command-name={label}", shlex.join(argv)],
                   check=True, stdout=subprocess.DEVNULL, cwd=cwd)
    result = json.loads(out.read_text())["results"][0]
    times = sorted(result["times"])
    # CPU seconds (user + system, hyperfine's mean) move less than wall time on a busy machine.
    return {"median": statistics.median(times), "min": times[0], "max": times[-1], "runs": len(times),
            "cpu_mean": result["user"] + result["system"], "exit_codes": sorted(set(result.get("exit_codes") or []))}


def time_sides(root: Path, info: dict[str, Any], sides: dict[str, Path], runs: int, warmup: int,
               before_all_rows: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """For each command, each side in turn (so a busy spell of the machine hits both)."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for label, before, after, state in commands(info, before_all_rows):
        results[label] = {}
        for side, checkout in sides.items():
            args = before if side == "before" else after
            if args is None:
                continue
            argv = ["env", f"PYTHONPATH={checkout}", sys.executable, "-m", "b70deploy.cli"]
            argv += args if args == ["--help"] else ["--config", str(side_config(root, side, state, info)), *args]
            for attempt in (1, 2, 3):  # a run that failed (the shared venv being reinstalled) is redone
                print(f"  {label} ({side})", file=sys.stderr)
                # cwd: `python -m` puts the current directory first on sys.path, before PYTHONPATH; run
                # anywhere else (a checkout), both sides would import that checkout's b70deploy.
                results[label][side] = got = hyperfine(f"{label} ({side})", argv, runs, warmup,
                                                       root / "hyperfine.json", cwd=checkout)
                if got["exit_codes"] == [0]:
                    break
                print(f"  exit codes {got['exit_codes']}: again ({attempt} of 3)", file=sys.stderr)
    return results


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "-"
        failed = "" if r["exit_codes"] == [0] else f" exit {r['exit_codes']}"
        spread = f"{r['min'] * 1000:.0f}-{r['max'] * 1000:.0f}"
        return f"{r['median'] * 1000:.0f} ({spread}) cpu {r['cpu_mean'] * 1000:.0f}{failed}"

    lines = [f"{'command':<34}{'before ms: median (min-max) cpu':>36}{'after ms: median (min-max) cpu':>36}"
             f"{'after/before':>14}"]
    for label, sides in results.items():
        before, after = sides.get("before"), sides["after"]
        ratio = f"{after['median'] / before['median']:.3f}" if before else "-"
        lines.append(f"{label:<34}{cell(before):>36}{cell(after):>36}{ratio:>14}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--before", metavar="CHECKOUT", help="the checkout to compare with (e.g. main at a7331d0)")
    ap.add_argument("--revisions", type=int, default=10_000)
    ap.add_argument("--api-revisions", type=int, default=200, help="how many through the API; the rest copies")
    ap.add_argument("--stacks", type=int, default=1_000)
    ap.add_argument("--runs", type=int, default=5, help="counted runs per command and side (>= 5)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--before-all-rows", default="history --all", metavar="ARGS",
                    help="how the --before checkout prints every history row ('history' before a7331d0)")
    ap.add_argument("--keep", metavar="DIR", help="build into DIR and keep it (reused when it exists)")
    ap.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    ap.add_argument("--text", metavar="FILE", help="write the table")
    args = ap.parse_args(argv)
    if shutil.which("hyperfine") is None:
        print("error: hyperfine not found; fix: apt-get install hyperfine", file=sys.stderr)
        return 2
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="b70scale-"))
    try:
        print(f"building in {root}", file=sys.stderr)
        info = build(root, args.revisions, args.stacks, args.api_revisions)
        sides = {"before": Path(args.before).resolve()} if args.before else {}
        sides["after"] = REPO
        for checkout in sides.values():
            # Bytecode for both sides, as an installed package has it: with PYTHONDONTWRITEBYTECODE
            # set, a checkout without __pycache__ would compile every module on every run.
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "b70deploy")], check=True,
                           stdout=subprocess.DEVNULL)
        results = time_sides(root, info, sides, args.runs, args.warmup, args.before_all_rows.split())
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    text = table(results)
    head = (f"{info['revisions']:,} revisions ({info['build']['api_revisions']} through the API), "
            f"{info['stacks']:,} stacks; {args.runs} runs after {args.warmup} warm-up per command and side; "
            f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end")
    print(head)
    print(text)
    if args.text:
        Path(args.text).write_text(head + "\n" + text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": head, "build": info["build"], "sides":
                                               {k: str(v) for k, v in sides.items()}, "results": results},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
