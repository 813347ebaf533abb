package integration

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/router/proxy"
)

// TestNoFiberLeaks runs fresh-mode requests that succeed, are cancelled by
// their client at random points (queued, acquiring, running), or hit the
// Revision's timeout, and requires that afterwards fiberd holds no leased
// fiber and every acquisition was matched by a release.
//
// Every request starts a real process sandbox, and fiberd starts roughly a
// dozen a second on a shared 2-core machine, so the default is 1,000
// requests (well inside go test's 10-minute package limit); the full run is
// LEAK_REQUESTS=10000 go test -timeout 60m -run NoFiberLeaks. The same mix
// at 10,000 requests runs on every go test against the fake fiberd
// (proxy.TestNoFiberLeaks10k).
func TestNoFiberLeaks(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	if v := os.Getenv("LEAK_REQUESTS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	const timeout = time.Second
	e := startEnv(t, envOptions{
		fiberd: fiberdtest.Options{MaxFibers: 24, WarmFibers: 8},
		// timeoutSeconds 0 falls back to the router default, which (unlike
		// the whole-second metadata field) can be short enough to time out
		// thousands of requests in a test.
		meta:  func(m *routermeta.Metadata) { m.TimeoutSeconds = 0; m.MaxFibers = 16 },
		proxy: func(c *proxy.Config) { c.DefaultTimeout = timeout; c.QueueTimeout = 30 * time.Second },
	})
	var ok, cancelled, timedOut, other atomic.Int64
	var otherMu sync.Mutex
	var otherSample []string
	work := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				kind := i % 10
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				path := "/"
				switch {
				case kind < 7: // success
				case kind < 9: // client cancels somewhere along the way
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(60))*time.Millisecond)
					path = "/sleep?ms=100"
				default: // outlives timeoutSeconds
					path = "/sleep?ms=60000"
				}
				t0 := time.Now()
				resp, err := e.http.Do(e.request(ctx, http.MethodGet, path, nil))
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				elapsed := time.Since(t0)
				cancel()
				switch {
				case err != nil && ctx.Err() != nil:
					cancelled.Add(1)
				case err == nil && resp.StatusCode == http.StatusOK:
					ok.Add(1)
				case err == nil && resp.StatusCode == http.StatusGatewayTimeout:
					timedOut.Add(1)
				case err != nil && elapsed >= timeout:
					// The limit struck after fiberd had begun answering:
					// the router cuts the connection instead of a 504.
					timedOut.Add(1)
				default:
					other.Add(1)
					otherMu.Lock()
					if len(otherSample) < 5 {
						otherSample = append(otherSample, fmt.Sprintf("%s: err=%v resp=%v", path, err, resp))
					}
					otherMu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	t.Logf("%d requests in %s: %d ok, %d cancelled, %d timed out, %d other",
		n, time.Since(start).Round(time.Millisecond), ok.Load(), cancelled.Load(), timedOut.Load(), other.Load())
	if other.Load() != 0 {
		t.Errorf("unexpected outcomes, e.g. %v", otherSample)
	}
	if ok.Load() == 0 || cancelled.Load() == 0 || timedOut.Load() == 0 {
		t.Fatalf("the mix did not exercise every outcome")
	}

	e.assertNoLeasedFibers()
	acquired, released, leaked := e.counter("acquired"), e.counter("released"), e.counter("leaked")
	if acquired != released || leaked != 0 || e.counter("live") != 0 {
		t.Fatalf("acquired %v, released %v, leaked %v, live %v", acquired, released, leaked, e.counter("live"))
	}
	t.Logf("fibers acquired and released: %v", acquired)
}
