package portability

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// UnreadBodyTally is what one platform answered to requests whose bodies
// the handler does not read (/echo answers without reading it, as
// Knative allows a handler to).
type UnreadBodyTally struct {
	Requests int
	// Outcomes counts each distinct outcome: "200", "502", or the client's
	// error ("error: unexpected EOF").
	Outcomes map[string]int
	// Continues counts the 100 Continue answers to requests sent with
	// "Expect: 100-continue" (the handler never asks for the body) that
	// arrived before expectContinueTimeout: only a hop that reads the body
	// without being asked sends one that early. LateContinues counts those
	// that arrived later: every Go proxy on the path (Traefik, activator,
	// queue-proxy, fiber-router, fiberd: net/http's ExpectContinueTimeout,
	// 1 s on each) sends the body, and with it a 100 Continue, when its
	// upstream has not answered within 1 s, so how many there are follows
	// how many answers took longer than that (measured: /sleep?ms=1500 gets
	// one at 1.0 s on stock and on Lampyr alike). They are reported, never
	// compared: comparing them compared the machine's load.
	Continues     int
	LateContinues int
	// Leaks are answers that named an internal address (127.0.0.1, a fiber).
	Leaks []string
	// Examples are the first few answers other than 200 (or client
	// errors): when, the request's case, status, request ID and the start
	// of the body, which says which hop answered (Traefik's "Bad Gateway",
	// fiber-router's "fiber-router: ...", the activator's text), so a
	// failure in CI can be traced in that run's dump of the hop's logs.
	Examples []string
	Duration time.Duration
}

// maxUnreadExamples bounds Examples.
const maxUnreadExamples = 3

// Failures is the number of requests not answered 200.
func (t *UnreadBodyTally) Failures() int { return t.Requests - t.Outcomes["200"] }

func (t *UnreadBodyTally) String() string {
	keys := make([]string, 0, len(t.Outcomes))
	for k := range t.Outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s x%d", k, t.Outcomes[k]))
	}
	s := fmt.Sprintf("%d requests in %s: %s; %d 100 Continue (%d after %s, answers slower than that)", t.Requests, t.Duration.Round(time.Millisecond), strings.Join(parts, ", "), t.Continues, t.LateContinues, expectContinueTimeout)
	if len(t.Examples) > 0 {
		s += "; first failures: " + strings.Join(t.Examples, " | ")
	}
	return s
}

func (t *UnreadBodyTally) example(sent time.Time, i int, size int, chunked, expect bool, what string) {
	if len(t.Examples) >= maxUnreadExamples {
		return
	}
	t.Examples = append(t.Examples, fmt.Sprintf("#%d at %s (%d bytes, chunked %t, expect %t, after %s): %s", i, sent.UTC().Format("15:04:05.000"), size, chunked, expect, time.Since(sent).Round(time.Millisecond), what))
}

// unreadBodyCases cycle through sizes, framing and Expect.
var unreadBodyCases = []struct {
	size            int
	chunked, expect bool
}{
	{100 << 10, false, false}, {1 << 20, false, false}, {10 << 20, false, false},
	{100 << 10, true, false}, {1 << 20, true, false},
	{1 << 20, false, true}, {10 << 20, false, true},
}

// expectContinueTimeout is net/http's default (http.DefaultTransport), the
// value of every proxy on both platforms' paths and of this client.
const expectContinueTimeout = time.Second

// UnreadBodies sends n POST /echo requests with bodies the handler does
// not read and tallies the answers.
func UnreadBodies(ctx context.Context, gateway, host string, n int) *UnreadBodyTally {
	t := &UnreadBodyTally{Requests: n, Outcomes: map[string]int{}}
	// ExpectContinueTimeout as Go's default client: a request that expects
	// 100-continue sends its body after 1 s without an answer.
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{ExpectContinueTimeout: expectContinueTimeout, MaxIdleConnsPerHost: 4}}
	bodies := map[int][]byte{}
	for _, c := range unreadBodyCases {
		if bodies[c.size] == nil {
			bodies[c.size] = bytes.Repeat([]byte("b"), c.size)
		}
	}
	// The transport's reader calls the trace: count atomically.
	var early, late atomic.Int64
	start := time.Now()
	for i := 0; i < n; i++ {
		c := unreadBodyCases[i%len(unreadBodyCases)]
		sent := time.Now() // before the request's headers leave: a hop's timer starts later
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			if code == http.StatusContinue {
				if time.Since(sent) < expectContinueTimeout {
					early.Add(1)
				} else {
					late.Add(1)
				}
			}
			return nil
		}}
		var body io.Reader = bytes.NewReader(bodies[c.size])
		if c.chunked {
			body = io.MultiReader(body)
		}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, gateway+"/echo?unread=1", body)
		if err != nil {
			t.Outcomes["error: "+err.Error()]++
			continue
		}
		req.Host = host
		req.Header.Set("Content-Type", "application/octet-stream")
		if c.expect {
			req.Header.Set("Expect", "100-continue")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Outcomes["error: "+err.Error()]++
			t.example(sent, i, c.size, c.chunked, c.expect, "error: "+err.Error())
			continue
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		outcome := fmt.Sprint(resp.StatusCode)
		if err != nil {
			outcome += " (reading: " + err.Error() + ")"
		}
		t.Outcomes[outcome]++
		if resp.StatusCode != 200 || err != nil {
			t.example(sent, i, c.size, c.chunked, c.expect, fmt.Sprintf("%s request-id %q server %q: %.200q", outcome, resp.Header.Get("X-Request-Id"), resp.Header.Get("Server"), raw))
		}
		if resp.StatusCode != 200 && (bytes.Contains(raw, []byte("127.0.0.1")) || bytes.Contains(raw, []byte("fiber "))) {
			t.Leaks = append(t.Leaks, fmt.Sprintf("%d %.200s", resp.StatusCode, raw))
		}
	}
	t.Duration = time.Since(start)
	t.Continues, t.LateContinues = int(early.Load()), int(late.Load())
	return t
}
