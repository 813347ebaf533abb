package fibers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/trust/homekey"
)

// Credentials mints the credential the router presents to one Home, by the
// Home's name (routercred.Minter; docs/security.md §3).
type Credentials interface {
	// For returns a credential valid now for home. It is asked on every
	// call: credentials are short-lived and re-minted as they age.
	For(home string) (string, error)
	// Forget drops what is cached for home.
	Forget(home string)
}

// FiberdClient implements Client with fiberd's own Go client
// (lampyr.dev/serving/impl/fiberd/client), one per Home. Every call carries
// a credential minted for the Home it goes to, so a Home never sees a
// credential that would let it into another; and every connection to a
// Home is TLS that accepts only the key its router metadata names
// (homeKeySHA256), so whatever else answers at the Home's address (a
// Service's externalIPs, a reused Pod IP) completes no handshake and is
// sent neither a credential nor a request (docs/security.md §3).
type FiberdClient struct {
	creds Credentials
	// AllowUnauthenticatedHomes lets the router dial, in clear, a Home
	// whose metadata names no key: a Home of a Lampyr version before Home
	// keys, during an upgrade. Off, such a Home is refused (503, logged)
	// and sent nothing. Set before the first call.
	AllowUnauthenticatedHomes bool
	// plain carries calls to unauthenticated Homes, as before Home keys.
	plain *homeConns

	mu    sync.Mutex
	homes map[Home]homeClient
	names map[string]int // Home name -> entries in homes with that name

	// Tunnels (reuse mode): the Home of every fiber this client leased, so
	// a tunnel dial finds it from the request's host alone, and the Homes
	// that turned out to have no tunnel endpoint (an older fiberd).
	tmu      sync.Mutex
	leased   map[string]Home
	noTunnel map[Home]time.Time // until when not to ask again
	tunnelRT *tunnelTransport
}

// homeClient is a fiberd client bound to the credential it was made with,
// and the connections to its Home. client.Client holds its token for its
// life, so a re-minted credential means a new client (a parsed URL; the
// connections stay).
type homeClient struct {
	cred  string
	c     *client.Client
	conns *homeConns
}

// homeConns are the transports to one Home: HTTP/1.1 (API calls, proxied
// HTTP/1.1 requests, WebSockets) and HTTP/2 (gRPC), both pinned to the
// Home's key, and the TLS configuration of its tunnels. A Home's key is
// part of its identity (Home is the map key), so a connection made for one
// key never carries a request meant for another.
type homeConns struct {
	scheme string
	h1, h2 *http.Transport
	api    *http.Client
	tunnel *tls.Config // nil: in clear
}

func (hc *homeConns) closeIdle() {
	hc.h1.CloseIdleConnections()
	hc.h2.CloseIdleConnections()
}

// newTransport is the router's transport to fiberd: the proxy path's
// settings, which API calls share.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil, // fiberd is always in-cluster; never follow HTTP_PROXY
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		// Fresh mode makes one acquire, one proxied request and one
		// release per request.
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		// Bodies pass through untouched; the handler owns compression.
		DisableCompression: true,
		// As Knative's transports (http.DefaultTransport's value): the body
		// of an "Expect: 100-continue" request goes once fiberd (and so the
		// handler) asks for it, and the client sees the handler's 100
		// Continue, or none if it answers without reading, as on stock.
		ExpectContinueTimeout: time.Second,
	}
}

func newConns(h1, h2 *http.Transport, scheme string, tunnel *tls.Config) *homeConns {
	return &homeConns{scheme: scheme, h1: h1, h2: h2, api: &http.Client{Transport: h1, Timeout: 30 * time.Second}, tunnel: tunnel}
}

// plainConns are the transports of the time before Home keys: HTTP/1.1 and
// prior-knowledge h2c in clear.
func plainConns() *homeConns {
	h2 := newTransport()
	h2.Protocols = new(http.Protocols)
	h2.Protocols.SetUnencryptedHTTP2(true)
	return newConns(newTransport(), h2, "http", nil)
}

// tlsConns are the transports to a Home whose key has fingerprint keySHA256.
// keepAlive false: for a Home no route uses any more (a release after
// Forget), whose connections must not outlive the call.
func tlsConns(keySHA256 string, keepAlive bool) (*homeConns, error) {
	h1TLS, err := homekey.ClientConfig(keySHA256, "http/1.1")
	if err != nil {
		return nil, err
	}
	h1 := newTransport()
	h1.TLSClientConfig = h1TLS
	h2 := newTransport()
	h2.TLSClientConfig = h1TLS.Clone()
	h2.TLSClientConfig.NextProtos = []string{"h2"}
	h2.Protocols = new(http.Protocols)
	h2.Protocols.SetHTTP2(true)
	h1.DisableKeepAlives, h2.DisableKeepAlives = !keepAlive, !keepAlive
	return newConns(h1, h2, "https", h1TLS.Clone()), nil
}

