package proxy_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/internal/fakefiberd"
	"lampyr.dev/serving/impl/router/proxy"
)

// requests sends n GETs at once and returns their statuses and bodies.
func (f *fixture) requests(t *testing.T, n int) ([]int, []string) {
	t.Helper()
	codes, bodies := make([]int, n), make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, body := f.get(t, "/", nil)
			codes[i], bodies[i] = resp.StatusCode, body
		})
	}
	wg.Wait()
	return codes, bodies
}

func allOK(t *testing.T, what string, codes []int, bodies []string) {
	t.Helper()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Fatalf("%s: request %d answered %d %q; want every request held until the new Home serves it", what, i, c, bodies[i])
		}
	}
}

// replaceHome starts a new fake Home and publishes metadata naming it, as
// the controller does once a replacement Home Pod is Ready.
func (f *fixture) replaceHome(t *testing.T) *fakefiberd.Server {
	t.Helper()
	fd := fakefiberd.Start(f.fd.Home, f.fd.RouterKey, http.HandlerFunc(ok))
	t.Cleanup(fd.Close)
	m := f.meta
	m.HomeEndpoint, m.HomeKeySHA256, m.Ready = fd.Endpoint(), fd.KeySHA256, true
	m.Generation++
	f.table.Upsert(m)
	return fd
}

// A Home Pod deleted or evicted: the controller marks the Revision's
// metadata not ready, then publishes the replacement's address once it is
// Ready. Requests arriving in between are held and served by the new Home,
// as Knative's activator holds requests for a Revision without a ready
// Pod. Without the hold (--home-wait=0) they are refused.
func TestRequestsAreHeldWhileTheHomeIsReplaced(t *testing.T) {
	for _, hold := range []bool{true, false} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			f := newFixtureConfig(t, http.HandlerFunc(ok), nil, func(c *proxy.Config) {
				c.HomeWait = 10 * time.Second
				if !hold {
					c.HomeWait = 0
				}
			})
			down := f.meta
			down.Ready, down.HomeEndpoint, down.Generation = false, "", f.meta.Generation+1
			f.table.Upsert(down)
			f.meta = down
			time.AfterFunc(400*time.Millisecond, func() { f.replaceHome(t) })
			start := time.Now()
			codes, bodies := f.requests(t, 5)
			if !hold {
				for i, c := range codes {
					if c != http.StatusServiceUnavailable {
						t.Fatalf("without the hold, request %d answered %d %q; want 503 at once", i, c, bodies[i])
					}
				}
				return
			}
			allOK(t, "metadata not ready, then a new Home", codes, bodies)
			if took := time.Since(start); took < 300*time.Millisecond {
				t.Fatalf("answered after %s: the requests were not held", took)
			}
		})
	}
}

// The Home answers 503 (its grant not yet renewed, or it is draining) and
// then serves again: requests are held meanwhile, not failed.
func TestRequestsAreHeldWhileTheHomeRefuses(t *testing.T) {
	f := newFixtureConfig(t, http.HandlerFunc(ok), nil, func(c *proxy.Config) { c.HomeWait = 10 * time.Second })
	f.fd.Unavailable.Store(true)
	time.AfterFunc(500*time.Millisecond, func() { f.fd.Unavailable.Store(false) })
	codes, bodies := f.requests(t, 5)
	allOK(t, "a Home answering 503 for 500 ms", codes, bodies)
}

// The Home is gone (nothing listens at its address) until the metadata
// names its replacement.
func TestRequestsAreHeldWhileTheHomeCannotBeReached(t *testing.T) {
	f := newFixtureConfig(t, http.HandlerFunc(ok), func(m *routermeta.Metadata) { m.HomeEndpoint = "127.0.0.1:1" },
		func(c *proxy.Config) { c.HomeWait = 10 * time.Second })
	time.AfterFunc(400*time.Millisecond, func() { f.replaceHome(t) })
	codes, bodies := f.requests(t, 3)
	allOK(t, "an unreachable Home, then a new one", codes, bodies)
}

// A Revision whose Home never comes back: the request ends with 503 after
// --home-wait, not at its timeoutSeconds.
func TestAHeldRequestGivesUpAfterHomeWait(t *testing.T) {
	f := newFixtureConfig(t, http.HandlerFunc(ok), nil, func(c *proxy.Config) { c.HomeWait = 700 * time.Millisecond })
	f.fd.Unavailable.Store(true)
	start := time.Now()
	resp, body := f.get(t, "/", nil)
	took := time.Since(start)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("%d %q, want 503 with Retry-After", resp.StatusCode, body)
	}
	if took < 600*time.Millisecond || took > 5*time.Second {
		t.Fatalf("gave up after %s, want about --home-wait (700ms)", took)
	}
}

// At most MaxQueue requests per Revision are held; the rest are refused at
// once, so a tenant's broken Revision cannot pile up the router's requests.
func TestHeldRequestsAreBounded(t *testing.T) {
	f := newFixtureConfig(t, http.HandlerFunc(ok), nil, func(c *proxy.Config) {
		c.HomeWait = 2 * time.Second
		c.MaxQueue = 2
	})
	f.fd.Unavailable.Store(true)
	start := time.Now()
	var mu sync.Mutex
	var fast, slow int
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			t0 := time.Now()
			resp, _ := f.get(t, "/", nil)
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("status %d, want 503", resp.StatusCode)
			}
			if time.Since(t0) < time.Second {
				fast++
			} else {
				slow++
			}
		})
	}
	wg.Wait()
	if slow != 2 || fast != 4 {
		t.Fatalf("%d held for --home-wait, %d refused at once (in %s); want 2 and 4 (--max-queue=2)", slow, fast, time.Since(start))
	}
}
