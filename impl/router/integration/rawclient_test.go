package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"os"

	"strconv"
	"strings"
	"testing"
)

// rawClient is a minimal HTTP/1.1 load generator (as wrk is): one
// keep-alive connection per worker, a pre-serialized request, responses
// framed by Content-Length or chunked encoding. It costs a fraction of
// net/http's client, so on a 2-vCPU machine more of the CPU goes to the
// path being measured.
type rawClient struct {
	conns chan *rawConn
}

type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

func newRawClient(b *testing.B, addr string, conc int) *rawClient {
	rc := &rawClient{conns: make(chan *rawConn, conc)}
	for i := 0; i < conc; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		rc.conns <- &rawConn{c: c, br: bufio.NewReaderSize(c, 16<<10)}
	}
	return rc
}

func rawRequest(host, path string, hdr http.Header) []byte {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "GET %s HTTP/1.1\r\nHost: %s\r\n", path, host)
	hdr.Write(&buf)
	buf.WriteString("\r\n")
	return buf.Bytes()
}

// do sends req on a free connection and reads one 200 response.
func (rc *rawClient) do(req []byte) error {
	c := <-rc.conns
	defer func() { rc.conns <- c }()
	if _, err := c.c.Write(req); err != nil {
		return err
	}
	tp := textproto.NewReader(c.br)
	status, err := tp.ReadLine()
	if err != nil {
		return err
	}
	if !strings.HasPrefix(status, "HTTP/1.1 200 ") {
		return fmt.Errorf("status line %q", status)
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return err
	}
	if cl := h.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil {
			return err
		}
		_, err = c.br.Discard(int(n))
		return err
	}
	if h.Get("Transfer-Encoding") == "chunked" {
		_, err := io.Copy(io.Discard, httputil.NewChunkedReader(c.br))
		return err
	}
	return fmt.Errorf("response without Content-Length or chunked encoding")
}

// BenchmarkRouterRaw is BenchmarkRouter's reuse path measured with
// rawClient instead of net/http's client: on two vCPUs the load generator
// shares the CPU with what it measures, and net/http's client costs about as
// much as a proxy hop.
//
//	go test ./impl/router/integration -run '^$' -bench RouterRaw -benchtime 30000x -count 5
func BenchmarkRouterRaw(b *testing.B) {
	conc := 4
	if v := os.Getenv("BENCH_CONCURRENCY"); v != "" {
		fmt.Sscan(v, &conc)
	}
	req := rawRequest("app", "/", http.Header{})
	var base latencies
	b.Run("direct", func(b *testing.B) {
		rc := newRawClient(b, startBareHandler(b), conc)
		base = run(b, conc, func() error { return rc.do(req) })
		base.report(b, latencies{})
	})
	b.Run("direct-procs", func(b *testing.B) {
		ch := make(chan *rawClient, conc)
		for i := 0; i < conc; i++ {
			ch <- newRawClient(b, startBareHandler(b), 1)
		}
		l := run(b, conc, func() error {
			c := <-ch
			defer func() { ch <- c }()
			return c.do(req)
		})
		l.report(b, base)
	})
	b.Run("router-reuse", func(b *testing.B) {
		e := startEnv(b, envOptions{fiberd: fiberdOpts("reuse")})
		host := strings.TrimPrefix(e.url(""), "http://")
		rc := newRawClient(b, host, conc)
		req := rawRequest(host, "/", e.selection())
		l := run(b, conc, func() error { return rc.do(req) }, poolSettled(b, e.fd))
		l.report(b, base)
	})
}
