package proxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"lampyr.dev/serving/impl/contract"
)

// EgressPath is the grant controller's endpoint that ensures a namespace's
// egress Pod and answers its address (impl/grant/egress_api.go).
const EgressPath = contract.EgressAPIPath

// EgressResponse is POST EgressPath's answer.
type EgressResponse struct {
	// Endpoint is the egress Pod's ip:port.
	Endpoint string `json:"endpoint"`
}

// Client timeouts.
const (
	// tunnelTimeout bounds reaching the proxy and its answer to CONNECT
	// (which includes its own dial of the destination, DefaultDialTimeout).
	tunnelTimeout = DefaultDialTimeout + 5*time.Second
	// askTimeout bounds POST /v1/egress: the grant controller waits up to
	// 30 s for a new egress Pod to be Ready.
	askTimeout = 45 * time.Second
	// retryAfter: after a failed ask, connections fail at once for this
	// long rather than each asking again.
	retryAfter = time.Second
)

// Error is a proxy's refusal of a CONNECT.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("egress proxy answered %d: %s", e.Status, e.Message)
}

// destinationFault: the proxy worked and the destination (or the proxy's
// load) refused; the endpoint stays right.
func (e *Error) destinationFault() bool {
	return e.Status == http.StatusBadGateway || e.Status == http.StatusServiceUnavailable
}

// Dial opens a tunnel to dst through the proxy at proxyAddr, authenticated
// by the signed grant.
func Dial(ctx context.Context, proxyAddr string, dst netip.AddrPort, grant []byte) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, tunnelTimeout)
	defer cancel()
	d := net.Dialer{KeepAlive: 30 * time.Second}
	c, err := d.DialContext(ctx, "tcp", proxyAddr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	conn, err := connect(c, dst, grant)
	if !stop() || err != nil {
		c.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	return conn, nil
}

func connect(c net.Conn, dst netip.AddrPort, grant []byte) (net.Conn, error) {
	target := dst.String()
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target +
		"\r\nProxy-Authorization: Bearer " + base64.StdEncoding.EncodeToString(grant) + "\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, &Error{Status: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	if br.Buffered() == 0 {
		return c, nil
	}
	// A destination that speaks first: its bytes may already be read.
	pre, _ := br.Peek(br.Buffered())
	return &bufferedConn{Conn: c, pre: append([]byte(nil), pre...)}, nil
}

// bufferedConn reads what was buffered before the connection's own bytes.
// It embeds the net.Conn interface, not *net.TCPConn, so io.Copy cannot
// reach past Read (TCPConn's WriteTo would skip pre).
type bufferedConn struct {
	net.Conn
	pre []byte
}

func (b *bufferedConn) Read(p []byte) (int, error) {
	if len(b.pre) > 0 {
		n := copy(p, b.pre)
		b.pre = b.pre[n:]
		return n, nil
	}
	return b.Conn.Read(p)
}

// CloseWrite half-closes, so the destination sees the fiber's EOF.
func (b *bufferedConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return b.Conn.Close()
}

// EndpointSource says where the namespace's egress proxy is.
type EndpointSource interface {
	Endpoint(ctx context.Context) (string, error)
	// Forget drops an endpoint that did not work; the next Endpoint asks
	// again.
	Forget(endpoint string)
}

// Static is a fixed endpoint (tests, benchmarks).
type Static string

func (s Static) Endpoint(context.Context) (string, error) { return string(s), nil }
func (Static) Forget(string)                              {}

// Dialer is fiberd's forwarded-connection dialer through the egress proxy.
type Dialer struct {
	Endpoints EndpointSource
	// Grant returns the Home's current signed grant.
	Grant func() ([]byte, error)
}

// Dial implements egress.Dialer.
func (d *Dialer) Dial(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	ep, err := d.Endpoints.Endpoint(ctx)
	if err != nil {
		return nil, err
	}
	grant, err := d.Grant()
	if err != nil {
		return nil, err
	}
	c, err := Dial(ctx, ep, dst, grant)
	var pe *Error
	if err != nil && !(errors.As(err, &pe) && pe.destinationFault()) {
		// Unreachable, or something else at that address (a Pod IP
		// reused), or a proxy of another namespace: ask again.
		d.Endpoints.Forget(ep)
	}
	return c, err
}

// Endpoints asks the grant controller for the namespace's egress proxy on
// first need and remembers the answer until Forget; concurrent callers
// share one ask, and after a failed ask they fail at once for retryAfter.
type Endpoints struct {
	// API is the grant controller's egress API base URL
	// (http://host:port; EgressPath is appended).
	API string
	// Grant returns the Home's current signed grant (the bearer).
	Grant func() ([]byte, error)
	// Client makes the request (default one with askTimeout).
	Client *http.Client

	mu       sync.Mutex
	endpoint string
	asking   chan struct{}
	failedAt time.Time
	lastErr  error
}

// Endpoint implements EndpointSource.
func (e *Endpoints) Endpoint(ctx context.Context) (string, error) {
	for {
		e.mu.Lock()
		switch {
		case e.endpoint != "":
			ep := e.endpoint
			e.mu.Unlock()
			return ep, nil
		case e.asking != nil:
			w := e.asking
			e.mu.Unlock()
			select {
			case <-w:
				continue
			case <-ctx.Done():
				return "", ctx.Err()
			}
		case e.lastErr != nil && time.Since(e.failedAt) < retryAfter:
			err := e.lastErr
			e.mu.Unlock()
			return "", err
		}
		w := make(chan struct{})
		e.asking = w
		e.mu.Unlock()
		// The ask outlives a caller that gives up: the others wait for it.
		go func() {
			ep, err := e.ask()
			e.mu.Lock()
			e.asking = nil
			e.endpoint, e.lastErr = ep, err
			if err != nil {
				e.failedAt = time.Now()
			}
			e.mu.Unlock()
			close(w)
		}()
	}
}

// Forget implements EndpointSource.
func (e *Endpoints) Forget(endpoint string) {
	e.mu.Lock()
	if e.endpoint == endpoint {
		e.endpoint = ""
	}
	e.mu.Unlock()
}

func (e *Endpoints) ask() (string, error) {
	grant, err := e.Grant()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(e.API, "/")+EgressPath, nil)
	if err != nil {
		return "", fmt.Errorf("--egress-api %q: %w", e.API, err)
	}
	req.Header.Set("Authorization", "Bearer "+base64.StdEncoding.EncodeToString(grant))
	c := e.Client
	if c == nil {
		c = &http.Client{Timeout: askTimeout}
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("asking the grant controller for this namespace's egress proxy: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("the grant controller answered %d for this namespace's egress proxy: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var out EgressResponse
	if err := json.Unmarshal(body, &out); err != nil {
		return "", fmt.Errorf("the grant controller's egress answer: %w", err)
	}
	if _, err := netip.ParseAddrPort(out.Endpoint); err != nil {
		return "", fmt.Errorf("the grant controller's egress endpoint %q is not ip:port", out.Endpoint)
	}
	return out.Endpoint, nil
}
