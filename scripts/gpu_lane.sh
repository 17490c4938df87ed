#!/usr/bin/env bash
# The GPU lane, on the lent GPU machine (no network; torch in /opt/torch/.venv's python3). Run from the
# root of the checkout the device tool sent, with .gpulane/ carried (scripts/gpu_lane_pack.sh made it):
#
#   bash .gpulane/src/scripts/gpu_lane.sh STEP...
#
# Steps, each cheap to repeat on a warm machine (state in /tmp/gl, which outlives a call):
#   probe    the machine: GPU, driver, kernel, the device's pip freeze, what Docker would need  -> $OUT
#   recv     keep the chunks this call carried (.gpulane/{vllm,deps,docker}/part*) in /tmp/gl/parts
#   install  vLLM's files into /tmp/gl/site, and the carried wheels the device's Python lacks (or has older)
#   model    a random-weights Qwen3 model of a published shape (B70_GPU_SHAPE, default qwen3-0.6b)
#   cycle    scripts/gpu_lane.py cycle: boot, sleep/wake levels 1 and 2, smoke, bench, capture/replay
#   boots    scripts/gpu_lane.py boots: B70_GPU_BOOTS more cold boots (default 2)
#   docker   Debian's dockerd from the carried binaries; a container given the GPU as a CDI spec would
#   out      results and logs to $OUT (at most 8 files come back)
set -uo pipefail

G=/tmp/gl
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRIED=$(cd "$SRC/.." && pwd)
PY=${B70_GPU_PYTHON:-python3}
OUTDIR=${OUT:-$G/out-copy}
mkdir -p "$G/parts/vllm" "$G/parts/deps" "$G/parts/docker" "$G/site" "$G/out" "$OUTDIR"
say() { echo "[gpu-lane $(date +%H:%M:%S)] $*"; }

step_probe() {
  { nvidia-smi; uname -a; cat /etc/os-release; "$PY" -V; "$PY" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
    echo "--- nproc $(nproc), memory"; free -g; df -h /tmp
    echo "--- cgroups"; mount | grep -E 'cgroup|overlay' ; cat /proc/filesystems | tr '\n' ' '; echo
    echo "--- /dev/nvidia*"; ls -la /dev/nvidia* 2>&1
    echo "--- driver libraries"; ls /usr/local/nvidia 2>&1; ldconfig -p | grep -E 'libcuda|libnvidia-ml' | head
    echo "--- modules"; ls /lib/modules 2>&1 | head -3; lsmod 2>&1 | head -20
    echo "--- iptables"; command -v iptables ip 2>&1
  } > "$G/out/probe.txt" 2>&1
  "$PY" -m pip list --format=freeze > "$G/out/freeze.txt" 2>&1
  cp "$G/out/probe.txt" "$G/out/freeze.txt" "$OUTDIR/"
  say "probe: $(head -c 0 /dev/null)$(grep -c . "$G/out/freeze.txt") packages; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
}

