#!/usr/bin/env bash
# The demo on the simulated node: build the sim images, render a shipped stack, bring it up,
# wait for /health, show /health and /v1/models, tear down. Everything lives in one temp
# folder (or $B70_DEMO_DIR) and under one compose project; both are removed at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${B70_PYTHON:-$here/.venv/bin/python}
stack=${B70_DEMO_STACK:-tq-256k}
work=${B70_DEMO_DIR:-$(mktemp -d -t b70demo.XXXXXX)}
b70() { "$py" -m b70deploy.cli --config "$work/node.yaml" "$@"; }
step() { printf '\n== %s\n' "$*"; }

# -- node: the demo config in the work folder, with a free loopback port
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/models" "$work/deploy" "$work/state"
sed "s/^  prod: 18000 .*/  prod: $port/" "$here/demo/node.yaml" > "$work/node.yaml"
project=$("$py" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["project"])' "$work/node.yaml")
compose=(docker compose --project-directory "$work/deploy" -p "$project" --profile gpu)
cleanup() {
  step "tear down"
  "${compose[@]}" down --remove-orphans --timeout 5 >/dev/null 2>&1 || true
  [ -n "${B70_DEMO_DIR:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

step "build the sim images"
"$py" -m b70deploy.cli sim build

step "render $stack into $work/deploy"
b70 render "$stack" --out "$work/deploy"

step "docker compose up -d"
"${compose[@]}" up -d --pull never

step "wait for /health on 127.0.0.1:$port"
for _ in $(seq 1 120); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)
  [ "$code" = 200 ] && break
  sleep 0.5
done
[ "$code" = 200 ] || { "${compose[@]}" logs --no-color vllm | tail -20; echo "not healthy"; exit 1; }

step "GET /health -> $code"
step "GET /v1/models"
curl -s "http://127.0.0.1:$port/v1/models" | "$py" -c 'import json, sys; [print(" ", m["id"], m["max_model_len"]) for m in json.load(sys.stdin)["data"]]'
step "boot facts from the log"
"${compose[@]}" logs --no-color --no-log-prefix vllm | grep -E 'KV cache size|Maximum concurrency|Using .*backend|Starting vLLM' || true
echo
echo "demo ok: $stack served on 127.0.0.1:$port by the simulated node"
