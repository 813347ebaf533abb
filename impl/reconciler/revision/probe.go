package revision

import (
	"context"
	"net"
	"strconv"
	"sync"
	"time"

	v1 "knative.dev/serving/pkg/apis/serving/v1"

	"lampyr.dev/serving/impl/reconciler/revision/config"
)

// BackendProber tells whether a backend Service's cluster IP answers yet.
// A new Service's cluster IP carries no traffic until kube-proxy (or its
// replacement) has programmed it; a gateway that dials it earlier gets a
// refused or timed-out connection (502). Stock Knative never meets this:
// its Revision is Ready only after its Pods are, which takes longer than
// the programming; a Lampyr Revision can be Ready in a second.
type BackendProber interface {
	Reachable(ctx context.Context, addr string) bool
}

// TCPProber opens (and closes) a TCP connection to the address.
type TCPProber struct{ Timeout time.Duration }

// Reachable implements BackendProber.
func (t TCPProber) Reachable(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: t.Timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	conn.Close()
	return true
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
// Service's cluster IP accepts connections (it leads to fiber-router)
// before the Revision is routable; until then it is looked at again every
// backendProbeInterval.
func (r *Reconciler) probeBackend(ctx context.Context, rev *v1.Revision, p *progress) error {
	if r.prober == nil || p.cfg.BackendStrategy != config.BackendEndpointSlice || !p.serviceReady || !p.sliceReady ||
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
