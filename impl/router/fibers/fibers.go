// Package fibers is fiber-router's view of the fiberd API (docs/contracts.md
// §4): acquire a never-used fiber, run a request inside it, release it.
//
// The router depends only on the Client interface so the HTTP implementation
// can be swapped for fiberd's own client package without touching the proxy
// or the pool.
package fibers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
)

// FiberHeader names the fiber a proxied request must run in. fiberd removes it
// before the handler sees the request.
const FiberHeader = client.FiberHeader

// Home is one Home's fiberd as the router reaches it, from the Revision's
// router metadata.
type Home struct {
	// Endpoint is host:port of its fiberd API (metadata homeEndpoint).
	Endpoint string
	// Name is the Home's name in the Homes namespace (metadata home). fiberd
	// accepts only credentials minted for its own name, so the router needs
	// it to be let in at all (docs/security.md §3).
	Name string
	// KeySHA256 is the fingerprint of the Home's TLS key (metadata
	// homeKeySHA256; impl/trust/homekey): the router dials the Home over
	// TLS and accepts no other key. Empty for a Home of a version before
	// Home keys, dialled in clear only when the router is told to.
	KeySHA256 string
}

// String is the endpoint: what logs and errors about a Home need, and what
// they said before Homes had names.
func (h Home) String() string { return h.Endpoint }

// Fiber is one leased sandbox in one Home.
type Fiber struct {
	ID string
	// Home is the fiberd that owns the fiber; a fiber is only ever addressed
	// through the Home that created it, with that Home's credential.
	Home      Home
	StartedAt time.Time
	// InFiberd is how long fiberd took to answer the acquisition (its
	// own account, client.Fiber.AcquireMicros): the lease's round trip
	// minus the way to the Home and back. 0: fiberd did not say.
	InFiberd time.Duration
}

// Client talks to fiberd in any Home.
type Client interface {
	// Acquire leases a never-used fiber from home.
	Acquire(ctx context.Context, home Home) (Fiber, error)
	// Release kills the fiber and destroys its sandbox. Releasing a fiber
	// fiberd no longer knows is not an error: the goal state is reached.
	Release(ctx context.Context, f Fiber) error
	// PrepareProxy turns out, an outbound copy of a client request whose URL
	// path and query are already set, into a request fiberd runs inside f.
	PrepareProxy(out *http.Request, f Fiber)
}

// Tunnels is implemented by a Client that can carry a reuse-mode fiber's
// requests over a byte tunnel through its Home (fiberd's
// POST /v1/fibers/{id}/tunnel) instead of having fiberd parse and proxy each
// one. The router still enforces one request at a time per fiber and each
// request's timeout; fiberd holds the fiber for the tunnel's life.
type Tunnels interface {
	// PrepareTunnel turns out, an outbound copy of a client request whose
	// URL path and query are already set, into a request for f's tunnel.
	PrepareTunnel(out *http.Request, f Fiber)
	// TunnelTransport carries requests prepared by PrepareTunnel. A Home
	// without tunnel support fails the request with a *NoTunnelError before
	// anything is sent, so the caller can use the proxy path instead.
	TunnelTransport() http.RoundTripper
}

// ProxyTransports is implemented by a Client whose Homes are each reached
// over connections of their own (TLS pinned to each Home's key): the proxy
// sends a fiber's requests, prepared by PrepareProxy, through the transport
// ProxyTransport gives for it (HTTP/2 when h2, else HTTP/1.1). Its error
// says why the fiber's Home cannot be reached at all.
type ProxyTransports interface {
	ProxyTransport(f Fiber, h2 bool) (http.RoundTripper, error)
}

// Forgetter is implemented by a Client that keeps per-Home state (a client
// and a credential). Forget drops it once no Revision uses home any more, so
// a long-lived router does not keep state for every Home it ever served; a
// later call for home simply builds it again.
type Forgetter interface {
	Forget(home Home)
}

// NoTunnelError says a Home has no tunnel endpoint (a fiberd older than the
// router); its fibers are reached through the proxy path.
type NoTunnelError struct {
	Home  Home
	Cause error
}

func (e *NoTunnelError) Error() string {
	if e.Cause == nil {
		return fmt.Sprintf("fiberd %s has no tunnel endpoint", e.Home)
	}
	return fmt.Sprintf("fiberd %s has no tunnel endpoint: %v", e.Home, e.Cause)
}

// CapacityError is fiberd's 429: the grant's maxFibers are all live.
type CapacityError struct {
	Home       Home
	RetryAfter time.Duration
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("fiberd %s: at maxFibers (retry after %s)", e.Home, e.RetryAfter)
}

// UnavailableError is fiberd's 503: the Home's grant is missing or expired,
// or the Home cannot be reached at all.
type UnavailableError struct {
	Home   Home
	Reason string
	// Err is the cause when there is one (a transport error, a Home that
	// did not prove its key), for errors.Is.
	Err error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("fiberd %s unavailable: %s", e.Home, e.Reason)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// IsCapacity reports whether err is a CapacityError and returns it.
func IsCapacity(err error) (*CapacityError, bool) {
	var ce *CapacityError
	ok := errors.As(err, &ce)
	return ce, ok
}
