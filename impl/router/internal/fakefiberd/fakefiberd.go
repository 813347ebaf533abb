// Package fakefiberd is an in-process implementation of the fiberd API
// (docs/contracts.md §4) whose "fibers" are calls into an http.Handler. The
// router's tests use it where the real fiberd (impl/fiberd/fiberdtest) cannot
// show what they need: exactly which headers arrive at fiberd, fiberd
// answers that are hard to provoke (429, 503), and router overhead measured
// without process-sandbox costs.
//
// Like the real fiberd it serves TLS with a Home key (Start; StartPlain
// serves in clear, as a Home of a version before Home keys) and lets in
// only router credentials minted for its own
// Home name with the router key it trusts (impl/fiberd/routercred), on API
// calls, tunnels and proxied requests, and answers 401 otherwise; so every
// router test that gets a fiber proves the router sent that Home's
// credential.
package fakefiberd

import (
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/routercred"
)

// Server is a fake fiberd.
type Server struct {
	*httptest.Server
	// Home is this Home's name: the audience its credentials must name.
	Home string
	// RouterKey is the router public key whose credentials it accepts.
	RouterKey ed25519.PublicKey
	// Handler runs "inside" every fiber.
	Handler http.Handler
	// MaxFibers answers 429 beyond that many leased fibers (0: no cap).
	MaxFibers atomic.Int64
	// Unavailable makes acquire answer 503 NoValidGrant.
	Unavailable atomic.Bool
	// Tunnels serves fiberd's tunnel call (off: answers 404 as a fiberd
	// that predates it does).
	Tunnels atomic.Bool
	// Key is the Home key it serves TLS with (nil: StartPlain), KeySHA256
	// its fingerprint, as router metadata names it.
	Key       ed25519.PrivateKey
	KeySHA256 string

	mu     sync.Mutex
	fibers map[string]*fiber
	next   int
	// LastProxied is the header set of the last request proxied into a fiber,
	// as fiberd received it.
	lastProxied http.Header
	acquired    atomic.Int64
	released    atomic.Int64
	tunnels     atomic.Int64
	refused     atomic.Int64
	// creds are the distinct credentials let in, in order of first use.
	creds []string
}

type fiber struct {
	busy, spent bool
	started     time.Time
}

// Start serves a fake fiberd for the Home named home, trusting credentials
// signed with routerKey's private half, on 127.0.0.1, over TLS with a new
// Home key (HTTP/1.1 and h2 by ALPN), as fiberd serves in a Home.
func Start(home string, routerKey ed25519.PublicKey, h http.Handler) *Server {
	key, err := homekey.Generate()
	if err != nil {
		panic(err)
	}
	return StartWithKey(home, routerKey, h, key)
}

// StartWithKey is Start with a given Home key (a Home whose address another
// Home's key now answers at, say).
func StartWithKey(home string, routerKey ed25519.PublicKey, h http.Handler, key ed25519.PrivateKey) *Server {
	return StartAt("127.0.0.1:0", home, routerKey, h, key)
}

// StartAt is StartWithKey listening on addr: another server at an address
// a Home had (a captured address).
func StartAt(addr, home string, routerKey ed25519.PublicKey, h http.Handler, key ed25519.PrivateKey) *Server {
	s := newServer(home, routerKey, h)
	if addr != "127.0.0.1:0" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			panic(fmt.Sprintf("fakefiberd: listen %s: %v", addr, err))
		}
		s.Server.Listener.Close()
		s.Server.Listener = ln
	}
	cert, err := homekey.Certificate(key, home)
	if err != nil {
		panic(err)
	}
	s.Key, s.KeySHA256 = key, homekey.Fingerprint(key.Public().(ed25519.PublicKey))
	s.Server.Config.Protocols.SetHTTP2(true)
	// fiberd's own TLS configuration (homekey.ServerConfig), with the
	// certificate given directly: httptest would otherwise add its own,
	// which a client that sends no SNI (an IP endpoint) is given first.
	s.Server.TLS = homekey.ServerConfig(nil)
	s.Server.TLS.GetCertificate = nil
	s.Server.TLS.Certificates = []tls.Certificate{cert}
	s.Server.TLS.NextProtos = []string{"h2", "http/1.1"}
	s.Server.StartTLS()
	return s
}

// StartPlain serves a fake fiberd in clear (HTTP/1.1 and h2c), as a Home of
// a Lampyr version before Home keys does.
func StartPlain(home string, routerKey ed25519.PublicKey, h http.Handler) *Server {
	s := newServer(home, routerKey, h)
	s.Server.Config.Protocols.SetUnencryptedHTTP2(true)
	s.Server.Start()
	return s
}