// NewFiberdClient returns a Client for every Home, authenticating to each
// with the credential creds mints for it, and authenticating each Home by
// its key.
func NewFiberdClient(creds Credentials) *FiberdClient {
	c := &FiberdClient{
		creds: creds, plain: plainConns(), homes: map[Home]homeClient{}, names: map[string]int{},
		leased: map[string]Home{}, noTunnel: map[Home]time.Time{},
	}
	c.tunnelRT = newTunnelTransport(c.dialTunnel)
	return c
}

// credential mints home's current credential.
func (c *FiberdClient) credential(home Home) (string, error) {
	if home.Name == "" {
		return "", fmt.Errorf("home %s has no name (router metadata data.home): no credential can be minted for it", home.Endpoint)
	}
	cred, err := c.creds.For(home.Name)
	if err != nil {
		return "", fmt.Errorf("credential for home %s at %s: %w", home.Name, home.Endpoint, err)
	}
	return cred, nil
}

// UnauthenticatedHomeError: the router metadata names no key for the Home,
// and the router does not dial Homes it cannot authenticate.
type UnauthenticatedHomeError struct{ Home Home }

func (e *UnauthenticatedHomeError) Error() string {
	return fmt.Sprintf("home %s at %s: its router metadata names no key (data.homeKeySHA256 is empty: a Home of a Lampyr version before Home keys), and fiber-router dials only Homes it can authenticate; finish the upgrade (grant controller and controller), or run fiber-router with --allow-unauthenticated-homes until every Home has a key",
		e.Home.Name, e.Home.Endpoint)
}

// conns returns the transports for home: its own when it has a key, the
// shared clear ones when it has none and that is allowed.
func (c *FiberdClient) conns(home Home, keepAlive bool) (*homeConns, error) {
	if home.KeySHA256 == "" {
		if !c.AllowUnauthenticatedHomes {
			return nil, &UnauthenticatedHomeError{Home: home}
		}
		return c.plain, nil
	}
	hc, err := tlsConns(home.KeySHA256, keepAlive)
	if err != nil {
		return nil, fmt.Errorf("home %s at %s: router metadata data.homeKeySHA256: %w", home.Name, home.Endpoint, err)
	}
	return hc, nil
}

// home returns a fiberd client for home carrying home's current credential.
// adopt says the caller is a route that uses home (Acquire), so its client
// is kept; a call that only finishes what a fiber started (a release, a
// proxied request, a tunnel) must not bring back the state of a Home that
// Forget already dropped, or every replaced Home with a fiber in flight
// would leave some behind for the router's life.
func (c *FiberdClient) home(home Home, adopt bool) (*client.Client, *homeConns, error) {
	// Refused before a credential is minted: nothing for a Home that
	// cannot be authenticated.
	if home.KeySHA256 == "" && !c.AllowUnauthenticatedHomes {
		ue := &UnauthenticatedHomeError{Home: home}
		return nil, nil, &UnavailableError{Home: home, Reason: ue.Error(), Err: ue}
	}
	cred, err := c.credential(home)
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hc, known := c.homes[home]
	if known && hc.cred == cred {
		return hc.c, hc.conns, nil
	}
	conns := hc.conns
	if !known {
		if conns, err = c.conns(home, known || adopt); err != nil {
			return nil, nil, err
		}
	}
	cl, err := client.New(conns.scheme+"://"+home.Endpoint, cred)
	if err != nil {
		return nil, nil, err
	}
	cl.HTTP, cl.TLS = conns.api, conns.tunnel
	switch {
	case known || adopt:
		if !known {
			c.names[home.Name]++
		}
		c.homes[home] = homeClient{cred: cred, c: cl, conns: conns}
	case c.names[home.Name] == 0:
		// Minting cached the credential again; drop it as Forget did.
		c.creds.Forget(home.Name)
	}
	return cl, conns, nil
}

// Forget implements Forgetter. The credential goes too unless another
// endpoint of the same Home name is still in use (a Home Pod that moved).
func (c *FiberdClient) Forget(home Home) {
	c.mu.Lock()
	hc, known := c.homes[home]
	delete(c.homes, home)
	if known {
		c.names[home.Name]--
	}
	named := c.names[home.Name] > 0
	if !named {
		delete(c.names, home.Name)
	}
	c.mu.Unlock()
	if known && hc.conns != c.plain {
		hc.conns.closeIdle()
	}
	c.tmu.Lock()
	delete(c.noTunnel, home)
	c.tmu.Unlock()
	if !named {
		c.creds.Forget(home.Name)
	}
}

