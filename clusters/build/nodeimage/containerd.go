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
func CNIConfig(podSubnet string) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "lampyr-ptp",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": true,
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
`, podSubnet)
}

// ImportUnit imports the preloaded images into containerd's k8s.io namespace
// before kubelet starts, and pins them so kubelet's image GC never removes
// them (ctr 1.6 import has no --label flag).
const ImportUnit = `[Unit]
Description=Lampyr: import preloaded images into containerd
After=containerd.service
Requires=containerd.service
Before=kubelet.service
ConditionPathExistsGlob=/kind/images/*.tar

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/kind/bin/lampyr-import-images.sh

[Install]
WantedBy=multi-user.target
`

// ImportScript is run by ImportUnit.
const ImportScript = `#!/bin/bash
set -euo pipefail
for i in $(seq 1 30); do ctr version >/dev/null 2>&1 && break; sleep 0.5; done
for f in /kind/images/*.tar; do
  ctr --namespace=k8s.io images import --all-platforms "$f" >/dev/null
done
ctr --namespace=k8s.io images list -q | while read -r ref; do
  ctr --namespace=k8s.io images label "$ref" io.cri-containerd.pinned=pinned >/dev/null
done
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
