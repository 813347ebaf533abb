package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"
)

// closedAfter is a client request body as net/http's server hands it over:
// its bytes, then (the server having closed it once the response started)
// an error for any further read.
type closedAfter struct {
	t      *testing.T
	r      *bytes.Reader
	closed bool
}

func (c *closedAfter) Read(p []byte) (int, error) {
	if c.r.Len() == 0 {
		c.t.Errorf("read past the declared length (the server may have closed the body by now)")
		return 0, http.ErrBodyReadAfterClose
	}
	return c.r.Read(p)
}

func (c *closedAfter) Close() error { c.closed = true; return nil }

// net/http's client reads once more after Content-Length bytes; the body the
// router passes on must answer that read itself (TestReuseTunnelCarriesBodiesBothWays
// lost 1 in ~20 responses to the race it otherwise runs with the server).
func TestDeclaredLengthBodyNeverReadsPastItsLength(t *testing.T) {
	for _, size := range []int{1, 100, 32 << 10, 1<<20 + 7} {
		data := bytes.Repeat([]byte("x"), size)
		under := &closedAfter{t: t, r: bytes.NewReader(data)}
		b := &declaredLengthBody{rc: under, left: int64(size)}
		var out bytes.Buffer
		// What net/http's transferWriter does: copy Content-Length bytes,
		// then read the rest to check for extra bytes.
		if n, err := io.Copy(&out, io.LimitReader(b, int64(size))); err != nil || n != int64(size) {
			t.Fatalf("size %d: copied %d, %v", size, n, err)
		}
		if n, err := io.Copy(io.Discard, b); err != nil || n != 0 {
			t.Fatalf("size %d: the check read got %d bytes, %v; want 0, EOF", size, n, err)
		}
		if !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("size %d: body changed", size)
		}
		b.Close()
		if !under.closed {
			t.Fatalf("size %d: Close did not reach the client's body", size)
		}
	}
	// A client that sends less than it declared (the server's body says
	// ErrUnexpectedEOF) still fails the request.
	short := io.MultiReader(bytes.NewReader([]byte("short")), iotestErr{io.ErrUnexpectedEOF})
	b := &declaredLengthBody{rc: io.NopCloser(short), left: 10}
	if got, err := io.ReadAll(b); !errors.Is(err, io.ErrUnexpectedEOF) || string(got) != "short" {
		t.Fatalf("short body: %q, %v; want \"short\", unexpected EOF", got, err)
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }
