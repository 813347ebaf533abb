// Package client is the Go client of fiberd's HTTP API (docs/contracts.md §4).
// fiber-router, fiberctl and the tests use it; the server in
// lampyr.dev/serving/impl/fiberd/server uses the same wire types, so the two
// cannot drift.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/homekey"
)

// FiberHeader names the fiber a proxied request is for. fiberd removes it
// before the request reaches the handler.
const FiberHeader = "Lampyr-Fiber"

// AnswerHeader marks an answer fiberd itself made to a proxied request
// (value "1"; the body is an Error naming the reason: FiberFailed,
// UnknownFiber, RequestTimeout ...), as opposed to the handler's. fiberd removes it from every handler
// response, so a handler cannot claim to be fiberd. fiber-router turns a
// marked answer into its own error, never passing fiberd's message (fiber
// ids, loopback addresses) to the client, and ends the lease.
const AnswerHeader = "Lampyr-Fiberd-Answer"

// ProxyAuthHeader carries the router token ("Bearer <token>") on proxied
// requests instead of Authorization, so the client's own Authorization header
// reaches the handler untouched. fiberd removes it.
const ProxyAuthHeader = "Lampyr-Fiberd-Authorization"

// IdleSecondsHeader is on fiberd's /readyz answers (200 or not ready)
// once a Revision is loaded: whole seconds since the Home last had a fiber
// leased or an acquisition under way, "0" while it has. The grant
// controller reads it to resize idle Homes (issue 32); ParseIdleSeconds
// reads it.
const IdleSecondsHeader = "Fiberd-Idle-Seconds"

// FormatIdleSeconds is IdleSecondsHeader's value for an idle time: whole
// seconds, rounded down.
func FormatIdleSeconds(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	return strconv.FormatInt(int64(d/time.Second), 10)
}

// ParseIdleSeconds reads IdleSecondsHeader from a /readyz answer's
// headers: ok is false when it is absent (an older fiberd, or no Revision
// loaded); err when it is there but not a whole number of seconds >= 0.
func ParseIdleSeconds(h http.Header) (idle time.Duration, ok bool, err error) {
	v := h.Get(IdleSecondsHeader)
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 || n > int64(math.MaxInt64/time.Second) {
		return 0, false, fmt.Errorf("%s: %q is not a whole number of seconds", IdleSecondsHeader, v)
	}
	return time.Duration(n) * time.Second, true, nil
}

// Paths of the API.
const (
	FibersPath  = "/v1/fibers"
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
	MetricsPath = "/metrics"
	GrantPath   = "/v1/grant"
)

// Fiber states reported by List.
const (
	StateWarm     = "warm"     // pre-started, never used, in the pool
	StateAcquired = "acquired" // leased to fiber-router, idle between requests
	StateBusy     = "busy"     // serving a request
	StateSpent    = "spent"    // fresh fiber that has served its one request
	StateTunneled = "tunneled" // reuse fiber with an open tunnel (TunnelPath)
)

// TunnelProtocol is the Upgrade token of POST /v1/fibers/{id}/tunnel: after
// "101 Switching Protocols" the connection carries bytes to and from the
// fiber's port unchanged, so a reuse-mode fiber's requests cost fiberd a copy
// instead of an HTTP parse and a second proxy (docs/contracts.md §4).
const TunnelProtocol = "lampyr-fiber-tunnel"

// TunnelPath is the tunnel endpoint of fiber id.
func TunnelPath(id string) string { return FibersPath + "/" + url.PathEscape(id) + "/tunnel" }

// Fiber is one fiber as the API reports it.
type Fiber struct {
	ID        string    `json:"id"`
	State     string    `json:"state,omitempty"`
	StartedAt time.Time `json:"startedAt"`
	// AgeSeconds is how long the fiber has been alive.
	AgeSeconds float64 `json:"ageSeconds,omitempty"`
	// Requests is how many proxied requests and tunnels the fiber has
	// served (at most 1 in fresh mode). Requests carried by a tunnel are not
	// counted one by one: fiberd copies their bytes without parsing them.
	Requests int64 `json:"requests,omitempty"`
	// AcquireMicros is how long fiberd took to answer this acquisition,
	// from the call's arrival to its answer (a fresh fiber's start
	// included), in microseconds: what fiber-router's lease took minus the
	// way to the Home and back (only in POST /v1/fibers answers).
	AcquireMicros int64 `json:"acquireMicros,omitempty"`
}

// FiberList is the body of GET /v1/fibers.
type FiberList struct {
	Revision string  `json:"revision,omitempty"`
	Mode     string  `json:"mode,omitempty"`
	Max      int32   `json:"maxFibers,omitempty"`
	Fibers   []Fiber `json:"fibers"`
}

