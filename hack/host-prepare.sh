#!/usr/bin/env bash
# Prepares this host to run Kind clusters offline. Idempotent: every step
# detects first and changes only what is missing, so a host that already works
# is left alone. Run by .ci/run and by the README's commands (as root, or with
# passwordless sudo).
set -euo pipefail

say() { printf '[host-prepare] %s\n' "$*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
here=$(cd "$(dirname "$0")/.." && pwd)
t0=$(date +%s)

apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then
    say "apt-get update"
    $SUDO apt-get update -qq
    apt_updated=1
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# 1. Packages the offline builds need: Docker (engine), debootstrap (the Kind
# node rootfs), npm (to install just), gcc (the static pause binary).
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v jq >/dev/null 2>&1 || need+=(jq)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then apt_install "${need[@]}"; fi

# 2. just, from npm's rust-just (no release binary can be downloaded here).
if ! command -v just >/dev/null 2>&1; then
  say "npm install -g rust-just@1.57.0"
  $SUDO npm install -g --silent rust-just@1.57.0 >/dev/null
fi

# 3. inotify limits: every Kind node runs systemd, kubelet and containerd, each
# watching many files; Kind's known-issues page recommends these values.
raise() {
  local key=$1 want=$2 have
  have=$(sysctl -n "$key" 2>/dev/null || echo 0)
  if [ "$have" -lt "$want" ]; then
    say "sysctl $key=$want (was $have)"
    $SUDO sysctl -qw "$key=$want" || say "warning: could not raise $key"
  fi
}
raise fs.inotify.max_user_watches 524288
raise fs.inotify.max_user_instances 512

# 4. The capability filter, only when the bounding set lacks CAP_SYS_RESOURCE
# (bit 24): without it `docker run --privileged` fails with "unable to apply
# caps: operation not permitted".
capbnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
daemon_json=/etc/docker/daemon.json
config_changed=""
if (( (16#$capbnd >> 24) & 1 )); then
  say "CAP_SYS_RESOURCE is in the bounding set: no runtime wrapper needed"
else
  wrapper=/usr/local/libexec/lampyr/lampyr-runc
  say "CAP_SYS_RESOURCE missing from the bounding set: installing $wrapper"
  $SUDO mkdir -p "$(dirname "$wrapper")"
  tmp=$(mktemp)
  (cd "$here" && CGO_ENABLED=0 go build -o "$tmp" ./clusters/cmd/lampyr-runc)
  if ! cmp -s "$tmp" "$wrapper" 2>/dev/null; then $SUDO install -m 0755 "$tmp" "$wrapper"; fi
  rm -f "$tmp"
  current='{}'
  if [ -s "$daemon_json" ]; then current=$(cat "$daemon_json"); fi
  desired=$(jq --arg p "$wrapper" '.runtimes["lampyr-runc"] = {"path": $p} | ."default-runtime" = "lampyr-runc"' <<<"$current")
  if [ "$(jq -S . <<<"$current")" != "$(jq -S . <<<"$desired")" ]; then
    say "registering lampyr-runc as dockerd's default runtime in $daemon_json"
    $SUDO mkdir -p /etc/docker
    printf '%s\n' "$desired" | $SUDO tee "$daemon_json" >/dev/null
    config_changed=1
  fi
fi

# 5. A Docker engine that answers.
dockerd_log=/var/log/lampyr-dockerd.log
start_dockerd() {
  if [ "$(ps -p 1 -o comm= 2>/dev/null)" = systemd ] && command -v systemctl >/dev/null; then
    say "systemctl ${1:-start} docker"
    $SUDO systemctl "${1:-start}" docker
  else
    if [ "${1:-}" = restart ] && pidof dockerd >/dev/null; then
      say "stopping dockerd to apply $daemon_json"
      $SUDO kill "$(pidof dockerd)"
      for _ in $(seq 1 30); do pidof dockerd >/dev/null || break; sleep 1; done
    fi
    say "starting dockerd (no systemd here), log: $dockerd_log"
    $SUDO bash -c "nohup dockerd >>$dockerd_log 2>&1 </dev/null &"
  fi
  for i in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then say "docker engine ready after ${i}s"; return 0; fi
    sleep 1
  done
  say "error: dockerd did not answer within 60s; see $dockerd_log"
  tail -n 20 "$dockerd_log" 2>/dev/null || true
  exit 1
}
if docker info >/dev/null 2>&1; then
  if [ -n "$config_changed" ]; then start_dockerd restart; else say "docker engine answers"; fi
else
  start_dockerd start
fi

say "done in $(( $(date +%s) - t0 ))s"
