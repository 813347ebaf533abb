package fibers

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tunnelTransport is the router's HTTP/1.1 client over fiber tunnels.
//
// A fiber serves one request at a time and the router's pool leases it to
// one request at a time, so a tunnel needs none of http.Transport's
// connection pooling, and none of its per-connection read and write
// goroutines: the request is written and the response read on the caller's
// goroutine. On a two-vCPU machine those goroutine hand-offs (and the
// thread wake-ups behind them) cost as much as the bytes. Framing is the
// standard library's: Request.Write and http.ReadResponse.
//
// A request body is written from its own goroutine while the response is
// read, as http.Transport does, so a handler may answer before it has read
// the whole body. 1xx responses are passed to an httptrace hook
// (ReverseProxy forwards them) and skipped; a 101 hands the connection to
// the caller as the response body (a WebSocket, say) and it is not reused.
type tunnelTransport struct {
	dial func(ctx context.Context, id string) (net.Conn, error)

	mu   sync.Mutex
	idle map[string]*tunnelConn // fiber id -> its open tunnel between requests
}

type tunnelConn struct {
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
}

func newTunnelTransport(dial func(ctx context.Context, id string) (net.Conn, error)) *tunnelTransport {
	return &tunnelTransport{dial: dial, idle: map[string]*tunnelConn{}}
}

func (t *tunnelTransport) take(id string) *tunnelConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	tc := t.idle[id]
	delete(t.idle, id)
	return tc
}

func (t *tunnelTransport) put(id string, tc *tunnelConn) {
	t.mu.Lock()
	old := t.idle[id]
	t.idle[id] = tc
	t.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
}

// drop closes fiber id's idle tunnel (the fiber is being released).
func (t *tunnelTransport) drop(id string) {
	if tc := t.take(id); tc != nil {
		tc.conn.Close()
	}
}

// errStale: a kept tunnel had been closed by fiberd (silence bound, or
// the fiber ended) before any of the response arrived.
var errStale = errors.New("tunnel closed before the response")

func (t *tunnelTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	id, ok := TunnelFiberID(req)
	if !ok {
		return nil, fmt.Errorf("tunnel transport: %q is not a fiber tunnel host", req.URL.Host)
	}
	ctx := req.Context()
	tc := t.take(id)
	if tc != nil && !quiet(tc) {
		tc.conn.Close()
		tc = nil
	}
	if tc != nil {
		resp, err := t.roundTrip(ctx, id, tc, req)
		// A kept connection fiberd already closed fails before anything was
		// read; send once more on a new tunnel if the request can be sent
		// again, as http.Transport does for idle connections.
		if !errors.Is(err, errStale) || ctx.Err() != nil || !replayable(req) {
			return resp, err
		}
		if req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
	}
	conn, err := t.dial(ctx, id)
	if err != nil {
		return nil, err
	}
	tc = &tunnelConn{conn: conn, br: bufio.NewReaderSize(conn, 16<<10), bw: bufio.NewWriterSize(conn, 8<<10)}
	resp, err := t.roundTrip(ctx, id, tc, req)
	if errors.Is(err, errStale) {
		err = io.ErrUnexpectedEOF
	}
	return resp, err
}

// replayable: a request that may have reached the handler is sent again
// only if doing so twice is harmless, as http.Transport decides: its body
// can be had again and its method is idempotent (or it carries an
// idempotency key). A POST or DELETE is never replayed, body or not.
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// quiet reports whether an idle tunnel can carry a request: nothing has
// arrived on it since its last response (a handler writing unsolicited
// bytes would have them read as the next user's response) and fiberd has
// not closed it. Nothing is sent on a tunnel that is not quiet, so a new
// one can be dialled without any question of replay.
func quiet(tc *tunnelConn) bool {
	if tc.br.Buffered() > 0 {
		return false
	}
	raw := tc.conn
	if t, ok := raw.(*tls.Conn); ok {
		// Bytes on the socket under TLS are bytes the Home sent: a record
		// of unsolicited data, or its close_notify.
		raw = t.NetConn()
	}
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return true // cannot look without blocking; the response read still checks framing
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var perr error
	if err := rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, perr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return true
	}); err != nil {
		return false
	}
	// EAGAIN: nothing there, still open. No error: a byte is waiting
	// (unsolicited) or the peer closed (EOF). Any other error: reset.
	return errors.Is(perr, unix.EAGAIN)
}

var aLongTimeAgo = time.Unix(1, 0)

// maxWriteWait is how long a finished response waits for its request's
// body write to end before the connection is given up instead of reused.
const maxWriteWait = 50 * time.Millisecond

