package portability

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUnreadBodiesTellsEagerFromLateContinues: a 100 Continue sent at once
// (a hop that reads the body nobody asked for) is counted, and compared;
// one sent after net/http's 1 s ExpectContinueTimeout (what every proxy
// does for an answer slower than that) is reported apart.
func TestUnreadBodiesTellsEagerFromLateContinues(t *testing.T) {
	// 7 requests: one of each case, two of them with Expect: 100-continue.
	const n = 7
	for _, tc := range []struct {
		name        string
		handler     http.HandlerFunc
		early, late int
	}{
		{"does not read", func(w http.ResponseWriter, r *http.Request) {}, 0, 0},
		{"reads at once", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
		}, 2, 0},
		{"reads after the timeout", func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Expect") != "" {
				time.Sleep(expectContinueTimeout + 200*time.Millisecond)
			}
			_, _ = io.Copy(io.Discard, r.Body)
		}, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			got := UnreadBodies(context.Background(), srv.URL, "h.example.com", n)
			if got.Failures() != 0 || got.Continues != tc.early || got.LateContinues != tc.late {
				t.Fatalf("%s; want %d answered 200, %d 100 Continue before %s and %d after", got, n, tc.early, expectContinueTimeout, tc.late)
			}
		})
	}
}

// TestUnreadBodiesNamesTheHopThatFailed: a failure's example carries the
// status, request ID and body start (which hop answered), bounded to
// maxUnreadExamples.
func TestUnreadBodiesNamesTheHopThatFailed(t *testing.T) {
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		if n%2 == 0 {
			w.Header().Set("X-Request-Id", "req-"+strconv.Itoa(n))
			http.Error(w, "fiber-router: the fiber failed before it answered", http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	got := UnreadBodies(context.Background(), srv.URL, "h.example.com", 10)
	if got.Failures() != 5 || len(got.Examples) != maxUnreadExamples {
		t.Fatalf("%s; want 5 failures and %d examples", got, maxUnreadExamples)
	}
	if s := got.String(); !strings.Contains(s, `502 request-id "req-2"`) || !strings.Contains(s, "the fiber failed before it answered") {
		t.Fatalf("the tally does not name the failing answer: %s", s)
	}
}
