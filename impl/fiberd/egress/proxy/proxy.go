// Package proxy is the way a fiber's connections leave: through its tenant
// namespace's egress Pod (docs/networking.md, "Service bindings"), so the
// destination's NetworkPolicies, and the tenant namespace's own egress
// policies, see a Pod of the tenant's namespace rather than a Home in
// lampyr-homes.
//
// The egress Pod runs Server (`fiberd egress-proxy`, unprivileged): an
// HTTP/1.1 CONNECT proxy that tunnels to an ip:port only for a caller
// holding a signed grant (impl/trust/signedgrant) of the Pod's own
// namespace. fiberd runs Dialer: it learns the Pod's address from the grant
// controller (POST /v1/egress, Endpoints) and opens each forwarded
// connection with CONNECT. fiberd still decides what a fiber may reach (its
// resolver and policy, package egress); the proxy adds who the connection
// comes from.
package proxy

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"lampyr.dev/serving/impl/trust/egresspolicy"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// Server defaults.
const (
	// DefaultMaxTunnels bounds a proxy's open tunnels: the egress Pod's
	// memory limit holds them (each is two sockets and, when the kernel
	// cannot splice, two 32 KiB buffers).
	DefaultMaxTunnels = 512
	// DefaultDialTimeout bounds the connection to a destination.
	DefaultDialTimeout = 10 * time.Second
	// headerTimeout bounds a CONNECT request's headers; maxHeaderBytes
	// their size (a signed grant is about 1-2 KiB, base64 a third more).
	headerTimeout  = 10 * time.Second
	maxHeaderBytes = 32 << 10
)

// HealthPath answers 200 without credentials: the egress Pod's readiness.
const HealthPath = "/healthz"

// Server is the egress proxy of one tenant namespace.
type Server struct {
	// Key verifies signed grants (the grant controller's public key).
	Key ed25519.PublicKey
	// Namespace is the egress Pod's own; only grants of it are served.
	Namespace string
	// MaxTunnels bounds open tunnels (DefaultMaxTunnels when 0); past it
	// a CONNECT is answered 503.
	MaxTunnels int
	// DialTimeout bounds the connection to a destination.
	DialTimeout time.Duration
	// Dial opens connections to destinations (default a net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Now is the clock grants are checked against (default time.Now).
	Now func() time.Time
	// Logf logs refusals (default log.Printf).
	Logf func(format string, args ...any)

	once    sync.Once
	tunnels chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	open    map[net.Conn]struct{}
	closed  bool
	pending int
}

func (s *Server) init() {
	s.once.Do(func() {
		if s.MaxTunnels <= 0 {
			s.MaxTunnels = DefaultMaxTunnels
		}
		if s.DialTimeout <= 0 {
			s.DialTimeout = DefaultDialTimeout
		}
		if s.Dial == nil {
			d := &net.Dialer{KeepAlive: 30 * time.Second}
			s.Dial = d.DialContext
		}
		if s.Now == nil {
			s.Now = time.Now
		}
		if s.Logf == nil {
			s.Logf = log.Printf
		}
		s.tunnels = make(chan struct{}, s.MaxTunnels)
		s.open = map[net.Conn]struct{}{}
	})
}

// Serve serves CONNECT on ln until ln is closed or Close is called.
func (s *Server) Serve(ln net.Listener) error {
	s.init()
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: headerTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		IdleTimeout:       time.Minute,
		ErrorLog:          log.New(io.Discard, "", 0),
		// Connections still sending their request are bounded too
		// (tunnels leave the HTTP server once hijacked, and are bounded
		// by MaxTunnels). Counted here rather than by wrapping the
		// listener, so a tunnel splices the raw TCP connections in the
		// kernel and half-closes them.
		ConnState: s.countPending,
	}
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// maxPending bounds connections that have not become tunnels.
const maxPending = 256

func (s *Server) countPending(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateNew:
		s.pending++
		if s.pending > maxPending {
			c.Close() // reported StateClosed, which counts it out
		}
	case http.StateHijacked, http.StateClosed:
		s.pending--
	}
}

