package server

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/sockmap"
)

// tunnel serves POST /v1/fibers/{id}/tunnel (docs/contracts.md §4): after
// "101 Switching Protocols" the router's connection is joined to the
// fiber's port, in the kernel (package sockmap) where allowed, otherwise by
// copying; either way nothing is parsed.
//
// What fiberd still enforces on a tunneled fiber: who (the router token),
// exclusivity (the fiber is busy for every other request and tunnel while
// the tunnel is open), the fiber's life (the tunnel ends when the fiber
// does), the grant (it ends when the grant no longer covers the Revision)
// and a silence bound (max of idleTimeoutSeconds and
// maxRequestSeconds without a byte either way ends it, so a router that
// holds a tunnel and sends nothing cannot keep a fiber from idle release).
// What it leaves to the router, which parses the requests anyway: one
// request at a time on the connection (HTTP/1.1 without pipelining) and
// each request's timeoutSeconds. Fresh-mode fibers refuse tunnels: fiberd
// could not see their one request end.
func (s *Server) tunnel(w http.ResponseWriter, r *http.Request) {
	if !headerHasToken(r.Header, "Connection", "upgrade") || !headerHasToken(r.Header, "Upgrade", client.TunnelProtocol) {
		writeErr(w, http.StatusBadRequest, contract.ReasonTunnelRefused, "a tunnel is requested with Connection: Upgrade and Upgrade: "+client.TunnelProtocol)
		return
	}
	l, g, status, reason, msg := s.current()
	if l == nil {
		writeErr(w, status, reason, msg)
		return
	}
	id := r.PathValue("id")
	f, end, err := l.pool.BeginTunnel(r.Context(), id)
	if err != nil {
		writeBeginErr(w, err)
		return
	}
	defer end()
	fc, err := f.Dial(r.Context())
	if err != nil {
		if ferr := f.Err(); ferr != nil {
			err = fmt.Errorf("%w (%v)", err, ferr)
		}
		writeErr(w, http.StatusBadGateway, contract.ReasonFiberFailed, "fiber "+id+": "+err.Error())
		return
	}
	defer fc.Close()
	rc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeErr(w, http.StatusBadRequest, contract.ReasonTunnelRefused, "tunnels need an HTTP/1.1 connection: "+err.Error())
		return
	}
	defer rc.Close()
	// The server's read and write deadlines (ReadHeaderTimeout) must not
	// cut the tunnel.
	rc.SetDeadline(time.Time{})
	// Join the sockets in the kernel before the 101: the router sends its
	// first request only after reading it, so every byte of the tunnel is
	// redirected, none left in a queue the kernel no longer reads for us.
	var pair *sockmap.Pair
	path := "user"
	if sp := s.kernelSplicer(); sp != nil && brw.Reader.Buffered() == 0 {
		raw := rc
		if u, ok := rc.(interface{ NetConn() net.Conn }); ok {
			raw = u.NetConn() // under package linger's wrapper
		}
		rt, ok1 := raw.(*net.TCPConn)
		ft, ok2 := fc.(*net.TCPConn)
		if ok1 && ok2 {
			if pair, err = sp.Join(rt, ft); err != nil {
				s.cfg.Logf("tunnel to fiber %s copies in user space: %v", id, err)
				pair = nil
			} else {
				path = "kernel"
				defer pair.Close()
			}
		}
	}
	// Counted before the 101 goes out: a caller that has read it (and
	// been answered through the tunnel) must find the tunnel counted.
	s.metrics.tunnels.WithLabelValues(path).Inc()
	s.metrics.tunnelsOpen.Inc()
	defer s.metrics.tunnelsOpen.Dec()
	switched := "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + client.TunnelProtocol + "\r\n\r\n"
	brw.WriteString(switched)
	if err := brw.Flush(); err != nil {
		return
	}
	silence := time.Duration(max(g.Execution.IdleTimeoutSeconds, g.MaxRequestSeconds)) * time.Second
	var kernelIdle func() time.Duration
	var delivered func() bool
	if pair != nil {
		kernelIdle = func() time.Duration {
			d, err := pair.Idle()
			if err != nil {
				return 0 // cannot tell: count it as active
			}
			return d
		}
		delivered = func() bool {
			ok, err := pair.Delivered(uint64(len(switched)))
			return ok || err != nil
		}
	}
	// A proxied request checks the grant when it starts; a tunnel carries
	// many, so it ends as soon as the grant it was opened under no longer
	// covers this Revision (expired, replaced, unreadable).
	covered := func() bool {
		cur, _, _, _, _ := s.current()
		return cur == l
	}
	why := splice(rc, brw.Reader, fc, f.Done(), silence, kernelIdle, delivered, covered)
	if why != "" {
		s.cfg.Logf("tunnel to fiber %s closed: %s", id, why)
	}
}

// kernelSplicer loads the sockmap splicer on first use; nil when off or
// refused.
func (s *Server) kernelSplicer() *sockmap.Splicer {
	s.spliceOnce.Do(func() {
		if !s.cfg.KernelSplice {
			return
		}
		sp, err := sockmap.New(maxSplicedTunnels)
		if err != nil {
			s.cfg.Logf("tunnels copy bytes in user space: kernel splicing unavailable: %v", err)
			return
		}
		s.splicer = sp
		s.cfg.Logf("tunnels are spliced in the kernel (BPF sockmap): their bytes do not pass through fiberd")
	})
	return s.splicer
}

