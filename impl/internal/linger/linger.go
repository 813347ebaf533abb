// Package linger closes a server's connections as RFC 9112 §9.6 asks (RFC
// 7230 §6.6 before it): after its last answer, a server that closes a
// connection its client is still writing to keeps reading, and drops what
// it reads, until the client closes too, instead of closing at once.
//
// Closing at once with unread bytes in the socket makes the kernel answer
// with a reset. A client that is still sending a request body the handler
// never read (Knative lets a handler answer without reading it) then fails
// its write, and Go's http.Transport returns whichever of the write error
// and the answer it sees first: on a busy node, a proxy hop (Traefik before
// fiber-router, fiber-router before fiberd) answered 502 or broke the
// client's connection although the handler had answered. net/http waits
// 500 ms (rstAvoidanceDelay) after half-closing before it closes; a hop
// starved of CPU for longer lost the race. With linger the client's write
// always completes, so only its answer decides.
//
// The wait is bounded by time and bytes, so a client that never closes, or
// keeps sending, costs at most MaxWait and MaxBytes per connection.
package linger

import (
	"io"
	"net"
	"sync"
	"time"
)

// Defaults of Listener.
const (
	DefaultMaxWait  = 5 * time.Second
	DefaultMaxBytes = 64 << 20
)

// Listener wraps ln so that every connection it accepts lingers on Close.
func Listener(ln net.Listener) net.Listener {
	return &listener{Listener: ln, maxWait: DefaultMaxWait, maxBytes: DefaultMaxBytes}
}

// ListenerWith is Listener with explicit bounds.
func ListenerWith(ln net.Listener, maxWait time.Duration, maxBytes int64) net.Listener {
	return &listener{Listener: ln, maxWait: maxWait, maxBytes: maxBytes}
}

type listener struct {
	net.Listener
	maxWait  time.Duration
	maxBytes int64
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	hc, ok := c.(halfCloser)
	if !ok {
		return c, nil
	}
	return &conn{Conn: c, hc: hc, maxWait: l.maxWait, maxBytes: l.maxBytes}, nil
}

type halfCloser interface {
	CloseWrite() error
}

type conn struct {
	net.Conn
	hc       halfCloser
	maxWait  time.Duration
	maxBytes int64
	once     sync.Once
}

// NetConn is the connection underneath (fiberd joins two TCP sockets in
// the kernel for a tunnel).
func (c *conn) NetConn() net.Conn { return c.Conn }

// CloseWrite sends the end of the connection's output (net/http calls it
// before its own 500 ms wait).
func (c *conn) CloseWrite() error { return c.hc.CloseWrite() }

// Close half-closes the connection, then reads and drops what the peer
// still sends until it closes its side, MaxWait passes or MaxBytes were
// read, and only then closes: in the background, so the caller does not
// wait. A peer that already closed ends it at once.
func (c *conn) Close() error {
	c.once.Do(func() {
		c.hc.CloseWrite()
		c.Conn.SetReadDeadline(time.Now().Add(c.maxWait))
		go func() {
			io.Copy(io.Discard, io.LimitReader(c.Conn, c.maxBytes))
			c.Conn.Close()
		}()
	})
	return nil
}
