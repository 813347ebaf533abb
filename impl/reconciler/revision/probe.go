package revision

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"knative.dev/networking/pkg/http/header"

	v1 "knative.dev/serving/pkg/apis/serving/v1"

	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// BackendProber tells whether a backend Service's cluster IP leads to
// fiber-router yet. A new Service's cluster IP carries no traffic until
// kube-proxy (or its replacement) has programmed it; a gateway that dials it
// earlier gets a refused or timed-out connection (502), or worse: where the
// node routes unknown addresses onward, some other server answers (seen on
// the CI machines: every unprogrammed cluster IP answered "404, Server:
// keryx", and Traefik kept that keep-alive connection for the Revision).
// Stock Knative never meets this: its Revision is Ready only after its Pods
// are, which takes longer than the programming; a Lampyr Revision can be
// Ready in a second.
type BackendProber interface {
	Reachable(ctx context.Context, addr string) bool
}

// HTTPProber sends fiber-router a Knative network probe (K-Network-Probe:
// probe) through the address and accepts only fiber-router's own answer:
// 200 with the probe's K-Network-Hash echoed. A bare TCP connect is not
// enough (see BackendProber).
type HTTPProber struct {
	Client *http.Client
}

// probeHash marks the controller's probes; fiber-router echoes it.
const probeHash = "lampyr-controller-backend-probe"

// Reachable implements BackendProber.
func (h HTTPProber) Reachable(ctx context.Context, addr string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		return false
	}
	req.Header.Set(header.ProbeKey, header.ProbeValue)
	req.Header.Set(header.HashKey, probeHash)
	req.Header.Set(header.UserAgentKey, header.IngressReadinessUserAgent)
	c := h.Client
	if c == nil {
		c = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return resp.StatusCode == http.StatusOK && resp.Header.Get(header.HashKey) == probeHash
}

// backendProbeInterval is how soon a Revision whose backend is not
// reachable yet is looked at again.
const backendProbeInterval = 500 * time.Millisecond

// reachableBackends remembers the cluster IPs that answered, per Revision,
// so a Ready Revision is not probed on every reconcile.
type reachableBackends struct{ m sync.Map }

func (b *reachableBackends) key(rev *v1.Revision, addr string) string {
	return string(rev.UID) + "/" + addr
}

func (b *reachableBackends) forget(rev *v1.Revision) {
	prefix := string(rev.UID) + "/"
	b.m.Range(func(k, _ any) bool {
		if s := k.(string); len(s) >= len(prefix) && s[:len(prefix)] == prefix {
			b.m.Delete(k)
		}
		return true
	})
}

// probeBackend checks, in the endpointslice strategy, that the backend
// Service's cluster IP leads to fiber-router
// before the Revision is routable; until then it is looked at again every
// backendProbeInterval.
func (r *Reconciler) probeBackend(ctx context.Context, rev *v1.Revision, p *progress) error {
	if r.prober == nil || p.cfg.BackendStrategy != lampyrconfig.BackendEndpointSlice || !p.cfg.BackendClusterIPProbe || !p.serviceReady || !p.sliceReady ||
		p.clusterIP == "" || p.clusterIP == "None" {
		return nil
	}
	addr := net.JoinHostPort(p.clusterIP, strconv.Itoa(int(p.servicePort)))
	k := r.reachable.key(rev, addr)
	if _, ok := r.reachable.m.Load(k); ok {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if !r.prober.Reachable(pctx, addr) {
		p.backendUnreachable = addr
		p.requeueAfter = backendProbeInterval
		return nil
	}
	r.reachable.m.Store(k, true)
	return nil
}
