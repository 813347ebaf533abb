# Lampyr serving: every entry point. `just --list` shows them.
# Long recipes print a line per step with its duration.

set shell := ["bash", "-euo", "pipefail", "-c"]

# Static builds everywhere: the cluster images are built with CGO off
# (impl/build/gobuild), and a package compiled for `go test` with the
# same settings is reused from Go's build cache by the image builds instead
# of being compiled a second time. Nothing here uses cgo.
export CGO_ENABLED := "0"

artifacts := env_var_or_default("LAMPYR_ARTIFACTS", justfile_directory() / "_artifacts")
bin := justfile_directory() / "build"

# List the recipes.
default:
    @just --list

# Prepare this host (Docker engine, just, inotify limits, capability filter). Idempotent.
host-prepare:
    bash hack/host-prepare.sh

# Build the framework's command-line tools into build/.
tools:
    @mkdir -p {{bin}}
    go build -o {{bin}}/lampyr-clusters ./clusters/cmd/lampyr-clusters

# Build every offline cluster input (node image, registry image) into the cache.
cluster-inputs: tools
    {{bin}}/lampyr-clusters inputs

# Start building the cluster inputs in the background while the next recipe
# compiles its test binary (lampyr-inputs links no Kubernetes or Knative, so
# it starts in seconds); the suite's harness waits for it (a lock on the
# cache) and finds them built. Seconds when the cache is warm.
_inputs-background:
    @mkdir -p {{artifacts}}
    @go run ./clusters/cmd/lampyr-inputs -announce
    @nohup go run ./clusters/cmd/lampyr-inputs > {{artifacts}}/inputs-background.log 2>&1 &
    @echo "cluster inputs: building in the background while the suite compiles (log: {{artifacts}}/inputs-background.log)"

# Create (or reuse) Kind clusters, in parallel; default: the stock/lampyr pair.
# LAMPYR_EVENTING=1 adds Knative Eventing to each (off by default).
cluster-up *NAMES="stock lampyr": tools
    {{bin}}/lampyr-clusters up {{NAMES}}

# Delete Kind clusters.
cluster-down +NAMES: tools
    {{bin}}/lampyr-clusters down {{NAMES}}

# Export a cluster's node and pod logs into the artifacts folder.
cluster-logs NAME: tools
    {{bin}}/lampyr-clusters logs {{NAME}} {{artifacts}}/logs

# Unit and in-process integration tests (no cluster).
test-unit:
    go vet ./...
    # includes hack/runtimecheck: modules that reach into the Go runtime must
    # match this toolchain (docs/environment.md, "Go toolchain")
    @mkdir -p {{artifacts}}
    # gotestsum (a go.mod tool) prints what `go test` prints and writes a
    # JUnit report, so that hack/ci-summary can show a failed test's own
    # lines at the end of a CI run (the log above is cut).
    go tool gotestsum --format standard-quiet --hide-summary=output,skipped --junitfile {{artifacts}}/unit-junit.xml -- -count=1 ./...
    # Template validation must never panic: fuzz it for a bounded number of
    # inputs (~20 s here). A count, not a duration: with -fuzztime 30s Go's
    # coordinator can fail the run with a bare "context deadline exceeded" when
    # the deadline lands while a worker is minimizing (CI saw it: no crasher).
    go test -run '^$' -fuzz '^FuzzValidate$' -fuzztime 20000x -fuzzminimizetime 200x ./impl/reconciler/revision/

# Cluster suites on real Kind clusters.
test-clusters *GINKGO_ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 60m ./clusters/e2e/ -ginkgo.timeout=55m -ginkgo.v -ginkgo.junit-report={{artifacts}}/clusters-junit.xml -ginkgo.json-report={{artifacts}}/clusters.json {{GINKGO_ARGS}}

# Stock Knative Serving on the offline "stock" cluster: helloworld, scale to zero, split, tags.
test-stock *GINKGO_ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 60m ./clusters/e2e/stock/ -ginkgo.timeout=55m -ginkgo.v -ginkgo.junit-report={{artifacts}}/stock-junit.xml -ginkgo.json-report={{artifacts}}/stock.json {{GINKGO_ARGS}}

# The Revision backend feasibility gate: provider x strategy x proof matrix on the "lampyr" cluster
# (each provider that runs here installed in turn; the default one last, so the cluster is left on it).
test-feasibility *GINKGO_ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 60m ./feasibility/ -ginkgo.timeout=55m -ginkgo.v -ginkgo.junit-report={{artifacts}}/feasibility-junit.xml -ginkgo.json-report={{artifacts}}/feasibility.json {{GINKGO_ARGS}}

