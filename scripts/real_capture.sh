#!/usr/bin/env bash
# Capture a real vLLM boot log from the lane's image as a fixture: tests/fixtures/vllm-VERSION-cpu/NAME.log.
# Runs the image the way the lane's stacks do (the venv, its Python and the models bind-mounted
# read-only, VLLM_CPU_KVCACHE_SPACE=1), waits until /health answers or the process exits, then
# stops it (SIGTERM) and writes the container's log, both streams, unedited.
#
#   B70_REAL_VLLM_VERSION=0.32.0 bash scripts/real_capture.sh boot -- --enforce-eager
#   B70_REAL_VLLM_VERSION=0.32.0 bash scripts/real_capture.sh crash-sleep-mode -- --enforce-eager --enable-sleep-mode
#   B70_REAL_VLLM_VERSION=0.32.0 B70_CAPTURE_COMPILE=1 bash scripts/real_capture.sh boot-compiled
#
# B70_CAPTURE_WAIT: seconds to wait for /health or the exit (default 1800).
# B70_CAPTURE_COMPILE=1 lets Dynamo trace the model (TORCHDYNAMO_DISABLE=0; give no
# --enforce-eager) with VLLM_CPU_CI_ENV=1, which makes vLLM's CPU platform compile with the eager
# backend instead of inductor (vllm/platforms/cpu.py): no C++ compiler needed in the image.
set -euo pipefail
NAME=${1:?usage: real_capture.sh NAME -- EXTRA_VLLM_ARGS...}; shift
[ "${1:-}" = "--" ] && shift
VERSION=${B70_REAL_VLLM_VERSION:-0.21.0}
CACHE=${B70_REAL_CACHE:-/var/cache/b70deploy/real-vllm-$VERSION}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$REPO/tests/fixtures/vllm-$VERSION-cpu
[ -f "$CACHE/complete" ] || { echo "real_capture: no lane in $CACHE: run B70_REAL_VLLM_VERSION=$VERSION bash scripts/real_vllm.sh" >&2; exit 1; }
declare -A lane
while IFS='=' read -r k v; do lane[$k]=$v; done <"$CACHE/lane.env"
name=b70capture-$$
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mounts=(-v "${lane[B70_REAL_PYTHON_BASE]}:${lane[B70_REAL_PYTHON_BASE]}:ro" -v "${lane[B70_REAL_VENV]}:${lane[B70_REAL_VENV]}:ro"
        -v "${lane[B70_REAL_MODELS]}:/models:ro")
envs=(-e VLLM_CPU_KVCACHE_SPACE=1)
if [ "${B70_CAPTURE_COMPILE:-0}" = 1 ]; then
  envs+=(-e TORCHDYNAMO_DISABLE=0 -e VLLM_CPU_CI_ENV=1)
fi
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
docker run -d --name "$name" --shm-size 1g "${envs[@]}" "${mounts[@]}" -p "127.0.0.1:$port:8000" "${lane[B70_REAL_IMAGE]}" \
  vllm serve /models/${B70_CAPTURE_MODEL:-tiny} --dtype float32 --max-model-len 512 --served-model-name tiny-a tiny-b \
  --host 0.0.0.0 --port 8000 "$@" >/dev/null
state=exited
for _ in $(seq 1 "${B70_CAPTURE_WAIT:-1800}"); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then state=healthy; break; fi
  [ "$(docker inspect -f '{{.State.Running}}' "$name")" = true ] || break
  sleep 1
done
if [ "$state" = healthy ]; then
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "tiny-a", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}' >/dev/null || true
  docker stop -t 30 "$name" >/dev/null
fi
mkdir -p "$OUT"
docker logs "$name" >"$OUT/$NAME.log" 2>&1
echo "real_capture: $state, exit $(docker inspect -f '{{.State.ExitCode}}' "$name"): $OUT/$NAME.log"
