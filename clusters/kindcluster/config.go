// Package kindcluster creates, reuses and deletes named Kind clusters in
// parallel through the sigs.k8s.io/kind library, wires them to the shared
// local registry, loads images into them and exports their logs.
package kindcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// PortMapping publishes a node port on the host, on 127.0.0.1 only.
type PortMapping struct {
	// NodePort is the port inside the node (a Service NodePort).
	NodePort int `json:"nodePort"`
	// HostPort is the port on 127.0.0.1; 0 picks a free one at creation.
	HostPort int `json:"hostPort"`
}

// Spec describes one cluster.
type Spec struct {
	Name      string `json:"name"`
	NodeImage string `json:"nodeImage"`
	// Ports are published on 127.0.0.1 (gateway NodePorts).
	Ports []PortMapping `json:"ports,omitempty"`
	// CgroupV1 sets failCgroupV1: false, without which kubelet 1.35 refuses
	// to start on a cgroup v1 host.
	CgroupV1 bool `json:"cgroupV1,omitempty"`
	// DisableDefaultCNI is set for offline node images (kindnetd cannot be
	// pulled; the node ships its own CNI config).
	DisableDefaultCNI bool   `json:"disableDefaultCNI,omitempty"`
	PodSubnet         string `json:"podSubnet,omitempty"`
	// ServiceSubnet is the Service CIDR; the NetworkPolicy enforcer is
	// told the same range, so it is set explicitly rather than left to
	// kind's default.
	ServiceSubnet string `json:"serviceSubnet,omitempty"`
	// EtcdOnTmpfs keeps etcd's data in the node's /tmp (a tmpfs in every
	// Kind node), the speed-up kind's own docs suggest for CI: etcd's
	// fsyncs no longer contend for the disk. The price: a node container
	// that restarts (host reboot, `docker restart`) comes back with an
	// empty etcd, so such a cluster must be recreated.
	EtcdOnTmpfs bool `json:"etcdOnTmpfs,omitempty"`
	// Workers adds that many worker nodes beside the control plane (0: the
	// single-node cluster every suite uses by default). The offline CNI
	// (ptp) then gets each node's own pod range and a route to every other
	// node's (podnet.go), as kindnetd would give them.
	Workers int `json:"workers,omitempty"`
	// MaxPods is kubelet's maxPods on every node (0: kubelet's default,
	// 110). A Lampyr Revision keeps a Home Pod while idle, so a node that
	// is to hold a few hundred idle Revisions needs more than 110.
	MaxPods int `json:"maxPods,omitempty"`
}

// APIServerAdmissionPlugins are the admission plugins every cluster's
// kube-apiserver enables beyond those on by default: kubeadm's own
// NodeRestriction (naming the flag replaces kubeadm's value, so it is
// repeated) and DenyServiceExternalIPs, which refuses any Service that sets
// spec.externalIPs (CVE-2020-8554: with namespace edit a tenant could
// otherwise have kube-proxy send every Pod's traffic for an IP:port, a
// Home's or fiber-router's, to a Pod of its own; docs/security.md §5).
const APIServerAdmissionPlugins = "NodeRestriction,DenyServiceExternalIPs"

// Validate names the field that is wrong and how to fix it.
func (s Spec) Validate() error {
	if s.Name == "" || strings.ToLower(s.Name) != s.Name || strings.ContainsAny(s.Name, " _/.:") {
		return fmt.Errorf("cluster name %q: use lower-case letters, digits and '-'", s.Name)
	}
	if s.Workers < 0 || s.Workers > 8 {
		return fmt.Errorf("cluster %s: workers %d: want 0 (a single node) to 8", s.Name, s.Workers)
	}
	if s.Workers > 0 && !s.DisableDefaultCNI {
		return fmt.Errorf("cluster %s: workers need the offline CNI (disableDefaultCNI), whose pod network podnet.go lays across the nodes", s.Name)
	}
	if s.NodeImage == "" {
		return fmt.Errorf("cluster %s: nodeImage is empty: build it with `just cluster-inputs`", s.Name)
	}
	seen := map[int]bool{}
	for _, p := range s.Ports {
		if p.NodePort < 30000 || p.NodePort > 32767 {
			return fmt.Errorf("cluster %s: ports.nodePort %d is outside the NodePort range 30000-32767", s.Name, p.NodePort)
		}
		if p.HostPort != 0 && seen[p.HostPort] {
			return fmt.Errorf("cluster %s: ports.hostPort %d is used twice", s.Name, p.HostPort)
		}
		seen[p.HostPort] = true
	}
	return nil
}

