package kindcluster

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"sigs.k8s.io/kind/pkg/cluster/nodes"
	"sigs.k8s.io/kind/pkg/cluster/nodeutils"

	"lampyr.dev/serving/clusters/build/nodeimage"
)

// cniConfigPath is where the node image puts the offline CNI's config
// (clusters/inputs: one range, the whole pod subnet, enough for one node).
const cniConfigPath = "/etc/cni/net.d/10-lampyr-ptp.conflist"

// nodeNet is one node's pod range and address, as the API server has them.
type nodeNet struct {
	name    string
	podCIDR netip.Prefix
	ip      netip.Addr
	control bool
}

// podNetwork lays the offline CNI's pod network across a multi-node
// cluster, as kindnetd does where it can be pulled: each node allocates
// from its own spec.podCIDR (the node image's config names the whole pod
// subnet, which two nodes would hand out twice), every node routes every
// other node's range to that node's address, and only traffic leaving
// podSubnet is masqueraded. Pods that started on a
// worker before that (from the shared range) are deleted, so their owners
// make them again with an address of the worker's own range.
func (m *Manager) podNetwork(ctx context.Context, name, podSubnet string) error {
	all, err := m.provider.ListNodes(name)
	if err != nil {
		return err
	}
	cp, err := nodeutils.ControlPlaneNodes(all)
	if err != nil || len(cp) == 0 {
		return fmt.Errorf("no control-plane node in cluster %s: %v", name, err)
	}
	nets, err := nodeNets(ctx, cp[0], len(all))
	if err != nil {
		return err
	}
	byName := map[string]nodes.Node{}
	for _, n := range all {
		byName[n.String()] = n
	}
	for _, nn := range nets {
		n, ok := byName[nn.name]
		if !ok {
			return fmt.Errorf("node %s of cluster %s has no container", nn.name, name)
		}
		if err := nodeutils.WriteFile(n, cniConfigPath, nodeimage.CNIConfigFor(nn.podCIDR.String(), false)); err != nil {
			return fmt.Errorf("node %s: writing its CNI config: %w", nn.name, err)
		}
		// Pods keep their address towards every pod of the cluster (the
		// NetworkPolicy enforcer matches on it); what leaves the pod
		// subnet is masqueraded to the node, as kindnetd does.
		rule := []string{"-t", "nat", "POSTROUTING", "-s", nn.podCIDR.String(), "!", "-d", podSubnet, "-m", "comment", "--comment", "lampyr: pods leaving the cluster", "-j", "MASQUERADE"}
		check := append([]string{"iptables", rule[0], rule[1], "-C"}, rule[2:]...)
		if n.CommandContext(ctx, check[0], check[1:]...).Run() != nil {
			add := append([]string{"iptables", rule[0], rule[1], "-A"}, rule[2:]...)
			if err := n.CommandContext(ctx, add[0], add[1:]...).Run(); err != nil {
				return fmt.Errorf("node %s: masquerading what leaves %s: %w", nn.name, podSubnet, err)
			}
		}
		for _, other := range nets {
			if other.name == nn.name {
				continue
			}
			if err := n.CommandContext(ctx, "ip", "route", "replace", other.podCIDR.String(), "via", other.ip.String()).Run(); err != nil {
				return fmt.Errorf("node %s: routing %s (node %s) via %s: %w", nn.name, other.podCIDR, other.name, other.ip, err)
			}
		}
	}
	for _, nn := range nets {
		if nn.control {
			continue
		}
		if err := deleteEarlyPods(ctx, cp[0], nn.name); err != nil {
			return err
		}
	}
	m.Log.Printf("   pod ranges: %s", describeNets(nets))
	return nil
}

func describeNets(nets []nodeNet) string {
	var parts []string
	for _, n := range nets {
		parts = append(parts, fmt.Sprintf("%s %s via %s", n.name, n.podCIDR, n.ip))
	}
	return strings.Join(parts, ", ")
}

// kubectl runs kubectl inside the control-plane node with its admin
// kubeconfig (kind's own way to reach a cluster from within).
func kubectl(ctx context.Context, cp nodes.Node, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := cp.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig=/etc/kubernetes/admin.conf"}, args...)...)
	cmd.SetStdout(&out)
	cmd.SetStderr(&errb)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// nodeNets waits until every one of want nodes is registered with a pod
// range and an address, and returns them.
func nodeNets(ctx context.Context, cp nodes.Node, want int) ([]nodeNet, error) {
	const tmpl = `{range .items[*]}{.metadata.name}{" "}{.spec.podCIDR}{" "}{.status.addresses[?(@.type=="InternalIP")].address}{"|"}{"\n"}{end}`
	deadline := time.Now().Add(2 * time.Minute)
	last := ""
	for {
		out, err := kubectl(ctx, cp, "get", "nodes", "-o", "jsonpath="+tmpl)
		if err == nil {
			nets, perr := parseNodeNets(out)
			if perr == nil && len(nets) == want {
				for i := range nets {
					nets[i].control = nets[i].name == cp.String()
				}
				return nets, nil
			}
			last = fmt.Sprintf("%d of %d nodes with a pod range and an address (%v): %q", len(nets), want, perr, out)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the nodes' pod ranges: %s", last)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// parseNodeNets reads nodeNets' jsonpath lines: name, podCIDR and address,
// then "|". A line whose node has no range or address yet is skipped.
func parseNodeNets(out string) ([]nodeNet, error) {
	var nets []nodeNet
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		rest, ok := strings.CutSuffix(line, "|")
		if !ok {
			return nil, fmt.Errorf("unexpected line %q", line)
		}
		f := strings.Split(rest, " ")
		if len(f) < 3 || f[1] == "" || f[2] == "" {
			continue
		}
		cidr, err := netip.ParsePrefix(f[1])
		if err != nil {
			return nil, fmt.Errorf("node %s: podCIDR %q: %w", f[0], f[1], err)
		}
		ip, err := netip.ParseAddr(f[2])
		if err != nil {
			return nil, fmt.Errorf("node %s: address %q: %w", f[0], f[2], err)
		}
		nets = append(nets, nodeNet{name: f[0], podCIDR: cidr, ip: ip})
	}
	return nets, nil
}

// deleteEarlyPods deletes the Pods on node that do not use the host's
// network: they got their address from the node image's shared range.
func deleteEarlyPods(ctx context.Context, cp nodes.Node, node string) error {
	out, err := kubectl(ctx, cp, "get", "pods", "-A", "--field-selector=spec.nodeName="+node,
		"-o", `jsonpath={range .items[*]}{.metadata.namespace}{" "}{.metadata.name}{" "}{.spec.hostNetwork}{"\n"}{end}`)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || (len(f) == 3 && f[2] == "true") {
			continue
		}
		if _, err := kubectl(ctx, cp, "delete", "pod", "-n", f[0], f[1], "--wait=false"); err != nil {
			return err
		}
	}
	return nil
}