# Side-by-side performance of stock Knative and Lampyr on the paired clusters
# (report in _artifacts/bench/report.{json,md,html,png}; the PNG is rendered
# with Debian's chromium, installed here if missing). About 40 minutes, plus
# about 80 for the scale row (200 idle Services a side on 2 CPUs: 77 min); Ginkgo's own
# suite timeout (1 h by default, which ended a scale run at 160 Services) is
# set just under go test's. Knobs (docs/environment.md): LAMPYR_BENCH_SECONDS,
# LAMPYR_BENCH_COLD_CYCLES, LAMPYR_BENCH_READY_SAMPLES,
# LAMPYR_BENCH_IDLE_CPU_SECONDS, LAMPYR_BENCH_SCALE_SERVICES.
bench-portability *GINKGO_ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}
    @command -v chromium >/dev/null || { echo "bench: installing Debian's chromium (renders the report to PNG)"; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null || echo "bench: chromium not installed; the report stays HTML only"; }
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 180m ./portability/bench/ -ginkgo.timeout=175m -ginkgo.v -ginkgo.junit-report={{artifacts}}/bench-junit.xml -ginkgo.json-report={{artifacts}}/bench.json {{GINKGO_ARGS}}

# Day-2 operations (issue 33): with requests, a stream and a WebSocket running
# to Services on both clusters, roll the shared proxy (fiber-router / activator),
# kill one replica of it, delete and evict the Revision's Pod (Home / Pod), stop
# the control plane for LAMPYR_OPS_OUTAGE (default 2m; issue 33 asks for 30m),
# upgrade from LAMPYR_OPS_UPGRADE_FROM (stock: Knative v0.49.1 -> v0.50.0) and
# downgrade again, and, on clusters with workers (LAMPYR_CLUSTER_WORKERS=2 just
# cluster-up), drain a node. Lampyr is judged (no failed request); stock runs
# beside it as the reference. Reports, and every request-path Pod's log:
# _artifacts/operations/. About 35 minutes; outside `just test`, like the bench.
test-operations *GINKGO_ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 120m ./operations/ -ginkgo.timeout=115m -ginkgo.v -ginkgo.junit-report={{artifacts}}/operations-junit.xml -ginkgo.json-report={{artifacts}}/operations.json {{GINKGO_ARGS}}

# The short version of test-operations, in `just test`: fiber-router rolled and
# a Home deleted, with 10 s of traffic before and after each (about 3 minutes
# on clusters already up).
test-operations-short *GINKGO_ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} LAMPYR_OPS_STEADY=10s go test -v -count=1 -timeout 30m ./operations/ -ginkgo.timeout=25m -ginkgo.v -ginkgo.label-filter=short -ginkgo.junit-report={{artifacts}}/operations-short-junit.xml -ginkgo.json-report={{artifacts}}/operations-short.json {{GINKGO_ARGS}}

# Only Knative networking's KIngress suite against a cluster's networking
# layer (default: the stock cluster with the default provider, or
# LAMPYR_NETWORKING's); test-conformance runs it with the others.
test-ingress-conformance CLUSTER="stock" PROVIDER="": tools
    {{bin}}/lampyr-clusters up {{ if PROVIDER != "" { "--provider " + PROVIDER } else { "" } }} {{CLUSTER}}
    go run ./conformance/cmd/knative-conformance --cluster {{CLUSTER}} {{ if PROVIDER != "" { "--provider " + PROVIDER } else { "" } }} --suites ingress --out {{artifacts}}/conformance/{{CLUSTER}}-ingress