// Close ends every open tunnel and waits for them.
func (s *Server) Close() {
	s.init()
	s.mu.Lock()
	s.closed = true
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	if r.Method == http.MethodGet && r.URL.Path == HealthPath {
		w.Write([]byte("ok\n"))
		return
	}
	if r.Method != http.MethodConnect {
		http.Error(w, "this is Lampyr's egress proxy: only CONNECT ip:port is served", http.StatusMethodNotAllowed)
		return
	}
	claims, code, msg := s.authorize(r)
	if code != 0 {
		s.Logf("egress-proxy: refused CONNECT %s from %s: %s", r.Host, r.RemoteAddr, msg)
		if code == http.StatusProxyAuthRequired {
			w.Header().Set("Proxy-Authenticate", `Bearer realm="lampyr-egress"`)
		}
		http.Error(w, msg, code)
		return
	}
	dst, err := netip.ParseAddrPort(r.Host)
	if err != nil || dst.Port() == 0 {
		http.Error(w, "CONNECT target must be ip:port (fiberd resolves names)", http.StatusBadRequest)
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	for _, p := range egresspolicy.AlwaysDenied {
		if p.Contains(dst.Addr()) {
			s.Logf("egress-proxy: refused CONNECT %s for revision %s: always denied", dst, claims.Revision)
			http.Error(w, "destination refused: loopback, link-local, multicast and the fiber network are never reached", http.StatusForbidden)
			return
		}
	}
	select {
	case s.tunnels <- struct{}{}:
	default:
		http.Error(w, fmt.Sprintf("the egress proxy holds its most tunnels (%d); try again", s.MaxTunnels), http.StatusServiceUnavailable)
		return
	}
	release := func() { <-s.tunnels }
	ctx, cancel := context.WithTimeout(r.Context(), s.DialTimeout)
	out, err := s.Dial(ctx, "tcp", dst.String())
	cancel()
	if err != nil {
		release()
		// The message names no address: the caller knows what it asked.
		http.Error(w, "the destination did not accept the connection", http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		release()
		out.Close()
		http.Error(w, "cannot tunnel on this connection", http.StatusInternalServerError)
		return
	}
	in, brw, err := hj.Hijack()
	if err != nil {
		release()
		out.Close()
		return
	}
	if !s.track(in, out) {
		release()
		in.Close()
		out.Close()
		return
	}
	in.SetDeadline(time.Time{})
	if _, err := in.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		s.untrack(in, out)
		release()
		in.Close()
		out.Close()
		return
	}
	go func() {
		defer release()
		defer s.untrack(in, out)
		// Bytes the client sent after its request, already buffered.
		var pre []byte
		if n := brw.Reader.Buffered(); n > 0 {
			pre, _ = brw.Reader.Peek(n)
		}
		Splice(in, pre, out)
	}()
}

// authorize checks the bearer grant: it verifies with Key, has not
// expired and is of this namespace. code 0: authorized.
func (s *Server) authorize(r *http.Request) (signedgrant.Claims, int, string) {
	h := r.Header.Get("Proxy-Authorization")
	if h == "" {
		h = r.Header.Get("Authorization")
	}
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return signedgrant.Claims{}, http.StatusProxyAuthRequired, "a signed grant is required (Proxy-Authorization: Bearer <base64 signed grant>)"
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(tok))
	if err != nil {
		return signedgrant.Claims{}, http.StatusProxyAuthRequired, "the bearer token is not base64"
	}
	c, err := signedgrant.Verify(s.Key, raw, s.Now())
	switch {
	case errors.Is(err, signedgrant.ErrExpired):
		return c, http.StatusProxyAuthRequired, "the signed grant has expired"
	case err != nil:
		return c, http.StatusProxyAuthRequired, "the signed grant does not verify with the grant controller's key"
	case c.Namespace != s.Namespace:
		// A grant of another namespace must not borrow this namespace's
		// network identity.
		return c, http.StatusForbidden, "the signed grant is for another namespace than this egress proxy's"
	}
	return c, 0, ""
}

func (s *Server) track(cs ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	for _, c := range cs {
		s.open[c] = struct{}{}
	}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(cs ...net.Conn) {
	s.mu.Lock()
	for _, c := range cs {
		delete(s.open, c)
	}
	s.mu.Unlock()
	s.wg.Done()
}

// Splice copies a's bytes to b (pre first: what was already read of a)
// and b's to a, with half-close, and closes both when both directions end.
// Between two TCP connections io.Copy splices in the kernel.
func Splice(a net.Conn, pre []byte, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if len(pre) > 0 {
			if _, err := b.Write(pre); err != nil {
				b.Close()
				return
			}
		}
		io.Copy(b, a)
		closeWrite(b)
	}()
	go func() {
		defer wg.Done()
		io.Copy(a, b)
		closeWrite(a)
	}()
	wg.Wait()
	a.Close()
	b.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		c.Close()
	}
}
