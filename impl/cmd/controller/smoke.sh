#!/usr/bin/env bash
# Smoke test of the controller binary against a real kube-apiserver + etcd
# (no kubelet, no webhook, no garbage collector), as the controller's own
# RBAC identity. It catches what fake clients cannot: invalid label
# selectors, RBAC gaps, CRD validation of the grants we build, API-server
# rules on Service type changes.
#
#   KUBE_APISERVER=/path/kube-apiserver ETCD=/path/etcd \
#   CONTROLLER=/path/controller (go build ./impl/cmd/controller) \
#   [CAPACITYGRANT_CRD=impl/config/crds/capacitygrant.yaml] impl/cmd/controller/smoke.sh
#
# Ports 23790/23800 (etcd) and 16443 (apiserver) on 127.0.0.1. Leaves its
# work dir (logs) in $WORK on failure.
set -euo pipefail

: "${KUBE_APISERVER:?path to kube-apiserver}" "${ETCD:?path to etcd}" "${CONTROLLER:?path to the controller binary}"
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
CRD=${CAPACITYGRANT_CRD:-$ROOT/impl/config/crds/capacitygrant.yaml}
GOMODCACHE=$(go env GOMODCACHE)
SERVING=$GOMODCACHE/knative.dev/serving@v0.50.0/config/core
NETWORKING=$(ls -d "$GOMODCACHE"/knative.dev/networking@v0.0.0-20260727162500-c7a7b772cac9/config)
WORK=$(mktemp -d /tmp/lampyr-smoke.XXXX)
PIDS=()
cleanup() {
  # Newest first (controller, apiserver, etcd): kube-apiserver hangs in
  # shutdown if etcd goes first. Each gets 10s, then SIGKILL, so the ports
  # are free when this script returns.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    p=${PIDS[i]}
    kill "$p" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [[ ${OK:-} == 1 ]]; then rm -rf "$WORK"; else echo "logs kept in $WORK" >&2; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  kubectl --kubeconfig "$WORK/admin.kubeconfig" -n demo get revision,capacitygrants,svc,cm,endpointslices -o yaml >"$WORK/objects.yaml" 2>&1 || true
  [[ -f $WORK/controller.log ]] && tail -20 "$WORK/controller.log" >&2
  exit 1
}
# wait_for DESCRIPTION SECONDS COMMAND...: retry until COMMAND succeeds.
wait_for() {
  local what=$1 secs=$2; shift 2
  for _ in $(seq "$secs"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  fail "timed out after ${secs}s waiting for $what"
}

cd "$WORK"
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
cat >tokens.csv <<'EOF'
admintoken,admin,admin,"system:masters"
controllertoken,system:serviceaccount:lampyr-system:lampyr-controller,ctrl,"system:serviceaccounts,system:serviceaccounts:lampyr-system,system:authenticated"
EOF
for who in admin controller; do
  cat >"$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: smoke, cluster: {server: "https://127.0.0.1:16443", insecure-skip-tls-verify: true}}]
users: [{name: $who, user: {token: ${who}token}}]
contexts: [{name: smoke, context: {cluster: smoke, user: $who}}]
current-context: smoke
EOF
done
K() { kubectl --kubeconfig "$WORK/admin.kubeconfig" "$@"; }

echo "== etcd and kube-apiserver"
"$ETCD" --data-dir "$WORK/etcd" --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster default=http://127.0.0.1:23800 >etcd.log 2>&1 &
PIDS+=($!)
"$KUBE_APISERVER" --etcd-servers http://127.0.0.1:23790 --secure-port 16443 --bind-address 127.0.0.1 \
  --cert-dir "$WORK/certs" --token-auth-file "$WORK/tokens.csv" --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$WORK/sa.pub" \
  --service-account-signing-key-file "$WORK/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
  --enable-priority-and-fairness=false >apiserver.log 2>&1 &
PIDS+=($!)
wait_for "kube-apiserver /readyz" 120 K get --raw /readyz

echo "== Knative CRDs and ConfigMaps, the CapacityGrant CRD, Lampyr controller manifests"
K create namespace knative-serving >/dev/null
for f in "$SERVING"/300-resources/*.yaml "$NETWORKING"/{certificate,domain-claim,ingress,serverlessservice}.yaml; do
  K apply -f "$f" >/dev/null
done
K apply -f "$CRD" >/dev/null || fail "the CapacityGrant CRD $CRD was refused"
for f in "$SERVING"/configmaps/*.yaml "$NETWORKING"/config-network.yaml "$SERVING"/200-roles/addressable-resolvers-clusterrole.yaml; do
  K apply -f "$f" >/dev/null
done
for f in "$ROOT"/impl/config/controller/*.yaml; do
  # The Deployment is replaced by running the binary here.
  [[ $f == */500-controller.yaml ]] && continue
  K apply -f "$f" >/dev/null
