package proxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
)

// statusWriter records the status code for metrics. It exposes the wrapped
// writer through Unwrap so ReverseProxy's http.ResponseController still
// reaches Flush (streaming) and Hijack (WebSocket upgrades).
type statusWriter struct {
	http.ResponseWriter
	status int
	// deadline ends a hijacked connection: ReverseProxy closes the fiber's
	// side when the request's context ends, but then waits for the client
	// to close its side too, and a client that never does would hold the
	// fiber's lease past timeoutSeconds (or past a shutdown's hard stop).
	deadline context.Context
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 || (w.status >= 100 && w.status < 200 && code >= 200) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack is also offered directly: a hijack means 101 Switching Protocols
// was relayed, and that is the code worth counting.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.status = http.StatusSwitchingProtocols
		if w.deadline != nil {
			// Closing twice is harmless: the proxy closes c when it is done,
			// and the context ends when the request returns.
			context.AfterFunc(w.deadline, func() { _ = c.Close() })
		}
	}
	return c, rw, err
}

func (w *statusWriter) code() int {
	if w.status == 0 {
		// The handler panicked or the client left before any answer.
		return 499
	}
	return w.status
}

// bufferPool recycles ReverseProxy's copy buffers: every proxied body needs
// one, and allocating 32 KiB per request shows in the benchmark.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *(buffers.Get().(*[]byte)) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// slogWriter carries ReverseProxy's log lines (mostly "client went away")
// into the structured log at debug level.
type slogWriter struct{ l *slog.Logger }

func (s slogWriter) Write(p []byte) (int, error) {
	s.l.Debug("reverse proxy", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}

// declaredLengthBody is a request body of known length as the router sends
// it on: once its Content-Length has been read it says EOF itself, never
// asking the client's body again.
//
// net/http's client, having copied Content-Length bytes, reads the body
// once more to check for extra bytes. The handler may answer as soon as it
// has the last byte, and when the router writes that answer's headers the
// server closes the client's request body (server.go, writeHeader: "the
// remaining body was just consumed, close it"). A check read that loses
// that race gets "invalid Read on closed Body", the client fails the
// request write and drops the connection, and the response being copied
// is cut short: 1 in ~20 4 MiB POSTs under CPU load
// (TestReuseTunnelCarriesBodiesBothWays). The server's own body already
// holds the client to its Content-Length, so the check adds nothing here.
type declaredLengthBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *declaredLengthBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	if b.left <= 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

func (b *declaredLengthBody) Close() error { return b.rc.Close() }