func newServer(home string, routerKey ed25519.PublicKey, h http.Handler) *Server {
	s := &Server{Home: home, RouterKey: routerKey, Handler: h, fibers: map[string]*fiber{}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.Server.Config.Protocols = new(http.Protocols)
	s.Server.Config.Protocols.SetHTTP1(true)
	return s
}

// Endpoint is host:port, as in router metadata.
func (s *Server) Endpoint() string { return s.Listener.Addr().String() }

// authorized checks a "Bearer <credential>" header value as fiberd does, and
// answers 401 itself when the credential is not for this Home.
func (s *Server) authorized(w http.ResponseWriter, header string) bool {
	cred, _ := strings.CutPrefix(header, "Bearer ")
	if _, err := routercred.Verify([]ed25519.PublicKey{s.RouterKey}, cred, s.Home, time.Now()); err != nil {
		s.refused.Add(1)
		writeErr(w, http.StatusUnauthorized, contract.ReasonUnauthorized, "credential refused: "+err.Error())
		return false
	}
	s.mu.Lock()
	if !slices.Contains(s.creds, cred) {
		s.creds = append(s.creds, cred)
	}
	s.mu.Unlock()
	return true
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get(client.FiberHeader); id != "" {
		s.proxy(w, r, id)
		return
	}
	if !s.authorized(w, r.Header.Get("Authorization")) {
		return
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == client.FibersPath:
		if s.Unavailable.Load() {
			w.Header().Set("Retry-After", "1")
			writeErr(w, http.StatusServiceUnavailable, contract.ReasonNoValidGrant, "no valid grant")
			return
		}
		s.mu.Lock()
		if max := s.MaxFibers.Load(); max > 0 && int64(len(s.fibers)) >= max {
			s.mu.Unlock()
			w.Header().Set("Retry-After", "1")
			writeErr(w, http.StatusTooManyRequests, contract.ReasonMaxFibersReached, "maxFibers reached")
			return
		}
		s.next++
		// Fiber ids are unique across Homes, as fiberd's random ones are:
		// one router client holds fibers of several Homes.
		id := s.Home + "-f" + strconv.Itoa(s.next)
		f := &fiber{started: time.Now()}
		s.fibers[id] = f
		s.mu.Unlock()
		s.acquired.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(client.Fiber{ID: id, StartedAt: f.started})
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, client.FibersPath+"/"):
		id := strings.TrimPrefix(r.URL.Path, client.FibersPath+"/")
		s.mu.Lock()
		_, ok := s.fibers[id]
		delete(s.fibers, id)
		s.mu.Unlock()
		if !ok {
			writeErr(w, http.StatusNotFound, contract.ReasonUnknownFiber, id)
			return
		}
		s.released.Add(1)
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tunnel") && s.Tunnels.Load():
		s.tunnel(w, r, strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, client.FibersPath+"/"), "/tunnel"))
	case r.Method == http.MethodGet && r.URL.Path == client.FibersPath:
		s.mu.Lock()
		l := client.FiberList{Fibers: []client.Fiber{}}
		for id, f := range s.fibers {
			st := client.StateAcquired
			if f.busy {
				st = client.StateBusy
			} else if f.spent {
				st = client.StateSpent
			}
			l.Fibers = append(l.Fibers, client.Fiber{ID: id, State: st, StartedAt: f.started})
		}
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(l)
	default:
		writeErr(w, http.StatusNotFound, "NotFound", r.Method+" "+r.URL.Path)
	}
}

func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string) {
	if !s.authorized(w, r.Header.Get(client.ProxyAuthHeader)) {
		return
	}
	free, ok := s.claim(w, id)
	if !ok {
		return
	}
	defer free()
	s.mu.Lock()
	s.lastProxied = r.Header.Clone()
	s.mu.Unlock()
	r.Header.Del(client.FiberHeader)
	r.Header.Del(client.ProxyAuthHeader)
	s.Handler.ServeHTTP(w, r)
}

// claim marks fiber id busy (one request or tunnel at a time) and returns
// the func that frees it; it answers 404 or 409 itself when it cannot.
func (s *Server) claim(w http.ResponseWriter, id string) (func(), bool) {
	s.mu.Lock()
	f, ok := s.fibers[id]
	busy := ok && f.busy
	if ok && !busy {
		f.busy = true
	}
	s.mu.Unlock()
	switch {
	case !ok:
		writeErr(w, http.StatusNotFound, contract.ReasonUnknownFiber, id)
		return nil, false
	case busy:
		writeErr(w, http.StatusConflict, contract.ReasonFiberBusy, id)
		return nil, false
	}
	return func() {
		s.mu.Lock()
		f.busy = false
		s.mu.Unlock()
	}, true
}

// tunnel serves the handler over the hijacked connection, one request at a
// time, holding the fiber busy until the connection closes.
func (s *Server) tunnel(w http.ResponseWriter, r *http.Request, id string) {
	free, ok := s.claim(w, id)
	if !ok {
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		free()
		return
	}
	s.tunnels.Add(1)
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + client.TunnelProtocol + "\r\n\r\n")
	brw.Flush()
	l := &oneConn{c: conn, done: make(chan struct{})}
	var endOnce sync.Once
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.mu.Lock()
			s.lastProxied = r.Header.Clone()
			s.mu.Unlock()
			s.Handler.ServeHTTP(w, r)
		}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				endOnce.Do(func() { free(); close(l.done) })
			}
		},
	}
	go srv.Serve(l)
}

// oneConn is a listener that yields one connection.
type oneConn struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// Refused is how many calls and requests were refused for their credential.
func (s *Server) Refused() int64 { return s.refused.Load() }

// Credentials are the distinct credentials let in, in order of first use.
func (s *Server) Credentials() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.creds)
}

// TunnelsOpened is how many tunnels were opened.
func (s *Server) TunnelsOpened() int64 { return s.tunnels.Load() }

// LastProxied returns the headers of the last proxied request as they
// reached fiberd.
func (s *Server) LastProxied() http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastProxied
}

// Live is the number of leased fibers.
func (s *Server) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.fibers)
}

// Counts returns acquisitions and releases so far.
func (s *Server) Counts() (acquired, released int64) { return s.acquired.Load(), s.released.Load() }

func writeErr(w http.ResponseWriter, status int, reason contract.Reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(client.Error{Reason: reason, Message: fmt.Sprint(msg)})
}