done
wait_for "the CapacityGrant CRD to be established" 30 K wait --for condition=Established crd/capacitygrants.fiberd.io --timeout=1s

echo "== controller (as system:serviceaccount:lampyr-system:lampyr-controller)"
SYSTEM_NAMESPACE=knative-serving LAMPYR_NAMESPACE=lampyr-system POD_NAME=smoke \
  CONFIG_LOGGING_NAME=config-logging CONFIG_OBSERVABILITY_NAME=config-observability \
  "$CONTROLLER" --kubeconfig "$WORK/controller.kubeconfig" >controller.log 2>&1 &
PIDS+=($!)
wait_for "the Lampyr Revision reconciler to lead" 60 grep -q 'lampyr.dev.serving.impl.reconciler.revision.reconciler.00-of-01' controller.log

echo "== a plain Service with containerConcurrency: 1 and Lampyr's annotations"
K create namespace demo >/dev/null
K apply -f - >/dev/null <<'EOF'
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: hello, namespace: demo}
spec:
  template:
    metadata:
      annotations:
        lampyr.dev/snapshot-artifact: registry.example/hello-snapshot@sha256:2222222222222222222222222222222222222222222222222222222222222222
        lampyr.dev/fiberd-template: registry.example/lampyr/templates@sha256:3333333333333333333333333333333333333333333333333333333333333333
        autoscaling.knative.dev/max-scale: "3"
    spec:
      containerConcurrency: 1
      containers:
      - image: registry.example/hello@sha256:1111111111111111111111111111111111111111111111111111111111111111
