package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"knative.dev/networking/pkg/http/header"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/proxy"
)

func TestHTTPFreshRequestRunsInItsOwnFiber(t *testing.T) {
	e := startEnv(t, envOptions{})
	for i := 0; i < 3; i++ {
		req := e.request(context.Background(), http.MethodPost, "/echo?x=1", strings.NewReader("payload"))
		req.Header.Set("Authorization", "Bearer user-token")
		req.Header.Set(header.HashKey, "some-hash")
		req.Header.Set("Lampyr-Fiber", "someone-elses-fiber")
		req.Header.Set("Lampyr-Fiberd-Authorization", "Bearer forged")
		resp, body := e.do(req)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		s := decodeSeen(t, body)
		if s.Served != 1 {
			t.Fatalf("request %d ran in a fiber that had served %d requests before: fresh mode needs a new fiber per request", i, s.Served-1)
		}
		if s.KRevision != e.meta.Revision || s.Method != http.MethodPost || s.Body != "payload" {
			t.Fatalf("handler saw %+v", s)
		}
		if s.Host != "hello.default.example.com" {
			t.Fatalf("handler saw Host %q, want the client's", s.Host)
		}
		for _, h := range []string{proxy.RevisionHeader, proxy.NamespaceHeader, header.HashKey, "Lampyr-Fiber", "Lampyr-Fiberd-Authorization"} {
			if hasHeader(s.Headers, h) {
				t.Errorf("internal header %s reached the handler: %v", h, s.Headers)
			}
		}
		if got := s.Headers["Authorization"]; len(got) != 1 || got[0] != "Bearer user-token" {
			t.Errorf("client's Authorization = %v, want it untouched", got)
		}
		if got := s.Headers["X-Request-Id"]; len(got) != 1 || len(got[0]) != 32 {
			t.Errorf("X-Request-Id = %v, want a generated id", got)
		}
	}
	e.assertNoLeasedFibers()
	if a, r := e.counter("acquired"), e.counter("released"); a != 3 || r != 3 {
		t.Fatalf("acquired %v, released %v; want 3 and 3", a, r)
	}
	if n := e.requests("200"); n != 3 {
		t.Fatalf("requests_total{code=200} = %v, want 3", n)
	}
}

func TestRequestIDIsKept(t *testing.T) {
	e := startEnv(t, envOptions{})
	req := e.request(context.Background(), http.MethodGet, "/", nil)
	req.Header.Set("X-Request-Id", "from-the-gateway")
	_, body := e.do(req)
	if got := decodeSeen(t, body).Headers["X-Request-Id"]; len(got) != 1 || got[0] != "from-the-gateway" {
		t.Fatalf("X-Request-Id = %v, want the gateway's", got)
	}
}

func TestReuseKeepsOneFiberAndOneRequestPerFiber(t *testing.T) {
	e := startEnv(t, envOptions{fiberd: fiberdOpts("reuse")})
	for i := 1; i <= 3; i++ {
		_, body := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
		if s := decodeSeen(t, body); s.Served != int64(i) {
			t.Fatalf("sequential request %d was its fiber's request %d: reuse must keep the live fiber", i, s.Served)
		}
	}
	if a := e.counter("acquired"); a != 1 {
		t.Fatalf("acquired %v fibers for sequential requests, want 1", a)
	}
	// While one request holds the fiber, a second needs its own fiber.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := e.http.Do(e.request(ctx, http.MethodGet, "/stream?n=1&hold=1", nil))
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "chunk 0\n" {
		t.Fatalf("stream: %q %v", line, err)
	}
	_, body := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	if s := decodeSeen(t, body); s.Served != 1 {
		t.Fatalf("concurrent request ran in a busy fiber (its request %d)", s.Served)
	}
	cancel()
	resp.Body.Close()
	e.settle()
	if a := e.counter("acquired"); a != 2 {
		t.Fatalf("acquired %v fibers, want 2", a)
	}
}

