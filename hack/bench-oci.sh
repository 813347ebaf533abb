#!/usr/bin/env bash
# Runs BenchmarkOCIvsHelper (impl/fiberd/backend/process): fibers through
# crun and runc against the process backend's helper, alternately, in one
# run (docs/security.md, "Why not an OCI runtime"). As root.
#
# crun 1.8 refuses to start anything on a hybrid cgroup host whose cgroup2
# hierarchy (/sys/fs/cgroup/unified) has a controller (hugetlb, on the
# hosts this was measured on). The benchmark therefore runs in a private
# mount namespace with /sys/fs/cgroup/unified unmounted: crun then sees a
# plain cgroup v1 host. The host's own mounts are not touched.
#
#   hack/bench-oci.sh [go test flags, default -benchtime 60x]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/hack/install-crun.sh"
flags=("$@")
if [ ${#flags[@]} -eq 0 ]; then flags=(-benchtime 60x); fi
cd "$here"
go test -c -o /tmp/lampyr-process.test ./impl/fiberd/backend/process
exec unshare --mount --propagation private sh -c '
  if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi
  cd impl/fiberd/backend/process && exec /tmp/lampyr-process.test "$@"
' sh -test.run '^TestOCIRuntimeIsolation$' -test.bench OCIvsHelper -test.v "${flags[@]/#-/-test.}"