// GrantInfo is the body of GET /v1/grant: the signed grant fiberd runs under.
type GrantInfo struct {
	GrantID          string    `json:"grantID"`
	Namespace        string    `json:"namespace"`
	Revision         string    `json:"revision"`
	SnapshotArtifact string    `json:"snapshotArtifact"`
	Template         string    `json:"template"`
	MaxFibers        int32     `json:"maxFibers"`
	MemoryPerFiber   int64     `json:"memoryPerFiberBytes"`
	Mode             string    `json:"mode"`
	IssuedAt         time.Time `json:"issuedAt"`
	ExpiresAt        time.Time `json:"expiresAt"`
	TemplateLoaded   bool      `json:"templateLoaded"`
	// LoadReason says why the snapshot was refused (SnapshotUnavailable,
	// SnapshotTooLarge, InvalidGrant), empty when loaded; programs read it.
	LoadReason contract.Reason `json:"loadReason,omitempty"`
	// LoadError says it in words for people ("reason: message").
	LoadError string `json:"loadError,omitempty"`
}

// Readiness is /readyz's 200 answer to a request that accepts
// application/json (kubelet's probe gets "ok"): how the Revision's fibers
// start, which the grant controller puts in the Revision's status.
type Readiness struct {
	Ready bool `json:"ready"`
	// Preinit is set on a backend that pre-initializes fibers (gvisor with
	// --gvisor-preinit), nil on any other.
	Preinit *Preinit `json:"preinit,omitempty"`
}

// Preinit says whether fibers are restored from a checkpoint of the
// initialized handler or start cold, and why.
type Preinit struct {
	Restored bool `json:"restored"`
	// Pending: the checkpoint is made by the Revision's first fiber start,
	// which has not happened (a Home without warm fibers).
	Pending bool `json:"pending,omitempty"`
	// Message says why they start cold, or what is pending ("" when
	// restored).
	Message string `json:"message,omitempty"`
}

// Error is the JSON body of every non-2xx answer of the API.
type Error struct {
	// Status is the HTTP status code (not on the wire).
	Status int `json:"-"`
	// Reason is a CamelCase machine-readable reason, e.g. "MaxFibersReached"
	// (contract.Reason*): programs compare it, never the message.
	Reason  contract.Reason `json:"reason"`
	Message string          `json:"message"`
	// Handler details a start the handler itself failed: set on /readyz
	// with reason HandlerExited, HandlerNotListening or HandlerNotReady.
	Handler *HandlerFailure `json:"handler,omitempty"`
	// RetryAfter is the Retry-After header of a 429 or 503 (not on the wire).
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("fiberd: %d %s: %s", e.Status, e.Reason, e.Message)
}

// HandlerFailure is a Revision's handler failing its fiber starts: the last
// consecutive start failed because of the handler (it exited, or did not
// listen or answer its readiness path in time), and none succeeded since.
// The Error's Message says what happened; it and Output are about the
// handler alone (no fiberd or Home address), for the Revision's owner.
type HandlerFailure struct {
	// ExitCode is the handler's exit status, 128+N when signal N killed it
	// (as kubelet reports a container's); meaningful for HandlerExited.
	ExitCode int32 `json:"exitCode"`
	// Signal names the signal that killed the handler, if one did.
	Signal string `json:"signal,omitempty"`
	// Output is the end of the handler's stdout and stderr (at most 2048
	// bytes and 80 lines, like kubelet's FallbackToLogsOnError message),
	// valid UTF-8 without control characters but newline and tab.
	Output string `json:"output,omitempty"`
	// ConsecutiveFailures counts the failed starts since the last good one.
	ConsecutiveFailures int `json:"consecutiveFailures"`
}

// IsMaxFibers reports whether err is the 429 answer at the grant's maxFibers.
func IsMaxFibers(err error) bool { return hasStatus(err, http.StatusTooManyRequests) }

// IsUnavailable reports whether err is the 503 answer (no valid grant, or
// template/pool not ready).
func IsUnavailable(err error) bool { return hasStatus(err, http.StatusServiceUnavailable) }

// IsFiberBusy reports whether err is the 409 FiberBusy answer (the fiber
// serves another request or tunnel).
func IsFiberBusy(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Reason == contract.ReasonFiberBusy
}

// IsNotFound reports whether err says the fiber does not exist (any more).
func IsNotFound(err error) bool { return hasStatus(err, http.StatusNotFound) }

func hasStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// Client talks to one fiberd.
type Client struct {
	base  *url.URL
	token string
	// HTTP is the client used for API calls and proxied requests.
	HTTP *http.Client
	// Dialer opens tunnel connections (Tunnel); nil means a 5s-timeout
	// dialer with TCP keep-alive.
	Dialer *net.Dialer
	// TLS is the configuration a tunnel's connection is wrapped in when the
	// endpoint is https:// (NewTLS: only the Home's own key is accepted).
	// HTTP's transport must carry the same for API calls.
	TLS *tls.Config
}

// NewTLS returns a client for the fiberd at endpoint (host:port) that
// serves its API over TLS with the Home key whose fingerprint is
// homeKeySHA256 (status.homeKeySHA256; impl/trust/homekey), and accepts no
// other: a peer without that key is never sent the token.
func NewTLS(endpoint, token, homeKeySHA256 string) (*Client, error) {
	tlsConfig, err := homekey.ClientConfig(homeKeySHA256, "h2", "http/1.1")
	if err != nil {
		return nil, fmt.Errorf("fiberd client: %w", err)
	}
	c, err := New("https://"+endpoint, token)
	if err != nil {
		return nil, err
	}
	t := &http.Transport{Proxy: nil, TLSClientConfig: tlsConfig.Clone(), ForceAttemptHTTP2: true}
	c.HTTP = &http.Client{Transport: t}
	// A tunnel is an HTTP/1.1 upgrade: offer nothing else.
	c.TLS = tlsConfig.Clone()
	c.TLS.NextProtos = []string{"http/1.1"}
	return c, nil
}

// New returns a client for the fiberd at endpoint ("host:port" as in a
// CapacityGrant's status.homeEndpoint, or a full http:// URL) that
// authenticates with token.
func New(endpoint, token string) (*Client, error) {
	if endpoint == "" {
		return nil, errors.New("fiberd client: endpoint is empty; pass host:port (CapacityGrant status.homeEndpoint)")
	}
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("fiberd client: endpoint %q: %w", endpoint, err)
	}
	return &Client{base: u, token: token, HTTP: &http.Client{}}, nil
}

// URL is the base URL of the fiberd, e.g. as a reverse-proxy target.
func (c *Client) URL() *url.URL { u := *c.base; return &u }

// Token is the bearer token the client sends.
func (c *Client) Token() string { return c.token }

// Acquire leases a never-used fiber. At the grant's maxFibers it fails with an
// *Error for which IsMaxFibers is true and whose RetryAfter says when to retry.
func (c *Client) Acquire(ctx context.Context) (Fiber, error) {
	var f Fiber
	err := c.call(ctx, http.MethodPost, FibersPath, http.StatusCreated, &f)
	return f, err
}

// Release kills the fiber and destroys its sandbox. Releasing a fiber that is
// already gone is not an error.
func (c *Client) Release(ctx context.Context, id string) error {
	err := c.call(ctx, http.MethodDelete, FibersPath+"/"+url.PathEscape(id), http.StatusNoContent, nil)
	if IsNotFound(err) {
		return nil
	}
	return err
}

// List returns the live fibers.
func (c *Client) List(ctx context.Context) (FiberList, error) {
	var l FiberList
	err := c.call(ctx, http.MethodGet, FibersPath, http.StatusOK, &l)
	return l, err
}

// Grant returns the signed grant fiberd currently runs under.
func (c *Client) Grant(ctx context.Context) (GrantInfo, error) {
	var g GrantInfo
	err := c.call(ctx, http.MethodGet, GrantPath, http.StatusOK, &g)
	return g, err
}

// Healthy checks /healthz (the process is up).
func (c *Client) Healthy(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, HealthzPath, http.StatusOK, nil)
}

// Ready checks /readyz: valid grant, template loaded, pool warm.
func (c *Client) Ready(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, ReadyzPath, http.StatusOK, nil)
}

// Readiness is /readyz in JSON: ready, and how the Revision's fibers
// start on a backend that pre-initializes them.
func (c *Client) Readiness(ctx context.Context) (Readiness, error) {
	var r Readiness
	err := c.call(ctx, http.MethodGet, ReadyzPath, http.StatusOK, &r)
	return r, err
}

// NewFiberRequest prepares req (aimed at any path) to be proxied by fiberd
// into fiber id: it points the URL at fiberd, keeps the path and query, and
// sets the fiber and fiberd-authorization headers. The Host header and the
// request's own Authorization header are kept.
func (c *Client) NewFiberRequest(req *http.Request, id string) *http.Request {
	out := req.Clone(req.Context())
	out.URL.Scheme = c.base.Scheme
	out.URL.Host = c.base.Host
	if out.Host == "" {
		out.Host = req.URL.Host
	}
	out.RequestURI = ""
	SetFiberHeaders(out.Header, id, c.token)
	return out
}

