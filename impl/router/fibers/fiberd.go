package fibers

import (
	"context"
	"errors"
	"net"
	"net/http"
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
	return &FiberdClient{token: token, api: &http.Client{Transport: t, Timeout: 30 * time.Second}, clients: map[string]*client.Client{}}
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
	return Fiber{ID: f.ID, Home: home, StartedAt: f.StartedAt}, nil
}

// Release implements Client.
func (c *FiberdClient) Release(ctx context.Context, f Fiber) error {
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
