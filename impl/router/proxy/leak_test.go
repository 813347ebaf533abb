package proxy_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/internal/fakefiberd"
	"lampyr.dev/serving/impl/router/metrics"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
)

// TestNoFiberLeaks10k drives 10,000 fresh-mode requests (70% succeed, 20%
// are cancelled by the client at a random moment, 10% outlive the timeout)
// through the router at max-scale pressure and requires every fiber the fake
// fiberd leased to be released. The real-fiberd version of this test is
// integration.TestNoFiberLeaks.
func TestNoFiberLeaks10k(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 2000
	}
	pub, minter := routerKey(t)
	fd := fakefiberd.Start("leak-00001-home", pub, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			io.WriteString(w, "done")
		case <-r.Context().Done():
		}
	}))
	defer fd.Close()
	cfg := proxy.DefaultConfig()
	cfg.DefaultTimeout = 50 * time.Millisecond
	cfg.QueueTimeout = 10 * time.Second
	m := metrics.New()
	rt := proxy.New(cfg, fibers.NewFiberdClient(minter), m, nil)
	revision.NewTable(rt).Upsert(routermeta.Metadata{
		Revision: "leak-00001", Namespace: "demo", Ready: true, HomeEndpoint: fd.Endpoint(), HomeKeySHA256: fd.KeySHA256, Home: fd.Home,
		MaxFibers: 8, Mode: "fresh", Protocol: routermeta.ProtocolHTTP1,
	})
	front := httptest.NewServer(rt)
	defer front.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	var ok, cancelled, timedOut atomic.Int64
	var bad sync.Map
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				q := "0"
				switch k := i % 10; {
				case k < 7:
				case k < 9:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
					q = "5"
				default:
					q = "10000"
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/?ms="+q, nil)
				req.Header.Set(proxy.RevisionHeader, "leak-00001")
				req.Header.Set(proxy.NamespaceHeader, "demo")
				t0 := time.Now()
				resp, err := hc.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				elapsed := time.Since(t0)
				cancel()
				switch {
				case err != nil && ctx.Err() != nil:
					cancelled.Add(1)
				case err == nil && resp.StatusCode == 200:
					ok.Add(1)
				case err == nil && resp.StatusCode == http.StatusGatewayTimeout:
					timedOut.Add(1)
				case err != nil && elapsed >= cfg.DefaultTimeout:
					// Cut at the limit after the answer had begun.
					timedOut.Add(1)
				default:
					bad.Store(fmt.Sprintf("q=%s err=%v", q, err), true)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	bad.Range(func(k, _ any) bool { t.Errorf("unexpected outcome: %v", k); return true })
	t.Logf("%d requests: %d ok, %d cancelled, %d timed out", n, ok.Load(), cancelled.Load(), timedOut.Load())
	if ok.Load() == 0 || cancelled.Load() == 0 || timedOut.Load() == 0 {
		t.Fatal("the mix did not exercise every outcome")
	}
	for rt.InFlight() > 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rt.WaitReleases(ctx); err != nil {
		t.Fatal(err)
	}
	acquired, released := fd.Counts()
	if fd.Live() != 0 || acquired != released {
		t.Fatalf("fake fiberd: %d fibers still leased; %d acquired, %d released", fd.Live(), acquired, released)
	}
	if st, _ := rt.PoolStats(revision.Key{Namespace: "demo", Name: "leak-00001"}); st.Live != 0 || st.Queued != 0 {
		t.Fatalf("router pool not empty: %+v", st)
	}
}