// SetFiberHeaders sets the headers fiberd needs on a request proxied into
// fiber id (for callers that build their own reverse proxy).
func SetFiberHeaders(h http.Header, id, token string) {
	h.Set(FiberHeader, id)
	h.Set(ProxyAuthHeader, "Bearer "+token)
}

// Do sends req into fiber id through fiberd and returns the handler's answer.
func (c *Client) Do(req *http.Request, id string) (*http.Response, error) {
	return c.HTTP.Do(c.NewFiberRequest(req, id))
}

// Tunnel opens a byte tunnel to leased reuse-mode fiber id: fiberd answers
// "101 Switching Protocols" and from then on copies bytes between the
// returned connection and the handler's port. The caller speaks the
// handler's protocol over it (an http.Transport's DialContext, say), one
// request at a time: while the tunnel is open the fiber is busy for every
// other caller. Closing the connection ends the tunnel; fiberd ends it when
// the fiber ends, or after max(idleTimeoutSeconds, maxRequestSeconds)
// without a byte in either direction.
//
// Refusals are *Error values as for the other calls: 404 UnknownFiber,
// 409 FiberBusy (another request or tunnel holds the fiber; retrying is
// safe), 409 TunnelRefused (fresh mode), 401, 503.
func (c *Client) Tunnel(ctx context.Context, id string) (net.Conn, error) {
	d := c.Dialer
	if d == nil {
		d = &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	}
	path := TunnelPath(id)
	conn, err := d.DialContext(ctx, "tcp", c.base.Host)
	if err != nil {
		return nil, fmt.Errorf("fiberd POST %s: %w", path, err)
	}
	if c.base.Scheme == "https" {
		if c.TLS == nil {
			conn.Close()
			return nil, fmt.Errorf("fiberd POST %s: an https endpoint without a TLS configuration (use NewTLS)", path)
		}
		tc := tls.Client(conn, c.TLS)
		// The handshake proves the Home's key before the token is sent.
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("fiberd POST %s: %w", path, err)
		}
		conn = tc
	}
	// The handshake is bounded by ctx; the tunnel itself is not.
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (net.Conn, error) {
		stop()
		conn.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, c.base.ResolveReference(&url.URL{Path: path}).String(), nil)
	if err != nil {
		return fail(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", TunnelProtocol)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if err := req.Write(conn); err != nil {
		return fail(fmt.Errorf("fiberd POST %s: %w", path, err))
	}
	br := bufio.NewReaderSize(conn, 4<<10)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(fmt.Errorf("fiberd POST %s: reading answer: %w", path, err))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		return fail(apiError(resp, body))
	}
	if !stop() {
		// ctx ended as the answer came: the deadline may already be set.
		conn.Close()
		return nil, ctx.Err()
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		conn.Close()
		return nil, err
	}
	if br.Buffered() > 0 {
		// fiberd sends nothing after the 101 until the caller writes, but a
		// reader that read ahead must not lose bytes.
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func apiError(resp *http.Response, body []byte) *Error {
	e := &Error{Status: resp.StatusCode}
	if json.Unmarshal(body, e) != nil || e.Reason == "" {
		e.Reason = contract.Reason(http.StatusText(resp.StatusCode))
		e.Message = string(bytes.TrimSpace(body))
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if n, err := strconv.Atoi(s); err == nil {
			e.RetryAfter = time.Duration(n) * time.Second
		}
	}
	return e
}

// PushGrant hands a spare Home its signed grant (PUT /v1/grant; the grant
// controller does, the moment it claims the spare for a Revision) and
// returns /readyz's answer once fiberd loaded it: an *Error (503 with
// fiberd's reason) while it is not ready.
func (c *Client) PushGrant(ctx context.Context, signedGrant []byte) (Readiness, error) {
	var r Readiness
	err := c.callBody(ctx, http.MethodPut, GrantPath, bytes.NewReader(signedGrant), http.StatusOK, &r)
	return r, err
}

func (c *Client) call(ctx context.Context, method, path string, want int, out any) error {
	return c.callBody(ctx, method, path, nil, want, out)
}

func (c *Client) callBody(ctx context.Context, method, path string, body io.Reader, want int, out any) error {
	u := c.base.ResolveReference(&url.URL{Path: path})
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("fiberd %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("fiberd %s %s: reading answer: %w", method, path, err)
	}
	if resp.StatusCode != want {
		return apiError(resp, answer)
	}
	if out != nil {
		if err := json.Unmarshal(answer, out); err != nil {
			return fmt.Errorf("fiberd %s %s: decoding answer: %w", method, path, err)
		}
	}
	return nil
}
