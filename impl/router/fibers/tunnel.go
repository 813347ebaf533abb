package fibers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"time"
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

func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
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
			if err != nil {
				// The response read below may be waiting on a handler
				// that waits for the rest of the body: unblock it.
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
	if ok {
		b.t.put(b.id, b.tc)
		return
	}
	b.tc.conn.Close()
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