func TestStreamedResponseIsObservedIncrementally(t *testing.T) {
	e := startEnv(t, envOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The handler keeps the response open after its chunks, so reading all
	// of them proves the router forwards each as it comes instead of
	// buffering the body.
	resp, err := e.http.Do(e.request(ctx, http.MethodGet, "/stream?n=3&hold=1", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ContentLength != -1 {
		t.Fatalf("streamed response has Content-Length %d", resp.ContentLength)
	}
	r := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if want := "chunk " + string(rune('0'+i)) + "\n"; line != want {
			t.Fatalf("chunk %d = %q, want %q", i, line, want)
		}
	}
	if live := e.counter("live"); live != 1 {
		t.Fatalf("fibers live during the stream = %v, want 1", live)
	}
	cancel()
	e.assertNoLeasedFibers()
}

func TestServerSentEvents(t *testing.T) {
	e := startEnv(t, envOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := e.request(ctx, http.MethodGet, "/sse?n=3", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	r := bufio.NewReader(resp.Body)
	var events []string
	for len(events) < 3 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", len(events), err)
		}
		if strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimSpace(strings.TrimPrefix(line, "data: ")))
		}
	}
	if strings.Join(events, ",") != "tick 0,tick 1,tick 2" {
		t.Fatalf("events %v", events)
	}
	cancel()
	e.assertNoLeasedFibers()
}

func TestHandlerCrashMidStreamStillReleasesTheFiber(t *testing.T) {
	e := startEnv(t, envOptions{})
	resp, err := e.http.Do(e.request(context.Background(), http.MethodGet, "/crash", nil))
	if err == nil {
		// If the crash beat the response headers, fiberd answers 502: the
		// failure is reported. If a 200 had begun, its body must end in an
		// error, not a clean EOF.
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode < 500 {
			t.Fatalf("a response cut by the handler's crash ended cleanly (status %d)", resp.StatusCode)
		}
	}
	e.assertNoLeasedFibers()
	if r := e.counter("released"); r != 1 {
		t.Fatalf("released %v, want 1", r)
	}
}

// The Knative runtime contract promises the handler Forwarded (MUST) and
// X-Forwarded-For/-Proto (SHOULD). The router sends them to fiberd (see
// proxy.TestHeadersAsFiberdReceivesThem); this checks they reach the handler.
func TestForwardedHeadersReachTheHandler(t *testing.T) {
	e := startEnv(t, envOptions{})
	_, body := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	s := decodeSeen(t, body)
	xff := s.Headers["X-Forwarded-For"]
	if len(xff) != 1 || !strings.HasPrefix(xff[0], "203.0.113.7, 127.0.0.1") {
		t.Errorf("X-Forwarded-For = %v, want the gateway's value with the router's peer appended", xff)
	}
	if got := s.Headers["X-Forwarded-Proto"]; len(got) != 1 || got[0] != "https" {
		t.Errorf("X-Forwarded-Proto = %v, want the gateway's https", got)
	}
	if got := s.Headers["Forwarded"]; len(got) != 1 || got[0] != "for=203.0.113.7;proto=https" {
		t.Errorf("Forwarded = %v, want queue-proxy's shim of the gateway's X-Forwarded-*", got)
	}
}

func TestReuseReleasesIdleFibers(t *testing.T) {
	// fiberd would keep an idle fiber 30s; the Revision's metadata says 1s,
	// so only the router can have released it.
	e := startEnv(t, envOptions{fiberd: fiberdOpts("reuse"), meta: func(m *routermeta.Metadata) { m.IdleTimeoutSeconds = 1 }})
	e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	if len(e.leased()) != 1 {
		t.Fatalf("after one request in reuse mode fiberd holds %d fibers, want 1", len(e.leased()))
	}
	waitFor(t, "the idle fiber to be released", 30*time.Second, func() bool { return e.counter("released") == 1 })
	e.assertNoLeasedFibers()
}

// Back-to-back requests in reuse mode hand a fiber to the next request the
// moment the previous response is complete, which can be before fiberd has
// marked it free (fiberd then says 409 FiberBusy). Every request must still
// get the handler's answer.
func TestReuseBackToBackRequestsAllSucceed(t *testing.T) {
	e := startEnv(t, envOptions{fiberd: fiberdOpts("reuse")})
	errs := make(chan string, 400)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				resp, err := e.http.Do(e.request(context.Background(), http.MethodGet, "/", nil))
				if err != nil {
					errs <- err.Error()
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Sprintf("%d %s", resp.StatusCode, b)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if a := e.counter("acquired"); a > 4 {
		t.Fatalf("%v fibers acquired for 4 sequential streams of requests in reuse mode", a)
	}
}
