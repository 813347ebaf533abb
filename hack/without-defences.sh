#!/usr/bin/env bash
# Each tenancy guard-rail row (conformance/tenancy, G1-G8) fails when its
# defence is removed: this runs the rows against a Lampyr built with the
# defences taken out, and checks that every row fails because its attack
# succeeded (not because it could not be carried out).
#
#   hack/without-defences.sh [SET|ROW...]     (default: every set)
#
# Each row runs in a suite run of its own (a row that fails keeps its
# namespaces and their Homes until its run's finish step, which would
# take the next row's capacity); a ROW (G6) runs that row alone.
#
# Sets (docs/security.md, "Each guard-rail defence removed once"):
#   shared      shared.patch: one egress Pod for every namespace (the first
#               to ask), reached by every Home, serving any namespace's
#               grant (G2b; G2a runs first in the same run so that A asks
#               first, and is not judged)
#   code        conformance/tenancy/testdata/without-defences/code.patch:
#               no quota Pod (G1a, G1b), egress from the Home (G2a, G2c),
#               no per-namespace router bound (G5), no Home-wide pids bound
#               (G6), a resolver that checks only the name asked (G8)
#   capacity    capacity.patch: capacity booked before the template and the
#               snapshot are read (G3)
#   tarpit      tarpit.patch: one grant worker reading templates inline (G4;
#               runs LAMPYR_TENANCY_TARPIT_DURATION, default 15m)
#   externalips the Lampyr cluster's kube-apiserver without
#               DenyServiceExternalIPs (G7), put back afterwards
#
# It reuses the stock/lampyr pair (creating it if missing), installs each
# patched Lampyr from a git worktree of HEAD, and at the end installs this
# checkout's Lampyr again. Reports: _artifacts/without-defences/ROW/.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
art="${LAMPYR_ARTIFACTS:-$root/_artifacts}/without-defences"
patches="$root/conformance/tenancy/testdata/without-defences"
node="${LAMPYR_CLUSTER_NAME:-lampyr}-control-plane"
export CGO_ENABLED=0 LAMPYR_E2E=1
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(code shared capacity tarpit externalips)

# rows_of names a set's rows; set_of names a row's set.
rows_of() {
	case "$1" in
	code) echo G1a G1b G2a G2c G5 G6 G8 ;;
	shared) echo G2b ;;
	capacity) echo G3 ;;
	tarpit) echo G4 ;;
	externalips) echo G7 ;;
	G*) echo "$1" ;;
	*) echo "unknown set or row $1 (want code, capacity, tarpit, externalips or a row such as G6)" >&2; return 1 ;;
	esac
}
set_of() {
	case "$1" in
	G2b) echo shared ;;
	G3) echo capacity ;;
	G4) echo tarpit ;;
	G7) echo externalips ;;
	G1a | G1b | G2a | G2c | G5 | G6 | G8) echo code ;;
	*) echo "no defence of row $1 is removed here (rows: G1a G1b G2a G2b G2c G3 G4 G5 G6 G7 G8)" >&2; return 1 ;;
	esac
}
rows=()
for s in "${sets[@]}"; do
	for r in $(rows_of "$s"); do
		set_of "$r" >/dev/null
		rows+=("$r")
	done
done

go run ./clusters/cmd/lampyr-clusters up stock lampyr

# apiserver_plugins SED waits until the Lampyr node's kube-apiserver runs
# with its admission plugins edited by SED.
apiserver_plugins() {
	docker exec "$node" sed -i "$1" /etc/kubernetes/manifests/kube-apiserver.yaml
	local want
	want=$(docker exec "$node" grep -o -- '--enable-admission-plugins=[^" ]*' /etc/kubernetes/manifests/kube-apiserver.yaml)
	for _ in $(seq 1 120); do
		if docker exec "$node" sh -c "ps -eo args | grep -q -- '^kube-apiserver .*$want\( \|\$\)'" &&
			docker exec "$node" kubectl --kubeconfig /etc/kubernetes/admin.conf get --raw /readyz >/dev/null 2>&1; then
			echo "kube-apiserver on $node runs with $want"
			sleep 10 # the controllers' watches reconnect
			return 0
		fi
		sleep 2
	done
	echo "kube-apiserver on $node did not come back with $want within 4 minutes" >&2
	return 1
}

status=0
for r in "${rows[@]}"; do
	s=$(set_of "$r")
	out="$art/$r"
	rm -rf "$out"
	mkdir -p "$out"
	dir="$root"
	case "$s" in
	externalips)
		apiserver_plugins 's/NodeRestriction,DenyServiceExternalIPs/NodeRestriction/'
		trap "apiserver_plugins 's/=NodeRestriction\\([\" ]\\|\$\\)/=NodeRestriction,DenyServiceExternalIPs\\1/'" EXIT
		;;
	*)
		dir=$(mktemp -d /tmp/lampyr-without-defences.XXXXXX)
		git worktree add -q --detach "$dir" HEAD
		git -C "$dir" apply "$patches/$s.patch"
		;;
	esac
	focus="$r"
	[ "$r" = G2b ] && focus="(G2a|G2b)"
	echo "== $r ($s removed; log: $out/tenancy.log)"
	start=$(date +%s)
	(cd "$dir" && LAMPYR_ARTIFACTS="$out" go test -v -count=1 -timeout 150m ./conformance/tenancy/ -ginkgo.v \
		-ginkgo.focus="tenant guard rails $focus " -ginkgo.junit-report="$out/tenancy-junit.xml") >"$out/tenancy.log" 2>&1 || true
	echo "== $r: $(($(date +%s) - start)) s"
	go run ./hack/without-defences "$out/tenancy-junit.xml" "$r" | tee "$out/verdict.txt" || status=1
	if [ "$s" = externalips ]; then
		apiserver_plugins 's/=NodeRestriction\([" ]\|$\)/=NodeRestriction,DenyServiceExternalIPs\1/'
		trap - EXIT
	else
		git worktree remove --force "$dir"
	fi
done

echo "== putting this checkout's Lampyr back on the clusters"
go run ./clusters/cmd/lampyr-clusters up stock lampyr
exit $status
