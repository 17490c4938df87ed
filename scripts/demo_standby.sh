#!/usr/bin/env bash
# Hot standby without a GPU, on the simulated node: the front door owns the port, `switch` puts the live
# stack to sleep beside the new one instead of stopping it, and `rollback` wakes it (seconds) instead of
# booting it. The sim image is a vLLM 0.32.0 stand-in, a release that sleeps on XPU. Everything lives in
# one temp folder (or $B70_DEMO_DIR) and its compose projects; both are removed at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${B70_PYTHON:-$here/.venv/bin/python}
repo=${B70SIM_REPO:-b70sim/vllm}
work=${B70_DEMO_DIR:-$(mktemp -d -t b70standby.XXXXXX)}
b70() { "$py" -m b70deploy.cli --config "$work/node.yaml" "$@"; }
step() { printf '\n== %s\n' "$*"; }

read -r port dark probe < <("$py" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
mkdir -p "$work"
sed -e "s/^  prod: 18100 .*/  prod: $port/" -e "s/^  dark: 18101/  dark: $dark/" -e "s/^  probe_port: 18102/  probe_port: $probe/" \
    -e "s#b70sim/vllm:#$repo:#" "$here/demo/node-standby.yaml" > "$work/node.yaml"
project=$("$py" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["project"])' "$work/node.yaml")
cleanup() {
  step "tear down"
  for p in $(docker ps -a --format '{{.Label "com.docker.compose.project"}}' | sort -u | grep -E "^$project(-r[0-9]+|-dark)?$" || true); do
    ids=$(docker ps -aq --filter "label=com.docker.compose.project=$p")
    [ -z "$ids" ] || docker rm -f $ids >/dev/null
  done
  for net in $(docker network ls --format '{{.Name}}' | grep -E "^$project(-r[0-9]+)?_" || true); do
    docker network rm "$net" >/dev/null || true
  done
  if [ -z "${B70_DEMO_DIR:-}" ]; then
    tags=$(docker images --format '{{.Repository}}:{{.Tag}}' b70deploy/keep | grep -E "^b70deploy/keep:$project-[0-9a-f]{12}$" || true)
    [ -z "$tags" ] || docker rmi $tags >/dev/null
    rm -rf "$work"
  fi
}
trap cleanup EXIT

step "build the sim images and the front door's (no registry)"
"$py" -m b70deploy.cli sim build
b70 door --build
"$py" -m b70deploy.cli sim models "$work/models"
step "b70deploy switch w4a16 (boots in a standby slot behind the door)"
b70 switch w4a16 --yes
step "b70deploy switch eagle3 --dry-run (says what sleeps)"
b70 switch eagle3 --dry-run | sed -n 1,5p
step "b70deploy switch eagle3 (w4a16 falls asleep beside it instead of stopping)"
b70 switch eagle3 --yes
step "b70deploy status"
b70 status
step "b70deploy rollback (wakes w4a16: no boot)"
TIMEFORMAT='rollback took %R s in all: its vLLM woke ("healthy in" above) instead of booting'
time b70 rollback --yes
step "b70deploy history"
b70 history
echo
echo "demo ok: switched with the old stack asleep beside the new one, rolled back by waking it"