EOF
wait_for "CapacityGrant demo/hello-00001" 60 K -n demo get capacitygrant hello-00001
wait_for "ExternalName Service demo/hello-00001" 30 K -n demo get svc hello-00001
wait_for "router metadata lampyr-system/route.demo.hello-00001" 30 K -n lampyr-system get cm route.demo.hello-00001
[[ $(K -n demo get revision hello-00001 -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}') == WaitingForCapacityGrant ]] ||
  fail "Revision not waiting for its grant"

echo "== the grant controller's part, by hand: admit and ready the Home"
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
gen=$(K -n demo get capacitygrant hello-00001 -o jsonpath='{.metadata.generation}')
K -n demo patch capacitygrant hello-00001 --subresource=status --type=merge -p "{\"status\":{\"observedGeneration\":$gen,
  \"homeEndpoint\":\"hello-00001-0123456789.lampyr-homes.svc:9090\",\"home\":\"hello-00001-0123456789\",\"conditions\":[
  {\"type\":\"Admitted\",\"status\":\"True\",\"reason\":\"Admitted\",\"lastTransitionTime\":\"$now\"},
  {\"type\":\"HomeReady\",\"status\":\"True\",\"lastTransitionTime\":\"$now\"},
  {\"type\":\"Ready\",\"status\":\"True\",\"lastTransitionTime\":\"$now\"}]}}" >/dev/null
wait_for "Revision Ready" 60 K -n demo wait --for condition=Ready revision/hello-00001 --timeout=1s
wait_for "Configuration Ready" 60 K -n demo wait --for condition=Ready configuration/hello --timeout=1s
[[ $(K -n lampyr-system get cm route.demo.hello-00001 -o jsonpath='{.data.ready}') == true ]] || fail "router metadata not ready"
[[ $(K -n demo get ingresses.networking.internal.knative.dev hello -o jsonpath='{.spec.rules[0].http.paths[0].splits[0].serviceName}') == hello-00001 ]] ||
  fail "the Route's KIngress does not target Service hello-00001"

echo "== backend-strategy endpointslice: ClusterIP Service + mirror of fiber-router's ready endpoints"
K apply -f - >/dev/null <<'EOF'
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: fiber-router-smoke, namespace: lampyr-system, labels: {kubernetes.io/service-name: fiber-router}}
addressType: IPv4
endpoints:
- {addresses: ["10.244.0.7"], conditions: {ready: true}}
- {addresses: ["10.244.0.8"], conditions: {ready: false}}
ports: [{name: http, port: 80, protocol: TCP}, {name: http2, port: 81, protocol: TCP}]
EOF
K -n lampyr-system patch cm config-lampyr --type=merge -p '{"data":{"backend-strategy":"endpointslice"}}' >/dev/null
wait_for "Service hello-00001 to become ClusterIP" 60 bash -c "[[ \$(kubectl --kubeconfig $WORK/admin.kubeconfig -n demo get svc hello-00001 -o jsonpath='{.spec.type}') == ClusterIP ]]"
wait_for "the mirror to hold 10.244.0.7 only" 60 bash -c "[[ \$(kubectl --kubeconfig $WORK/admin.kubeconfig -n demo get endpointslice hello-00001 -o jsonpath='{.endpoints[*].addresses[*]}') == 10.244.0.7 ]]"
K -n lampyr-system patch endpointslice fiber-router-smoke --type=json -p '[{"op":"replace","path":"/endpoints/0/addresses/0","value":"10.244.0.9"}]' >/dev/null
wait_for "the mirror to follow fiber-router to 10.244.0.9" 60 bash -c "[[ \$(kubectl --kubeconfig $WORK/admin.kubeconfig -n demo get endpointslice hello-00001 -o jsonpath='{.endpoints[*].addresses[*]}') == 10.244.0.9 ]]"
K -n lampyr-system patch cm config-lampyr --type=merge -p '{"data":{"backend-strategy":"externalname"}}' >/dev/null
wait_for "Service hello-00001 back to ExternalName" 60 bash -c "[[ \$(kubectl --kubeconfig $WORK/admin.kubeconfig -n demo get svc hello-00001 -o jsonpath='{.spec.type}') == ExternalName ]]"
wait_for "the mirror to be deleted" 60 bash -c "! kubectl --kubeconfig $WORK/admin.kubeconfig -n demo get endpointslice hello-00001"

echo "== finalization (no garbage collector here, so delete the Configuration first)"
uid=$(K -n demo get revision hello-00001 -o jsonpath='{.metadata.uid}')
K -n demo delete ksvc hello --wait=false >/dev/null
K -n demo delete configuration hello --wait=false >/dev/null
K -n demo delete route hello --wait=false >/dev/null
K -n demo delete revision hello-00001 --wait=false >/dev/null
wait_for "Revision hello-00001 to be finalized" 60 bash -c "! kubectl --kubeconfig $WORK/admin.kubeconfig -n demo get revision hello-00001"
for obj in capacitygrant/hello-00001 svc/hello-00001; do
  K -n demo get "$obj" >/dev/null 2>&1 && fail "$obj survived finalization of Revision $uid"
done
K -n lampyr-system get cm route.demo.hello-00001 >/dev/null 2>&1 && fail "router metadata lampyr-system/route.demo.hello-00001 survived finalization of Revision $uid"
if grep -q '"severity":"ERROR"' controller.log; then
  grep '"severity":"ERROR"' controller.log | head -5 >&2
  fail "the controller logged errors"
fi
OK=1
echo "PASS"
