package grant

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// clusterRanges finds what fibers' egress defaults to (docs/networking.md,
// "Service bindings"): the cluster's Service CIDRs (networking.k8s.io/v1
// ServiceCIDR objects) to allow, and the Kubernetes API's ClusterIPs
// (Service default/kubernetes) to deny. Found once; a failure is retried
// at most every minute, and until then Homes run without egress.
type clusterRanges struct {
	kube kubernetes.Interface

	mu          sync.Mutex
	allow, deny []netip.Prefix
	found       bool
	tried       time.Time
	err         error
}

func (c *clusterRanges) get(ctx context.Context) (allow, deny []netip.Prefix, fresh bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.found || time.Since(c.tried) < time.Minute {
		return c.allow, c.deny, false, c.err
	}
	allow, deny, err = c.find(ctx)
	return allow, deny, true, err
}

func (c *clusterRanges) find(ctx context.Context) (allow, deny []netip.Prefix, err error) {
	c.tried = time.Now()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c.allow, c.deny, c.err = nil, nil, nil
	cidrs, err := c.kube.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		c.err = fmt.Errorf("listing ServiceCIDRs (set %s in %s to name the ranges yourself): %w", lampyrconfig.KeyFiberEgressAllowCIDRs, contract.ConfigMapName, err)
		return nil, nil, c.err
	}
	for _, sc := range cidrs.Items {
		for _, s := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				c.allow = append(c.allow, p.Masked())
			}
		}
	}
	if len(c.allow) == 0 {
		c.err = fmt.Errorf("the cluster has no ServiceCIDR objects; set %s in %s", lampyrconfig.KeyFiberEgressAllowCIDRs, contract.ConfigMapName)
		return nil, nil, c.err
	}
	api, err := c.kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		c.err = fmt.Errorf("reading Service default/kubernetes (its ClusterIPs are denied to fibers): %w", err)
		c.allow = nil
		return nil, nil, c.err
	}
	ips := api.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{api.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil {
			c.deny = append(c.deny, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	c.found = true
	return c.allow, c.deny, nil
}

// withEgressDefaults fills the fibers' egress ranges the ConfigMap left to
// the cluster. Without them the Homes run with egress off (logged).
func (c *clusterRanges) withEgressDefaults(ctx context.Context, cfg *lampyrconfig.Config, logf func(string, ...any)) {
	if cfg.Egress != lampyrconfig.EgressCluster && cfg.Egress != lampyrconfig.EgressDirect {
		return
	}
	allow, deny, fresh, err := c.get(ctx)
	if err != nil {
		if fresh { // once a minute at most
			logf("fiber egress off until this is fixed: %v", err)
		}
		if len(cfg.EgressAllow) == 0 {
			return
		}
	}
	if len(cfg.EgressAllow) == 0 {
		cfg.EgressAllow = allow
	}
	cfg.EgressDeny = append(append([]netip.Prefix(nil), cfg.EgressDeny...), deny...)
}
