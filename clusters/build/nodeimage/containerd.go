package nodeimage

import (
	"fmt"
	"regexp"
	"strings"
)

var sandboxImageRE = regexp.MustCompile(`(?m)^(\s*sandbox_image\s*=\s*)"[^"]*"`)
var restrictOOMRE = regexp.MustCompile(`(?m)^(\s*restrict_oom_score_adj\s*=\s*)false`)

// PatchContainerdConfig applies the node-image patches to kind's containerd
// config (images/base/files/etc/containerd/config.toml), each needed and
// verified on the machines this project targets:
//
//   - sandbox_image: kind names pause:3.10, kubeadm 1.35 wants pause:3.10.1;
//     with the wrong one the node would try to pull it.
//   - restrict_oom_score_adj: runc in a Kind node inside these VMs cannot set
//     a negative oom_score_adj (no CAP_SYS_RESOURCE), so containerd must
//     clamp it instead of failing every container.
//   - registry config_path: the certs.d hosts convention of Kind's
//     local-registry documentation, so each cluster can mirror localhost:5002.
func PatchContainerdConfig(config, pauseImage string, restrictOOM bool) (string, error) {
	if !sandboxImageRE.MatchString(config) {
		return "", fmt.Errorf("kind's containerd config has no sandbox_image line to patch")
	}
	out := sandboxImageRE.ReplaceAllString(config, fmt.Sprintf(`${1}%q`, pauseImage))
	if restrictOOM {
		if !restrictOOMRE.MatchString(out) {
			return "", fmt.Errorf("kind's containerd config has no restrict_oom_score_adj = false line to patch")
		}
		out = restrictOOMRE.ReplaceAllString(out, "${1}true")
	}
	if !strings.Contains(out, `config_path = "/etc/containerd/certs.d"`) {
		out += "\n# Lampyr: per-registry hosts files (Kind local-registry convention)\n" +
			"[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n"
	}
	return out, nil
}

// CNIConfig is the offline CNI: kindnetd cannot be pulled, and single-node
// clusters need only a point-to-point veth per pod with host-local IPAM and
// portmap for hostPort.
func CNIConfig(podSubnet string) string { return CNIConfigFor(podSubnet, true) }

// CNIConfigFor is the offline CNI for one node's pod range. ipMasq makes
// ptp masquerade what leaves that range; on a node of a multi-node
// cluster it is off, because traffic to another node's pods must keep its
// Pod address (NetworkPolicies match on it), and the node masquerades
// only what leaves the cluster's pod subnet instead (kindcluster's
// podNetwork, as kindnetd does).
func CNIConfigFor(podRange string, ipMasq bool) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "lampyr-ptp",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": %v,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, ipMasq, podRange)
}

// PreloadStartScript starts containerd in a node build container (not
// booted: no systemd) and waits until it answers, as kind's node-image
// build does.
const PreloadStartScript = `set -e
nohup containerd >/var/log/containerd-build.log 2>&1 &
for i in $(seq 1 50); do
  if [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1; then exit 0; fi
  sleep 0.1
done
echo "containerd did not answer within 5s:" >&2
tail -20 /var/log/containerd-build.log >&2
exit 1
`

// PreloadFinishScript pins every preloaded image so kubelet's image GC never
// removes it (ctr 1.6's import has no --label flag) and removes the build
// log.
const PreloadFinishScript = `set -e
ctr --namespace=k8s.io images list -q | while read -r ref; do
  ctr --namespace=k8s.io images label "$ref" io.cri-containerd.pinned=pinned >/dev/null
done
rm -f /var/log/containerd-build.log
`

// PreloadStopScript stops the build container's containerd and waits for
// it to exit (it stays a zombie: the container's PID 1 is sleep, which
// reaps nothing, so only live processes count).
const PreloadStopScript = `pkill containerd || true
for i in $(seq 1 100); do
  ps -C containerd -o stat= | grep -qv '^Z' || exit 0
  sleep 0.1
done
echo "containerd did not exit within 10s" >&2
exit 1
`

// DefaultStorageManifest is the StorageClass kind applies; the node ships no
// provisioner (its image cannot be pulled offline), so this is kind's own
// legacy fallback written out to avoid its warning.
const DefaultStorageManifest = `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
`
