package proxy

import (
	"bufio"
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
