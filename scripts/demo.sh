#!/usr/bin/env bash
# The demo on the simulated node: build the sim images, lay out the post's model folders,
# lint the catalogue, then do what the post did by hand, with one command each:
#   switch to w4a16 (Marlin carve-out patched in from the image), switch to eagle3 (draft
#   copy with max_position_embeddings raised), try qwen36 (garbage output: the smoke test
#   catches it and the node rolls back by itself), roll back to w4a16 by name, and show the
#   history and the KV-pool diff. Everything lives in one temp folder (or $B70_DEMO_DIR)
#   under one compose project; both are removed at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${B70_PYTHON:-$here/.venv/bin/python}
work=${B70_DEMO_DIR:-$(mktemp -d -t b70demo.XXXXXX)}
b70() { "$py" -m b70deploy.cli --config "$work/node.yaml" "$@"; }
step() { printf '\n== %s\n' "$*"; }

# -- node: the demo config in the work folder, with free loopback ports
read -r port dark < <("$py" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
mkdir -p "$work"
sed -e "s/^  prod: 18000 .*/  prod: $port/" -e "s/^  dark: 18001.*/  dark: $dark/" "$here/demo/node.yaml" > "$work/node.yaml"
project=$("$py" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["project"])' "$work/node.yaml")
cleanup() {
  step "tear down"
  for p in "$project" "$project-dark"; do
    ids=$(docker ps -aq --filter "label=com.docker.compose.project=$p")
    [ -z "$ids" ] || docker rm -f $ids >/dev/null
    nets=$(docker network ls -q --filter "label=com.docker.compose.project=$p")
    [ -z "$nets" ] || docker network rm $nets >/dev/null
  done
  if [ -z "${B70_DEMO_DIR:-}" ]; then
    # The revisions go with $work, and so do the keep tags that protected their images.
    tags=$(docker images --format '{{.Repository}}:{{.Tag}}' b70deploy/keep | grep -E "^b70deploy/keep:$project-[0-9a-f]{12}$" || true)
    [ -z "$tags" ] || docker rmi $tags >/dev/null
    rm -rf "$work"
  fi
}
trap cleanup EXIT

step "build the sim images (docker import, no registry)"
"$py" -m b70deploy.cli sim build
step "the post's model folders, simulated"
"$py" -m b70deploy.cli sim models "$work/models"
step "b70deploy stacks"
b70 stacks
step "b70deploy lint --all"
b70 lint --all
step "b70deploy switch w4a16"
b70 switch w4a16 --yes -m "first deploy: W4A16 + fp8 KV at 262K"
step "b70deploy switch eagle3"
b70 switch eagle3 --yes -m "EAGLE-3 with the draft's max_position_embeddings raised"
step "b70deploy switch qwen36 (boots, but speaks word-salad: expect an automatic rollback)"
if b70 switch qwen36 --yes; then echo "qwen36 should have failed its smoke test"; exit 1; fi
step "b70deploy rollback w4a16"
b70 rollback w4a16 --yes
step "b70deploy history"
b70 history
step "b70deploy diff 1 2 (w4a16 -> eagle3: files and boot facts)"
b70 diff 1 2 | tail -n 14
step "b70deploy status"
b70 status
echo
echo "demo ok: switched, caught a bad stack, rolled back by name, on the simulated node"