// KindConfig renders the kind v1alpha4 Cluster config for s. Host ports must
// be resolved (non-zero) by then.
func (s Spec) KindConfig() ([]byte, error) {
	type portMapping struct {
		ContainerPort int    `json:"containerPort"`
		HostPort      int    `json:"hostPort"`
		ListenAddress string `json:"listenAddress"`
		Protocol      string `json:"protocol"`
	}
	type node struct {
		Role              string        `json:"role"`
		ExtraPortMappings []portMapping `json:"extraPortMappings,omitempty"`
	}
	type patchJSON6902 struct {
		Group   string `json:"group"`
		Version string `json:"version"`
		Kind    string `json:"kind"`
		Patch   string `json:"patch"`
	}
	type networking struct {
		APIServerAddress  string `json:"apiServerAddress"`
		DisableDefaultCNI bool   `json:"disableDefaultCNI,omitempty"`
		PodSubnet         string `json:"podSubnet,omitempty"`
		ServiceSubnet     string `json:"serviceSubnet,omitempty"`
	}
	cfg := struct {
		Kind                 string     `json:"kind"`
		APIVersion           string     `json:"apiVersion"`
		Networking           networking `json:"networking"`
		Nodes                []node     `json:"nodes"`
		KubeadmConfigPatches []string   `json:"kubeadmConfigPatches,omitempty"`
		// JSON 6902 patches (kind applies each only to the kubeadm
		// config of its group/version/kind), because a merge patch would
		// replace kubeadm v1beta4's extraArgs list, and v1beta3's
		// extraArgs is a map: one patch per version kind may render
		// (v1beta3 up to Kubernetes 1.35, v1beta4 from 1.36).
		KubeadmConfigPatchesJSON6902 []patchJSON6902 `json:"kubeadmConfigPatchesJSON6902,omitempty"`
	}{
		Kind:       "Cluster",
		APIVersion: "kind.x-k8s.io/v1alpha4",
		Networking: networking{APIServerAddress: "127.0.0.1", DisableDefaultCNI: s.DisableDefaultCNI, PodSubnet: s.PodSubnet, ServiceSubnet: s.ServiceSubnet},
	}
	n := node{Role: "control-plane"}
	for _, p := range s.Ports {
		if p.HostPort == 0 {
			return nil, fmt.Errorf("cluster %s: host port for node port %d not resolved", s.Name, p.NodePort)
		}
		n.ExtraPortMappings = append(n.ExtraPortMappings, portMapping{ContainerPort: p.NodePort, HostPort: p.HostPort, ListenAddress: "127.0.0.1", Protocol: "TCP"})
	}
	cfg.Nodes = []node{n}
	for range s.Workers {
		cfg.Nodes = append(cfg.Nodes, node{Role: "worker"})
	}
	// One KubeletConfiguration patch for every kubelet setting.
	kubelet := ""
	if s.CgroupV1 {
		kubelet += "failCgroupV1: false\n"
	}
	if s.MaxPods > 0 {
		kubelet += fmt.Sprintf("maxPods: %d\n", s.MaxPods)
	}
	if kubelet != "" {
		cfg.KubeadmConfigPatches = append(cfg.KubeadmConfigPatches, "kind: KubeletConfiguration\n"+kubelet)
	}
	cfg.KubeadmConfigPatchesJSON6902 = []patchJSON6902{{
		Group: "kubeadm.k8s.io", Version: "v1beta3", Kind: "ClusterConfiguration",
		Patch: "- op: add\n  path: /apiServer/extraArgs/enable-admission-plugins\n  value: " + APIServerAdmissionPlugins + "\n",
	}, {
		Group: "kubeadm.k8s.io", Version: "v1beta4", Kind: "ClusterConfiguration",
		Patch: "- op: add\n  path: /apiServer/extraArgs/-\n  value: {name: enable-admission-plugins, value: \"" + APIServerAdmissionPlugins + "\"}\n",
	}}
	if s.EtcdOnTmpfs {
		cfg.KubeadmConfigPatches = append(cfg.KubeadmConfigPatches, "kind: ClusterConfiguration\netcd:\n  local:\n    dataDir: /tmp/lampyr-etcd\n")
	}
	return yaml.Marshal(cfg)
}

// Hash identifies the configuration, so an existing cluster is reused only
// when it was created from the same spec.
func (s Spec) Hash() string {
	// What every cluster gets beyond its spec counts too: a cluster made
	// before DenyServiceExternalIPs is not silently reused.
	b, _ := yaml.Marshal(struct {
		Spec      `json:",inline"`
		Admission string `json:"admission"`
	}{s, APIServerAdmissionPlugins})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])[:16]
}
