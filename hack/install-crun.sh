#!/usr/bin/env bash
# Installs Debian's crun (bookworm: 1.8.1-1+deb12u1) for
# BenchmarkOCIvsHelper in impl/fiberd/backend/process, which compares
# fibers started through an OCI runtime with the process backend's helper
# (docs/security.md, "Why not an OCI runtime"). runc, the other side, comes
# with docker.io (hack/host-prepare.sh). Idempotent; as root or with sudo.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
if command -v crun >/dev/null 2>&1; then
  crun --version | head -1
  exit 0
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends crun >/dev/null
crun --version | head -1
