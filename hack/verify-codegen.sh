#!/usr/bin/env bash
# verify-codegen.sh fails when the generated code under impl/client and the
# deepcopy functions under impl/apis are not what hack/update-codegen.sh
# makes from the current types and go.mod: it runs the generators in a
# temporary copy of the module's inputs and compares. Needs only the Go
# module proxy (the generators are fetched at their pinned versions).
set -o errexit -o nounset -o pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "${TMP}"' EXIT

# The generators read the API types (and the module's packages they
# import) and write impl/client; nothing else of the module is needed.
cd "${REPO_ROOT}"
MODULE="$(go list -m)"
cp go.mod go.sum "${TMP}/"
cp -R hack "${TMP}/hack"
for pkg in $(go list -deps ./impl/apis/... | grep "^${MODULE}/"); do
  dir="${pkg#"${MODULE}"/}"
  mkdir -p "${TMP}/${dir}"
  find "${dir}" -maxdepth 1 -type f -name '*.go' -exec cp {} "${TMP}/${dir}/" \;
done
mkdir -p "${TMP}/impl/apis"
cp -R impl/apis/. "${TMP}/impl/apis/"
[[ -d "${REPO_ROOT}/impl/client" ]] && cp -R "${REPO_ROOT}/impl/client" "${TMP}/impl/client"

"${TMP}/hack/update-codegen.sh" >/dev/null

status=0
for dir in impl/client impl/apis; do
  if ! diff -Nru "${REPO_ROOT}/${dir}" "${TMP}/${dir}"; then
    status=1
  fi
done
if (( status )); then
  echo "Generated code is stale: run hack/update-codegen.sh and commit the result." >&2
  exit 1
fi
echo "Generated code is up to date."