// ProxyTransport implements ProxyTransports: f's requests go over its
// Home's own connections (TLS pinned to its key), HTTP/2 when h2.
func (c *FiberdClient) ProxyTransport(f Fiber, h2 bool) (http.RoundTripper, error) {
	// The Home of a fiber in use is nearly always known: no credential
	// to mint for that (PrepareProxy did).
	c.mu.Lock()
	hc, known := c.homes[f.Home]
	c.mu.Unlock()
	conns := hc.conns
	if !known {
		var err error
		if _, conns, err = c.home(f.Home, false); err != nil {
			return nil, err
		}
	}
	if h2 {
		return conns.h2, nil
	}
	return conns.h1, nil
}

// wrongKey explains a Home that did not prove the key its metadata names.
func wrongKey(home Home, err error) error {
	if !errors.Is(err, homekey.ErrWrongKey) {
		return err
	}
	return fmt.Errorf("home %s at %s did not prove the key its router metadata names (data.homeKeySHA256), so it was sent no credential: whatever answers there is not that Home (a captured address: a Service's externalIPs, a reused Pod IP), or the Home Secret was re-created and its Pod has not yet read the new key: %w",
		home.Name, home.Endpoint, err)
}

// Acquire implements Client.
func (c *FiberdClient) Acquire(ctx context.Context, home Home) (Fiber, error) {
	cl, _, err := c.home(home, true)
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
			return Fiber{}, &UnavailableError{Home: home, Reason: fe.Reason.String() + ": " + fe.Message}
		case ctx.Err() != nil:
			return Fiber{}, ctx.Err()
		case !errors.As(err, &fe):
			// Transport error: the Home is down or being replaced, or
			// what answers is not the Home.
			err = wrongKey(home, err)
			return Fiber{}, &UnavailableError{Home: home, Reason: err.Error(), Err: err}
		}
		return Fiber{}, refused(home, err)
	}
	c.tmu.Lock()
	c.leased[f.ID] = home
	c.tmu.Unlock()
	return Fiber{ID: f.ID, Home: home, StartedAt: f.StartedAt, InFiberd: time.Duration(f.AcquireMicros) * time.Microsecond}, nil
}

// refused explains fiberd's 401, which says the router key and the Home's
// copy of its public key disagree (or the metadata names another Home).
func refused(home Home, err error) error {
	var fe *client.Error
	if !errors.As(err, &fe) || fe.Status != http.StatusUnauthorized {
		return err
	}
	return fmt.Errorf("home %s at %s refused the router's credential (%w): the router public key in the Home's Secret does not match --router-key-file (Secret lampyr-system/fiber-router-key; after a rotation Homes follow at their next grant renewal), or the Home's grant names another Home than the metadata's data.home",
		home.Name, home.Endpoint, err)
}

// Release implements Client.
func (c *FiberdClient) Release(ctx context.Context, f Fiber) error {
	// No new tunnel to it from here on; an open one ends when fiberd kills
	// the fiber.
	c.tmu.Lock()
	delete(c.leased, f.ID)
	c.tmu.Unlock()
	c.tunnelRT.drop(f.ID)
	cl, _, err := c.home(f.Home, false)
	if err != nil {
		return err
	}
	return refused(f.Home, wrongKey(f.Home, cl.Release(ctx, f.ID)))
}

// PrepareProxy implements Client.
func (c *FiberdClient) PrepareProxy(out *http.Request, f Fiber) {
	out.URL.Scheme = "http"
	out.URL.Host = f.Home.Endpoint
	// This cannot fail: minting fails only for a nameless Home, and the
	// fiber was acquired from this Home with a credential minted for it.
	// Should it ever, the empty credential earns fiberd's 401, never
	// another Home's way in.
	var cred string
	if cl, conns, err := c.home(f.Home, false); err == nil {
		cred = cl.Token()
		out.URL.Scheme = conns.scheme
	}
	// Set, never Add: a client-supplied Lampyr-Fiber must not pick a fiber,
	// and the router credential travels in its own header so the client's
	// Authorization reaches the handler.
	client.SetFiberHeaders(out.Header, f.ID, cred)
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
	cl, _, err := c.home(home, false)
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
		case errors.As(err, &fe) && (fe.Status == http.StatusMethodNotAllowed || fe.Status == http.StatusNotFound && fe.Reason != contract.ReasonUnknownFiber):
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
			return nil, refused(home, wrongKey(home, err))
		}
	}
}
