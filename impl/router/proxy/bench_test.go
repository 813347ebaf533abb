package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/internal/fakefiberd"
	"lampyr.dev/serving/impl/router/metrics"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
)

// BenchmarkRouterOverhead isolates fiber-router's own cost from fiberd's
// sandbox costs, with the in-process fake fiberd (impl/router/internal/
// fakefiberd) whose "fibers" are calls into a handler:
//
//	handler      client -> handler (httptest server)
//	fiberd       client -> fake fiberd -> handler, fiber leased once
//	router-reuse client -> router -> tunnel through fake fiberd -> handler
//	router-fresh client -> router -> acquire + proxy + release per request
//
// router_p50_ms / router_p99_ms are the router cases minus "fiberd": the
// latency fiber-router adds. The end-to-end numbers with real process
// fibers are integration.BenchmarkRouter. Concurrency: BENCH_CONCURRENCY
// (default 4).
//
//	go test ./impl/router/proxy -run '^$' -bench RouterOverhead -benchtime 3s
func BenchmarkRouterOverhead(b *testing.B) {
	conc := 4
	if v := os.Getenv("BENCH_CONCURRENCY"); v != "" {
		fmt.Sscan(v, &conc)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello\n") })
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	get := func(url string, hdr http.Header) func() error {
		return func() error {
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			for k, v := range hdr {
				req.Header[k] = v
			}
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return err
		}
	}

	var handler, viaFiberd lat
	b.Run("handler", func(b *testing.B) {
		s := httptest.NewServer(hello)
		defer s.Close()
		handler = measure(b, conc, get(s.URL+"/", nil))
		handler.report(b, lat{}, "")
	})
	b.Run("fiberd", func(b *testing.B) {
		pub, minter := routerKey(b)
		fd := fakefiberd.Start("bench-00001-home", pub, hello)
		defer fd.Close()
		c := fibers.NewFiberdClient(minter)
		cred, err := minter.For(fd.Home)
		if err != nil {
			b.Fatal(err)
		}
		ids := make(chan string, conc)
		for i := 0; i < conc; i++ {
			f, err := c.Acquire(context.Background(), fibers.Home{Endpoint: fd.Endpoint(), Name: fd.Home, KeySHA256: fd.KeySHA256})
			if err != nil {
				b.Fatal(err)
			}
			ids <- f.ID
		}
		do := func() error {
			id := <-ids
			defer func() { ids <- id }()
			h := http.Header{}
			client.SetFiberHeaders(h, id, cred)
			return get(fd.URL+"/", h)()
		}
		viaFiberd = measure(b, conc, do)
		viaFiberd.report(b, handler, "added")
	})
	for _, mode := range []string{"reuse", "fresh"} {
		b.Run("router-"+mode, func(b *testing.B) {
			pub, minter := routerKey(b)
			fd := fakefiberd.Start("bench-00001-home", pub, hello)
			defer fd.Close()
			fd.Tunnels.Store(true) // reuse goes through a tunnel per fiber
			rt := proxy.New(proxy.DefaultConfig(), fibers.NewFiberdClient(minter), metrics.New(), nil)
			revision.NewTable(rt).Upsert(routermeta.Metadata{
				Revision: "bench-00001", Namespace: "demo", Ready: true, HomeEndpoint: fd.Endpoint(), HomeKeySHA256: fd.KeySHA256, Home: fd.Home,
				MaxFibers: 64, TimeoutSeconds: 60, Mode: mode, IdleTimeoutSeconds: 60, Protocol: routermeta.ProtocolHTTP1,
			})
			front := httptest.NewServer(rt)
			defer front.Close()
			h := http.Header{}
			h.Set(proxy.RevisionHeader, "bench-00001")
			h.Set(proxy.NamespaceHeader, "demo")
			l := measure(b, conc, get(front.URL+"/", h))
			l.report(b, handler, "added")
			l.report(b, viaFiberd, "router")
			b.StopTimer()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = rt.Drain(ctx)
			if fd.Live() != 0 {
				b.Fatalf("%d fibers left after drain", fd.Live())
			}
		})
	}
}

type lat struct {
	samples []time.Duration
	elapsed time.Duration
}

func (l lat) pct(p float64) time.Duration {
	if len(l.samples) == 0 {
		return 0
	}
	s := slices.Clone(l.samples)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (l lat) report(b *testing.B, base lat, prefix string) {
	if prefix == "" || prefix == "added" {
		b.ReportMetric(float64(len(l.samples))/l.elapsed.Seconds(), "req/s")
		b.ReportMetric(msf(l.pct(0.50)), "p50_ms")
		b.ReportMetric(msf(l.pct(0.99)), "p99_ms")
	}
	if prefix != "" && len(base.samples) > 0 {
		b.ReportMetric(msf(l.pct(0.50)-base.pct(0.50)), prefix+"_p50_ms")
		b.ReportMetric(msf(l.pct(0.99)-base.pct(0.99)), prefix+"_p99_ms")
	}
}

func measure(b *testing.B, conc int, do func() error) lat {
	b.Helper()
	for i := 0; i < conc; i++ {
		if err := do(); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	samples := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				if err := do(); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				samples[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	return lat{samples: samples, elapsed: elapsed}
}