# Knative's own conformance suites (Serving's test/conformance/api/v1 and
# runtime, networking's test/conformance/ingress, compiled from the pinned
# modules) on the stock cluster (the reference) and on Lampyr, each checked against
# conformance/expectations/<profile>-<provider>.yaml (the provider installed). Lampyr runs the suites'
# image-only Services from snapshots of their test images (ly image-snapshot,
# config-lampyr image-snapshots). Reports: _artifacts/conformance/<cluster>/
# report.{yaml,md}, junit.xml; lampyr/side-by-side.md compares the two.
# Every part runs even when an earlier one fails (a stock failure must not
# hide Lampyr's results); the recipe fails at the end, naming the parts.
# Stock and Lampyr upstream suites side by side, then Lampyr's own suite.
test-conformance: tools
    #!/usr/bin/env bash
    set -uo pipefail
    failed=()
    start=$SECONDS
    {{bin}}/lampyr-clusters up stock || exit 1
    go run ./conformance/cmd/knative-conformance --cluster stock --out {{artifacts}}/conformance/stock || failed+=("stock upstream suites")
    {{bin}}/lampyr-clusters up lampyr || exit 1
    go run ./conformance/cmd/knative-conformance --cluster lampyr --out {{artifacts}}/conformance/lampyr --reference {{artifacts}}/conformance/stock/report.yaml || failed+=("lampyr upstream suites")
    just test-lampyr-conformance -lampyr.report-into={{artifacts}}/conformance/lampyr/report.yaml || failed+=("Lampyr's own suite")
    echo "test-conformance: $((SECONDS - start))s; reports in {{artifacts}}/conformance/{stock,lampyr,lampyr-suite}/ (lampyr/report.yaml holds Lampyr's own suite too)"
    if [ ${#failed[@]} -gt 0 ]; then printf 'failed: %s\n' "${failed[@]}"; exit 1; fi

# Lampyr's own conformance suite on the lampyr cluster (or, with
# LAMPYR_CONFORMANCE_KUBECONFIG and LAMPYR_CONFORMANCE_GATEWAY, on any
# Lampyr installation): declared tests (conformance/lampyr/tests.go), each in
# its own namespace, skipped when their feature is not claimed and checked
# against conformance/expectations/lampyr.yaml; ConformanceReport in
# _artifacts/conformance/lampyr-suite/. Extra arguments go to the test binary:
#   just test-lampyr-conformance -ginkgo.label-filter=restart
#   just test-lampyr-conformance -ginkgo.label-filter='install || routing || refusal'
#   just test-lampyr-conformance -lampyr.declarations=their.yaml
# Labels: install routing template refusal scaling readiness capacity
# execution restart keys tenancy finalization.
test-lampyr-conformance *ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 60m ./conformance/lampyr/ -ginkgo.timeout=55m -ginkgo.v -ginkgo.junit-report={{artifacts}}/lampyr-conformance-junit.xml -ginkgo.json-report={{artifacts}}/lampyr-conformance.json {{ARGS}}

# Two tenants holding only namespace `edit`, under Pod Security restricted, try
# every attack of docs/security.md against Lampyr, stock Knative as a reference.
# The hostile-tenant suite on the paired clusters (table: _artifacts/tenancy/report.md).
# The guard-rail rows include a 15-minute registry tarpit (LAMPYR_TENANCY_TARPIT_DURATION);
# skip it with `just test-tenancy -ginkgo.label-filter='!tarpit'`.
test-tenancy *GINKGO_ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 180m ./conformance/tenancy/ -ginkgo.timeout=175m -ginkgo.v -ginkgo.junit-report={{artifacts}}/tenancy-junit.xml -ginkgo.json-report={{artifacts}}/tenancy.json {{GINKGO_ARGS}}

# Everything CI runs: unit tests, then the cluster suites (each creates and
# deletes its clusters, or reuses and leaves ones that already existed).
test: _inputs-background test-unit test-clusters test-stock test-lampyr-conformance test-tenancy test-feasibility test-knative-portability test-provider-portability test-eventing-portability test-operations-short

# The portability proof: one digest-pinned Knative Service on stock Knative and on Lampyr.
# LAMPYR_PORTABILITY_KEEP=1 leaves both clusters running and prints curl commands.
# Extra arguments go to Ginkgo, e.g. `just test-knative-portability -ginkgo.label-filter=bindings`.
test-knative-portability *GINKGO_ARGS: _inputs-background
    @mkdir -p {{artifacts}}/portability
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 75m ./portability/ -ginkgo.timeout=70m -ginkgo.v -ginkgo.junit-report={{artifacts}}/portability-junit.xml -ginkgo.json-report={{artifacts}}/portability.json {{GINKGO_ARGS}}

# The portability proof over a list of targets (a YAML file; examples in
# portability/targets/): existing clusters by kubeconfig (nothing is
# created; each is checked first: gateway, registry, Lampyr), and/or Kind
# clusters each with its own networking provider; every target compared with
# the reference. Also LAMPYR_PORTABILITY_TARGETS=FILE on test-knative-portability.
# Reports: _artifacts/targets/portability/report.{md,json}, _artifacts/targets/portability-junit.xml.
#   just test-portability-targets portability/targets/three-providers.yaml
test-portability-targets FILE *GINKGO_ARGS:
    @mkdir -p {{artifacts}}/targets/portability
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}}/targets LAMPYR_PORTABILITY_TARGETS={{ if FILE =~ '^/' { FILE } else { invocation_directory() / FILE } }} go test -v -count=1 -timeout 150m ./portability/ -ginkgo.timeout=145m -ginkgo.v -ginkgo.junit-report={{artifacts}}/targets/portability-junit.xml -ginkgo.json-report={{artifacts}}/targets/portability.json {{GINKGO_ARGS}}

# Provider portability (issue 34): one Service on stock behind gateway-api
# (the reference), stock behind traefik-knative and Lampyr behind
# gateway-api, side by side; reuses the pair if it runs (kept by the main
# job), else creates it, and deletes what it created. Known differences are
# declared in the targets file.
test-provider-portability *GINKGO_ARGS: _inputs-background tools
    just test-portability-targets portability/targets/three-providers.yaml {{GINKGO_ARGS}}

# Knative Eventing on the paired clusters (optional layer, off elsewhere):
# installs Eventing (core, MT channel-based Broker, InMemoryChannel, from the
# pinned knative.dev/eventing module) on stock and Lampyr, makes one
# cluster-local Service the sink of Triggers on a Broker on both, and
# compares what each received: filtered delivery, retries and backoff,
# dead letters, status and addresses, and Lampyr's wake, max-scale burst and
# crash cases (report: _artifacts/eventing/report.md).
test-eventing-portability *GINKGO_ARGS: _inputs-background tools
    @mkdir -p {{artifacts}}/eventing
    LAMPYR_E2E=1 LAMPYR_ARTIFACTS={{artifacts}} go test -v -count=1 -timeout 75m ./portability/eventing/ -ginkgo.timeout=70m -ginkgo.v -ginkgo.junit-report={{artifacts}}/eventing-junit.xml -ginkgo.json-report={{artifacts}}/eventing.json {{GINKGO_ARGS}}