step_recv() {
  for d in vllm deps docker; do
    for f in "$CARRIED/$d"/part*; do [ -f "$f" ] && cp "$f" "$G/parts/$d/" && say "kept $d/$(basename "$f")"; done
  done
  ls -la "$G"/parts/*
}

step_install() {
  set -e
  if [ ! -f "$G/site/.vllm" ]; then
    cat "$G"/parts/vllm/part* | xz -d | tar -x -C "$G/site"
    touch "$G/site/.vllm"
  fi
  rm -rf "$G/wheels" && mkdir -p "$G/wheels"
  cat "$G"/parts/deps/part* | tar -x -C "$G/wheels"
  # Only what the device's Python lacks, or holds older than the pinned wheel: its own packages stay.
  "$PY" - "$G/wheels" > "$G/out/install.txt" <<'EOF'
import importlib.metadata as md, pathlib, sys
from packaging.version import Version
for w in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name, version = w.name.split("-")[:2]
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(w, "absent"); continue
    if Version(have) < Version(version):
        print(w, f"older {have}")
EOF
  cut -d' ' -f1 "$G/out/install.txt" | xargs "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$G/site"
  say "installed $(wc -l < "$G/out/install.txt") wheels into $G/site"
  rm -rf "$G/src" && cp -r "$SRC" "$G/src"
  set +e
  (cd "$G/src" && PYTHONPATH="$G/site:$G/src" "$PY" -c 'import vllm, b70deploy.docker.sleepmode, b70deploy.cli; print("vllm", vllm.__version__)')
}

step_model() {
  [ -f "$G/model/config.json" ] && return 0
  PYTHONPATH="$G/site:$G/src" "$PY" "$G/src/scripts/gpu_model.py" "$G/model" --shape "${B70_GPU_SHAPE:-qwen3-0.6b}"
}

lane() {
  (cd "$G/src" && PYTHONPATH="$G/site:$G/src" "$PY" scripts/gpu_lane.py "$@" --model "$G/model" --out "$G/out")
}
step_cycle() { lane cycle; }
step_boots() { lane boots -n "${B70_GPU_BOOTS:-2}"; }

step_docker() {
  local D=$G/docker R=$G/out/docker.txt
  mkdir -p "$D" && cat "$G"/parts/docker/part* | tar -xz -C "$D"
  export PATH=$D/usr/bin:$D/usr/sbin:$PATH
  # dockerd re-executes itself (docker-applyLayer) without LD_LIBRARY_PATH: the libraries the machine
  # lacks go where the loader looks, the ones it has stay its own.
  cp -n "$D"/usr/lib/b70/* /usr/local/lib/ && ldconfig
  {
    echo "--- dockerd $(dockerd --version 2>&1)"
    # vfs: no overlay needed; no bridge and no iptables: a GPU VM may have neither, and host networking
    # is all the lane needs.
    dockerd --storage-driver vfs --bridge none --iptables=false --ip6tables=false --data-root "$G/docker-data" \
      --exec-root "$G/docker-exec" -H unix://$G/docker.sock > "$G/out/dockerd.log" 2>&1 &
    export DOCKER_HOST=unix://$G/docker.sock
    for _ in $(seq 1 60); do docker version >/dev/null 2>&1 && break; sleep 0.5; done
    docker version 2>&1; docker info 2>&1 | head -40
    # An image of no files: the container sees the machine's own /usr, /lib and /opt read-only, the driver's
    # device nodes and libraries as nvidia-container-toolkit's CDI spec lists them (device nodes, the
    # driver's libraries, nvidia-smi).
    mkdir -p "$G/empty/dev" "$G/empty/proc" "$G/empty/sys" "$G/empty/tmp" "$G/empty/etc"
    tar -C "$G/empty" -cf - . | docker import - b70gpu/empty:lane 2>&1
    DEVS=(); for n in /dev/nvidia*; do [ -c "$n" ] && DEVS+=(--device "$n"); done
    MOUNTS=(); for p in /usr /lib /lib64 /bin /sbin /opt /etc/alternatives /usr/local/nvidia; do
      [ -e "$p" ] && MOUNTS+=(-v "$p:$p:ro"); done
    docker run --rm --network host "${DEVS[@]}" "${MOUNTS[@]}" -v "$G:$G" b70gpu/empty:lane \
      /bin/sh -c 'nvidia-smi -L && python3 -c "import torch; print(\"torch in a container:\", torch.cuda.is_available(), torch.cuda.get_device_name(0))"' 2>&1
    echo "exit $?"
  } > "$R" 2>&1
  tail -30 "$G/out/dockerd.log" >> "$R"
  cat "$R"
}

step_out() {
  cp "$G"/out/results-*.json "$OUTDIR/" 2>/dev/null
  cp "$G"/out/vllm-cycle.log "$OUTDIR/" 2>/dev/null
  tar -C "$G/out" -czf "$OUTDIR/lane-out.tar.gz" --exclude=capture . 2>/dev/null
  ls -la "$OUTDIR"
}

for s in "$@"; do
  say "step $s"
  "step_$s" || { say "step $s failed"; step_out; exit 1; }
done
