#!/usr/bin/env bash
# update-codegen.sh generates the typed client, listers, informers, Knative
# injection and the generated reconciler (genreconciler) for the API types
# under impl/apis into impl/client, and their deepcopy functions, as
# knative.dev/serving's hack/update-codegen.sh does for pkg/client.
#
# The generators run with `go run module/cmd@version`: k8s.io/code-generator
# at the version of k8s.io/apimachinery in go.mod (v0.35.7) and
# knative.dev/pkg's injection-gen at the version of knative.dev/pkg in
# go.mod, so nothing but the Go module proxy is needed and the generated
# code always matches the libraries the project builds with.
#
# Usage: hack/update-codegen.sh   (hack/verify-codegen.sh checks the result
# is committed)
set -o errexit -o nounset -o pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_ROOT}"

MODULE="$(go list -m)"
CODEGEN_VERSION="$(go list -m -f '{{.Version}}' k8s.io/apimachinery)"
KNATIVE_PKG_VERSION="$(go list -m -f '{{.Version}}' knative.dev/pkg)"
BOILERPLATE="${REPO_ROOT}/hack/boilerplate/boilerplate.go.txt"

APIS_PKG="${MODULE}/impl/apis"
CLIENT_PKG="${MODULE}/impl/client"
CLIENT_DIR="${REPO_ROOT}/impl/client"
# group:versions, as generate-knative.sh takes them
GROUP_VERSIONS=(fiberd/v1alpha1)
INPUTS=()
for gv in "${GROUP_VERSIONS[@]}"; do INPUTS+=("${APIS_PKG}/${gv}"); done

gen() { # gen <code-generator command> args...
  local cmd="$1"; shift
  GOFLAGS=-mod=mod go run "k8s.io/code-generator/cmd/${cmd}@${CODEGEN_VERSION}" --go-header-file "${BOILERPLATE}" "$@"
}

echo "=== deepcopy (k8s.io/code-generator ${CODEGEN_VERSION})"
gen deepcopy-gen --output-file zz_generated.deepcopy.go "${INPUTS[@]}"

echo "=== clientset, listers, informers (k8s.io/code-generator ${CODEGEN_VERSION})"
rm -rf "${CLIENT_DIR}"
gen client-gen \
  --output-dir "${CLIENT_DIR}/clientset" --output-pkg "${CLIENT_PKG}/clientset" \
  --clientset-name versioned --input-base "${APIS_PKG}" \
  $(printf -- '--input %s ' "${GROUP_VERSIONS[@]}")
gen lister-gen \
  --output-dir "${CLIENT_DIR}/listers" --output-pkg "${CLIENT_PKG}/listers" \
  "${INPUTS[@]}"
gen informer-gen \
  --output-dir "${CLIENT_DIR}/informers" --output-pkg "${CLIENT_PKG}/informers" \
  --versioned-clientset-package "${CLIENT_PKG}/clientset/versioned" \
  --listers-package "${CLIENT_PKG}/listers" \
  "${INPUTS[@]}"

echo "=== injection and genreconciler (knative.dev/pkg ${KNATIVE_PKG_VERSION})"
# As knative.dev/pkg's hack/generate-knative.sh "injection".
GOFLAGS=-mod=mod go run "knative.dev/pkg/codegen/cmd/injection-gen@${KNATIVE_PKG_VERSION}" \
  --go-header-file "${BOILERPLATE}" \
  --input-dirs "$(IFS=,; echo "${INPUTS[*]}")" \
  --versioned-clientset-package "${CLIENT_PKG}/clientset/versioned" \
  --external-versions-informers-package "${CLIENT_PKG}/informers/externalversions" \
  --listers-package "${CLIENT_PKG}/listers" \
  --output-package "${CLIENT_PKG}/injection" \
  --output-dir "${CLIENT_DIR}/injection"

gofmt -s -w "${CLIENT_DIR}" "${REPO_ROOT}/impl/apis"
