package prober

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// flaky is a fixture-handler-like server that can be told to fail: "/"
// answers 503 while down, "/stream" writes chunks and cuts a stream when
// told, "/ws" echoes and drops its connections when told.
type flaky struct {
	down    atomic.Bool
	cut     atomic.Bool
	dropWS  atomic.Bool
	streams atomic.Int32
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/":
		if f.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "Hello World!")
	case "/stream":
		f.streams.Add(1)
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		d, _ := strconv.Atoi(r.URL.Query().Get("delayms"))
		for i := 0; i < n; i++ {
			if f.cut.Load() {
				return // the stream ends early
			}
			fmt.Fprintf(w, "chunk-%d\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Duration(d) * time.Millisecond):
			}
		}
	case "/ws":
		up := websocket.Upgrader{}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			t, m, err := c.ReadMessage()
			if err != nil || f.dropWS.Load() {
				return
			}
			if err := c.WriteMessage(t, append([]byte("echo: "), m...)); err != nil {
				return
			}
		}
	}
}

func rowOf(t *testing.T, r Report, phase string, kind Kind) Row {
	t.Helper()
	for _, row := range r.Rows {
		if row.Phase == phase && row.Kind == kind {
			return row
		}
	}
	t.Fatalf("no row for phase %q kind %s in\n%s", phase, kind, r.Markdown(0))
	return Row{}
}

// TestProberCountsFailuresInTheirPhase: an outage of each kind of traffic
// is counted in the phase it happened in, with its gap; the phases around
// it are clean.
func TestProberCountsFailuresInTheirPhase(t *testing.T) {
	f := &flaky{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	p := Start(context.Background(), "before", []Target{{Side: "s", Service: "svc", Gateway: srv.URL, Host: "svc.example", Kinds: []Kind{Requests, Stream, WebSocket}}},
		Options{Interval: 20 * time.Millisecond, Timeout: time.Second, StreamChunks: 1000, StreamDelay: 20 * time.Millisecond})
	time.Sleep(400 * time.Millisecond)

	p.Phase("outage")
	f.down.Store(true)
	f.cut.Store(true)
	f.dropWS.Store(true)
	time.Sleep(600 * time.Millisecond)
	f.down.Store(false)
	f.cut.Store(false)
	f.dropWS.Store(false)
	time.Sleep(300 * time.Millisecond)

	p.Phase("after")
	time.Sleep(400 * time.Millisecond)
	r := p.Stop()
	t.Logf("\n%s", r.Markdown(5))

	for _, k := range []Kind{Requests, Stream, WebSocket} {
		before, outage, after := rowOf(t, r, "before", k), rowOf(t, r, "outage", k), rowOf(t, r, "after", k)
		if before.Failed != 0 || after.Failed != 0 {
			t.Errorf("%s: failures outside the outage: before %d, after %d", k, before.Failed, after.Failed)
		}
		if before.Sent < 5 || after.Sent < 5 {
			t.Errorf("%s: too little traffic: before %d, after %d", k, before.Sent, after.Sent)
		}
		if outage.Failed == 0 {
			t.Errorf("%s: the outage was not seen (%d sent, 0 failed)", k, outage.Sent)
		}
		if outage.LongestGap < 400*time.Millisecond {
			t.Errorf("%s: longest gap in the outage %s, want about 600ms", k, outage.LongestGap)
		}
		// Relative, not a wall-clock bound: on a loaded two-core machine
		// (a cluster suite beside it, load 30-77) the gap between two
		// answers before the outage reached 300.4 ms against a bound of
		// 300 ms, while the outage's own gap is 600 ms by construction.
		if before.LongestGap >= outage.LongestGap {
			t.Errorf("%s: longest gap before the outage %s, not shorter than the outage's %s", k, before.LongestGap, outage.LongestGap)
		}
	}
	if r.Failed("s") == 0 || r.Failed("other") != 0 {
		t.Errorf("Failed: s %d, other %d", r.Failed("s"), r.Failed("other"))
	}
	for _, fl := range r.Failures {
		if fl.Phase != "outage" {
			t.Errorf("failure outside the outage: %+v", fl)
		}
		if strings.Contains(fl.Err, strings.TrimPrefix(srv.URL, "http://")) {
			t.Errorf("failure names the gateway's address: %q", fl.Err)
		}
	}
	if !strings.Contains(r.Markdown(0), "| outage | s | svc | requests |") {
		t.Errorf("Markdown lacks the outage row:\n%s", r.Markdown(0))
	}
	if _, err := r.JSON(); err != nil {
		t.Error(err)
	}
}

// TestProberSeesASilentGateway: a gateway that accepts and never answers
// fails every kind within the timeout, and the gap runs to Stop.
func TestProberSeesASilentGateway(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(block)
	p := Start(context.Background(), "silent", []Target{{Side: "s", Service: "svc", Gateway: srv.URL, Host: "svc.example", Kinds: []Kind{Requests, Stream, WebSocket}}},
		Options{Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond, StreamChunks: 10, StreamDelay: 10 * time.Millisecond})
	time.Sleep(900 * time.Millisecond)
	r := p.Stop()
	for _, k := range []Kind{Requests, Stream, WebSocket} {
		row := rowOf(t, r, "silent", k)
		if row.Failed == 0 || row.Failed != row.Sent {
			t.Errorf("%s: %d sent, %d failed; want every attempt failed", k, row.Sent, row.Failed)
		}
		if row.LongestGap < 800*time.Millisecond {
			t.Errorf("%s: longest gap %s, want the whole run", k, row.LongestGap)
		}
	}
}

// TestProberRenewsWebSocketsBeforeTheRevisionTimeout: Knative ends a
// WebSocket at the Revision's timeoutSeconds on both sides; the prober
// closes each one cleanly after WebSocketLife and opens the next, which is
// not a failure, while a server that cuts one is.
func TestProberRenewsWebSocketsBeforeTheRevisionTimeout(t *testing.T) {
	f := &flaky{}
	var conns atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			conns.Add(1)
		}
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	p := Start(context.Background(), "steady", []Target{{Side: "s", Service: "svc", Gateway: srv.URL, Host: "svc.example", Kinds: []Kind{WebSocket}}},
		Options{Interval: 20 * time.Millisecond, Timeout: time.Second, WebSocketLife: 200 * time.Millisecond})
	time.Sleep(900 * time.Millisecond)
	r := p.Stop()
	if n := r.Failed("s"); n != 0 {
		t.Fatalf("%d failures from renewing WebSockets:\n%s", n, r.Markdown(5))
	}
	if n := conns.Load(); n < 3 {
		t.Fatalf("%d WebSockets opened in 900ms with a life of 200ms, want at least 3", n)
	}
}
