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

// Fiber is one leased sandbox in one Home.
type Fiber struct {
	ID string
	// Home is host:port of the fiberd API that owns the fiber; a fiber is only
	// ever addressed through the Home that created it.
	Home      string
	StartedAt time.Time
}

// Client talks to fiberd in any Home.
type Client interface {
	// Acquire leases a never-used fiber from the Home at home.
	Acquire(ctx context.Context, home string) (Fiber, error)
	// Release kills the fiber and destroys its sandbox. Releasing a fiber
	// fiberd no longer knows is not an error: the goal state is reached.
	Release(ctx context.Context, f Fiber) error
	// PrepareProxy turns out, an outbound copy of a client request whose URL
	// path and query are already set, into a request fiberd runs inside f.
	PrepareProxy(out *http.Request, f Fiber)
}

// CapacityError is fiberd's 429: the grant's maxFibers are all live.
type CapacityError struct {
	Home       string
	RetryAfter time.Duration
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("fiberd %s: at maxFibers (retry after %s)", e.Home, e.RetryAfter)
}

// UnavailableError is fiberd's 503: the Home's grant is missing or expired,
// or the Home cannot be reached at all.
type UnavailableError struct {
	Home   string
	Reason string
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("fiberd %s unavailable: %s", e.Home, e.Reason)
}

// IsCapacity reports whether err is a CapacityError and returns it.
func IsCapacity(err error) (*CapacityError, bool) {
	var ce *CapacityError
	ok := errors.As(err, &ce)
	return ce, ok
}
