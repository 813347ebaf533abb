package server

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
)

// answerFirstConn carries an HTTP/1 request into a handler that may answer
// before it has read the request's body, as Knative lets it.
//
// When such a handler then closes its side (Go's server does once it has
// answered and more than 256 KiB of the body is left unread), fiberd's
// remaining writes of the body fail with EPIPE or ECONNRESET while the
// answer already sits in the socket's receive queue (a reset purges the
// send queue, not what was received). net/http's Transport writes the body
// and reads the answer concurrently and returns whichever outcome it sees
// first, so losing that race turned an answered request into a 502
// FiberFailed (issue #19: 6 of 8 fresh-mode requests with a 10 MiB body).
//
// Once a write has failed because the handler's side is gone, further
// writes are dropped as if sent and the read side decides: the answer if
// the handler sent one, the connection's EOF or reset if it did not. No
// dropped byte could have reached the handler anyway. The connection is
// not reused: the handler closed it, so the Transport's reader sees EOF or
// the reset before the connection could be handed out again, and a request
// that found it closed is retried by the Transport only if nothing of it
// was sent (never a replay of a request the handler may have seen).
type answerFirstConn struct {
	net.Conn
	peerGone atomic.Bool
}

func (c *answerFirstConn) Write(p []byte) (int, error) {
	if c.peerGone.Load() {
		return len(p), nil
	}
	n, err := c.Conn.Write(p)
	if err != nil && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		c.peerGone.Store(true)
		return len(p), nil
	}
	return n, err
}
