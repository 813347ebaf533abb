package revision

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"lampyr.dev/serving/impl/router/metrics"
	"lampyr.dev/serving/impl/router/proxy"
)

// TestHTTPProber: only fiber-router's own answer to a network probe counts.
// The real router handler answers it; a server that answers anything
// (as an unprogrammed cluster IP did on the CI machines: "404, Server:
// keryx"), a server that answers 200 without the hash, and nothing
// listening all do not.
func TestHTTPProber(t *testing.T) {
	router := httptest.NewServer(proxy.New(proxy.Config{}, nil, metrics.New(), nil))
	defer router.Close()
	keryx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Server", "keryx")
		w.WriteHeader(http.StatusNotFound)
	}))
	defer keryx.Close()
	anyOK := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer anyOK.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	p := HTTPProber{}
	ctx := context.Background()
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	if !p.Reachable(ctx, addr(router)) {
		t.Error("fiber-router's answer to the probe was not accepted")
	}
	for name, a := range map[string]string{"a 404 from another server": addr(keryx), "a 200 without the hash": addr(anyOK), "nothing listening": closed} {
		if p.Reachable(ctx, a) {
			t.Errorf("%s was taken for fiber-router", name)
		}
	}
}