func (t *tunnelTransport) roundTrip(ctx context.Context, id string, tc *tunnelConn, req *http.Request) (*http.Response, error) {
	// Cancellation (client gone, timeoutSeconds, drain) ends every read and
	// write on the connection; it is then never reused.
	stop := context.AfterFunc(ctx, func() { tc.conn.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		stop()
		tc.conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
	var wrote chan error
	var body *tunnelReqBody
	if hasBody {
		body = &tunnelReqBody{rc: req.Body, flush: tc.bw.Flush}
		if expectsContinue(req) {
			body.gate = make(chan bool, 1)
		}
		out := *req
		out.Body = body
		req = &out
	}
	if !hasBody {
		if err := req.Write(tc.bw); err != nil {
			return fail(err)
		}
		if err := tc.bw.Flush(); err != nil {
			return fail(err)
		}
	} else {
		wrote = make(chan error, 1)
		go func() {
			err := req.Write(tc.bw)
			if err == nil {
				err = tc.bw.Flush()
			}
			if err != nil && body.readErr() != nil {
				// The client's body failed: the response read below may
				// be waiting on a handler that waits for the rest of it,
				// so unblock it. A write that failed because the handler
				// closed its side leaves the read alone: its answer may
				// be there (a handler may answer without reading the
				// body); the connection is not reused either way.
				tc.conn.SetDeadline(aLongTimeAgo)
			}
			wrote <- err
		}()
	}
	trace := httptrace.ContextClientTrace(ctx)
	for {
		if _, err := tc.br.Peek(1); err != nil {
			if wrote != nil {
				<-wrote
			}
			if isEOF(err) {
				return fail(errStale)
			}
			return fail(err)
		}
		resp, err := http.ReadResponse(tc.br, req)
		if err != nil {
			if wrote != nil {
				<-wrote
			}
			return fail(err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			if resp.StatusCode == http.StatusContinue && body != nil {
				body.open(true)
			}
			if trace != nil && trace.Got1xxResponse != nil {
				if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
					return fail(err)
				}
			}
			continue
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// The caller owns the connection now; cancellation still ends it.
			resp.Body = &upgraded{tc: tc, stop: stop}
			return resp, nil
		}
		if body != nil {
			// A final answer before a 100 Continue: the handler does not
			// want the body, which is then not sent (the connection is
			// not reused).
			body.open(false)
		}
		b := &tunnelBody{t: t, id: id, tc: tc, stop: stop, wrote: wrote,
			reuse: !resp.Close && !req.Close && resp.ProtoAtLeast(1, 1)}
		if resp.Body == http.NoBody {
			b.finish(true)
			return resp, nil
		}
		b.rc = resp.Body
		resp.Body = b
		return resp, nil
	}
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// tunnelBody returns the connection for the fiber's next request once the
// response was read to its end, and closes it otherwise.
type tunnelBody struct {
	t     *tunnelTransport
	id    string
	tc    *tunnelConn
	rc    io.ReadCloser
	stop  func() bool
	wrote chan error
	reuse bool

	mu   sync.Mutex
	done bool
}

func (b *tunnelBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.finish(true)
	} else if err != nil {
		b.finish(false)
	}
	return n, err
}

func (b *tunnelBody) Close() error {
	b.finish(false)
	return nil
}

func (b *tunnelBody) finish(atEOF bool) {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return
	}
	b.done = true
	b.mu.Unlock()
	cancelled := !b.stop()
	ok := atEOF && b.reuse && !cancelled
	if b.wrote != nil && ok {
		// The write usually ends just before the response does; wait for
		// it briefly, as http.Transport does (maxWriteWaitBeforeConnReuse).
		// A handler that answered without reading the whole body would
		// get the rest of it as its next request: drop the connection.
		select {
		case err := <-b.wrote:
			ok = err == nil
		default:
			t := time.NewTimer(maxWriteWait)
			select {
			case err := <-b.wrote:
				ok = err == nil
			case <-t.C:
				ok = false
			}
			t.Stop()
		}
	}
	// Bytes after the response's end are not the next response: a
	// handler that writes more than it framed (a body on a HEAD or 204
	// answer, an extra response) would shift every later user's answer.
	if ok && b.tc.br.Buffered() == 0 {
		b.t.put(b.id, b.tc)
		return
	}
	b.tc.conn.Close()
}

// continueTimeout is how long a request that expects 100-continue waits
// for it before its body is sent anyway (http.DefaultTransport's value,
// which Knative's transports keep).
const continueTimeout = time.Second

// errBodyNotWanted ends a body write when the handler answered an
// "Expect: 100-continue" request without asking for the body.
var errBodyNotWanted = errors.New("the handler answered without asking for the body")

func expectsContinue(req *http.Request) bool {
	for _, v := range req.Header.Values("Expect") {
		if strings.EqualFold(strings.TrimSpace(v), "100-continue") {
			return true
		}
	}
	return false
}

// tunnelReqBody is a request body on its way into a tunnel: it tells a
// failure of the client's body from a failure to write into the tunnel,
// and, when the request expects 100-continue, holds the body back (the
// headers flushed) until the handler's 100 Continue, its final answer or
// continueTimeout.
type tunnelReqBody struct {
	rc    io.ReadCloser
	flush func() error
	gate  chan bool // nil: no 100-continue; true: send the body, false: do not

	waited bool
	send   bool
	mu     sync.Mutex
	err    error
}

func (b *tunnelReqBody) open(send bool) {
	if b.gate == nil {
		return
	}
	select {
	case b.gate <- send:
	default:
	}
}

func (b *tunnelReqBody) Read(p []byte) (int, error) {
	if b.gate != nil && !b.waited {
		// Request.Write calls this on its own goroutine after writing the
		// headers into the buffer: send them, then wait.
		b.waited = true
		if err := b.flush(); err != nil {
			return 0, err
		}
		t := time.NewTimer(continueTimeout)
		select {
		case b.send = <-b.gate:
		case <-t.C:
			b.send = true
		}
		t.Stop()
	}
	if b.gate != nil && !b.send {
		return 0, errBodyNotWanted
	}
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		b.mu.Lock()
		b.err = err
		b.mu.Unlock()
	}
	return n, err
}

func (b *tunnelReqBody) Close() error { return b.rc.Close() }

// readErr is the client's body's failure, if it failed.
func (b *tunnelReqBody) readErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// upgraded is a 101 response's body: the connection itself.
type upgraded struct {
	tc   *tunnelConn
	stop func() bool
	once sync.Once
}

func (u *upgraded) Read(p []byte) (int, error)  { return u.tc.br.Read(p) }
func (u *upgraded) Write(p []byte) (int, error) { return u.tc.conn.Write(p) }
func (u *upgraded) Close() error {
	u.once.Do(func() { u.stop() })
	return u.tc.conn.Close()
}