// grantCheck is how often an open tunnel re-checks the grant.
const grantCheck = time.Second

// maxSplicedTunnels bounds tunnels joined in the kernel at once; more are
// copied in user space.
const maxSplicedTunnels = 4096

// splice carries router <-> fiber until either side closes, the fiber ends
// or nothing moved for silence (0: no bound). Bytes that reach fiberd are
// copied; with kernelIdle set the sockets are joined in the kernel, reads
// here only see the ends, and kernelIdle says how long since the kernel
// last moved a byte. covered is polled every grantCheck; the tunnel ends
// when it turns false. delivered (kernel joins only) says whether the
// fiber's bytes have all reached the router. It returns why it ended when
// fiberd ended it, "" when a side closed.
func splice(router net.Conn, routerR *bufio.Reader, fiber net.Conn, fiberDone <-chan struct{}, silence time.Duration, kernelIdle func() time.Duration, delivered func() bool, covered func() bool) string {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	// done carries which pump ended (fromFiber: fiber -> router) and
	// whether its source ended (srcEnded) or its destination refused a write.
	type pumpEnd struct{ fromFiber, srcEnded bool }
	done := make(chan pumpEnd, 2)
	pump := func(dst net.Conn, src interface{ Read([]byte) (int, error) }, fromFiber bool) {
		end := pumpEnd{fromFiber: fromFiber}
		defer func() { done <- end }()
		bp := tunnelBuffers.Get().(*[]byte)
		defer tunnelBuffers.Put(bp)
		buf := *bp
		for {
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				end.srcEnded = true
				return
			}
		}
	}
	go pump(fiber, routerR, false)
	go pump(router, fiber, true)
	closeBoth := func() { router.Close(); fiber.Close() }
	pending := 2
	// wait collects the pumps still running once both sockets are closed.
	wait := func() {
		for ; pending > 0; pending-- {
			<-done
		}
	}
	// linger gives the pump still running lingerAfterFiber to end by
	// itself, once one side's end has been passed on to the other.
	linger := func() {
		if pending == 0 {
			return
		}
		t := time.NewTimer(lingerAfterFiber)
		defer t.Stop()
		select {
		case <-done:
			pending--
		case <-t.C:
		}
	}
	var tick <-chan time.Time
	var timer *time.Timer
	if silence > 0 {
		timer = time.NewTimer(silence)
		defer timer.Stop()
		tick = timer.C
	}
	grant := time.NewTicker(grantCheck)
	defer grant.Stop()
	for {
		select {
		case <-grant.C:
			if covered() {
				continue
			}
			closeBoth()
			wait()
			return "the grant no longer covers this Revision"
		case e := <-done:
			pending--
			if !e.fromFiber && !e.srcEnded {
				// The handler stopped reading (it may answer without
				// reading the whole body, and close): its answer can
				// still be on its way back. Keep carrying fiber -> router.
				continue
			}
			if !e.fromFiber {
				// The router closed: pass the end on, give the handler
				// lingerAfterFiber to finish, then end the tunnel (a
				// handler that ignores the end does not keep its fiber
				// busy).
				closeWrite(fiber)
				linger()
				closeBoth()
				wait()
				return ""
			}
			// The handler has said all it will say. The router gets its
			// last bytes and then an EOF: a FIN after them, never a reset
			// that could discard them while the router is still sending
			// (a body the handler did not read). Then the tunnel ends,
			// once the router closes or after lingerAfterFiber.
			if delivered != nil {
				// Joined in the kernel: the handler's last bytes may still
				// be on their way out to the router.
				for end := time.Now().Add(lingerAfterFiber); !delivered() && time.Now().Before(end); {
					time.Sleep(time.Millisecond)
				}
			}
			closeWrite(router)
			linger()
			closeBoth()
			wait()
			return ""
		case <-fiberDone:
			closeBoth()
			wait()
			return "the fiber ended"
		case <-tick:
			idle := time.Since(time.Unix(0, last.Load()))
			if kernelIdle != nil {
				idle = min(idle, kernelIdle())
			}
			if idle < silence {
				timer.Reset(silence - idle)
				continue
			}
			closeBoth()
			wait()
			return fmt.Sprintf("nothing sent either way for %s (max of idleTimeoutSeconds and maxRequestSeconds)", silence)
		}
	}
}

// lingerAfterFiber is how long a tunnel whose handler closed its side
// waits for the router to close too, so that the handler's last bytes are
// delivered before the connection is torn down (net/http's server waits
// as long for the same reason, rstAvoidanceDelay).
const lingerAfterFiber = 500 * time.Millisecond

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

var tunnelBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyBuffers recycles the proxy path's 32 KiB copy buffers.
type copyBuffers struct{}

func (copyBuffers) Get() []byte  { return *(tunnelBuffers.Get().(*[]byte)) }
func (copyBuffers) Put(b []byte) { tunnelBuffers.Put(&b) }

// headerHasToken reports whether a comma-separated header contains token
// (case-insensitive).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
