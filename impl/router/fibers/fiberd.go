package fibers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
)

// FiberdClient implements Client with fiberd's own Go client
// (lampyr.dev/serving/impl/fiberd/client), one per Home, sharing one
// connection pool.
type FiberdClient struct {
	// token returns the router's service token (Secret
	// lampyr-system/fiber-router-token). A function, so a rotated Secret is
	// picked up without a restart.
	token func() string
	api   *http.Client

	mu      sync.Mutex
	tok     string
	clients map[string]*client.Client

	// Tunnels (reuse mode): the Home of every fiber this client leased, so
	// a tunnel dial finds it from the request's host alone, and the Homes
	// that turned out to have no tunnel endpoint (an older fiberd).
	tmu      sync.Mutex
	leased   map[string]string
	noTunnel map[string]time.Time // Home -> until when not to ask again
	tunnelRT *tunnelTransport
}

// NewFiberdClient returns a Client for every Home, authenticating with token.
func NewFiberdClient(token func() string) *FiberdClient {
	t := &http.Transport{
		Proxy:       nil, // fiberd is always in-cluster; never follow HTTP_PROXY
		DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		// Fresh mode makes one acquire and one release per request.
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
	c := &FiberdClient{
		token: token, api: &http.Client{Transport: t, Timeout: 30 * time.Second}, clients: map[string]*client.Client{},
		leased: map[string]string{}, noTunnel: map[string]time.Time{},
	}
	c.tunnelRT = newTunnelTransport(c.dialTunnel)
	return c
}

func (c *FiberdClient) home(home string) (*client.Client, error) {
	tok := c.token()
	c.mu.Lock()
	defer c.mu.Unlock()
	if tok != c.tok {
		c.tok, c.clients = tok, map[string]*client.Client{}
	}
	if cl, ok := c.clients[home]; ok {
		return cl, nil
	}
	cl, err := client.New(home, tok)
	if err != nil {
		return nil, err
	}
	cl.HTTP = c.api
	c.clients[home] = cl
	return cl, nil
}

// Acquire implements Client.
func (c *FiberdClient) Acquire(ctx context.Context, home string) (Fiber, error) {
	cl, err := c.home(home)
	if err != nil {
		return Fiber{}, err
	}
	f, err := cl.Acquire(ctx)
	if err != nil {
		var fe *client.Error
		switch {
		case client.IsMaxFibers(err):
			errors.As(err, &fe)
			ra := fe.RetryAfter
			if ra == 0 {
				ra = time.Second
			}
			return Fiber{}, &CapacityError{Home: home, RetryAfter: ra}
		case client.IsUnavailable(err):
			errors.As(err, &fe)
			return Fiber{}, &UnavailableError{Home: home, Reason: fe.Reason + ": " + fe.Message}
		case ctx.Err() != nil:
			return Fiber{}, ctx.Err()
		case !errors.As(err, &fe):
			// Transport error: the Home is down or being replaced.
			return Fiber{}, &UnavailableError{Home: home, Reason: err.Error()}
		}
		return Fiber{}, err
	}
	c.tmu.Lock()
	c.leased[f.ID] = home
	c.tmu.Unlock()
	return Fiber{ID: f.ID, Home: home, StartedAt: f.StartedAt}, nil
}

// Release implements Client.
func (c *FiberdClient) Release(ctx context.Context, f Fiber) error {
	// No new tunnel to it from here on; an open one ends when fiberd kills
	// the fiber.
	c.tmu.Lock()
	delete(c.leased, f.ID)
	c.tmu.Unlock()
	c.tunnelRT.drop(f.ID)
	cl, err := c.home(f.Home)
	if err != nil {
		return err
	}
	return cl.Release(ctx, f.ID)
}

// PrepareProxy implements Client.
func (c *FiberdClient) PrepareProxy(out *http.Request, f Fiber) {
	out.URL.Scheme = "http"
	out.URL.Host = f.Home
	// Set, never Add: a client-supplied Lampyr-Fiber must not pick a fiber,
	// and the router token travels in its own header so the client's
	// Authorization reaches the handler.
	client.SetFiberHeaders(out.Header, f.ID, c.token())
}

// Holds reports whether fiber id was leased through c and not released.
func (c *FiberdClient) Holds(id string) bool {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	_, ok := c.leased[id]
	return ok
}

// TunnelFiberID returns the fiber id of a request prepared by PrepareTunnel.
func TunnelFiberID(req *http.Request) (string, bool) {
	return strings.CutSuffix(req.URL.Hostname(), tunnelHostSuffix)
}

// tunnelHostSuffix ends the URL host of a request prepared by PrepareTunnel:
// "<fiber id>.fiber.lampyr". The tunnel transport keys its connections by
// host, so each fiber has its own, and dials by looking the id up.
const tunnelHostSuffix = ".fiber.lampyr"

// PrepareTunnel implements Tunnels.
func (c *FiberdClient) PrepareTunnel(out *http.Request, f Fiber) {
	out.URL.Scheme = "http"
	out.URL.Host = f.ID + tunnelHostSuffix
	// No fiber headers: nobody between the router and the handler reads them.
}

// TunnelTransport implements Tunnels (tunnel.go).
func (c *FiberdClient) TunnelTransport() http.RoundTripper {
	return c.tunnelRT
}

// noTunnelRetry is how long a Home without the tunnel call is served
// through its proxy before the router tries a tunnel again.
const noTunnelRetry = 5 * time.Minute

// tunnelBusyBudget is how long a tunnel dial retries fiberd's FiberBusy: the
// previous connection to the fiber (after a WebSocket, say) is still being
// torn down.
const tunnelBusyBudget = 2 * time.Second

func (c *FiberdClient) dialTunnel(ctx context.Context, id string) (net.Conn, error) {
	c.tmu.Lock()
	home, leased := c.leased[id]
	no := time.Now().Before(c.noTunnel[home])
	c.tmu.Unlock()
	switch {
	case !leased:
		return nil, fmt.Errorf("tunnel to fiber %q: not a fiber this router holds", id)
	case no:
		return nil, &NoTunnelError{Home: home}
	}
	cl, err := c.home(home)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(tunnelBusyBudget)
	wait := time.Millisecond
	for {
		conn, err := cl.Tunnel(ctx, id)
		var fe *client.Error
		switch {
		case err == nil:
			return conn, nil
		case errors.As(err, &fe) && (fe.Status == http.StatusMethodNotAllowed || fe.Status == http.StatusNotFound && fe.Reason != client.ReasonUnknownFiber):
			// The mux answered, not the tunnel handler: this fiberd
			// predates tunnels. Use the proxy path for its fibers, and ask
			// again later (the Home may be upgraded in place).
			c.tmu.Lock()
			c.noTunnel[home] = time.Now().Add(noTunnelRetry)
			c.tmu.Unlock()
			return nil, &NoTunnelError{Home: home, Cause: err}
		case client.IsFiberBusy(err) && time.Now().Add(wait).Before(deadline):
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			wait = min(2*wait, 50*time.Millisecond)
		default:
			return nil, err
		}
	}
}
