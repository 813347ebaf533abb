package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	fiberdclient "lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/router/pool"
)

// scripted answers with the given responses in order and records the
// bodies it was sent.
type scripted struct {
	answers []func() *http.Response
	bodies  []string
}

func (s *scripted) RoundTrip(req *http.Request) (*http.Response, error) {
	b := ""
	if req.Body != nil {
		raw, _ := io.ReadAll(req.Body)
		b = string(raw)
	}
	s.bodies = append(s.bodies, b)
	a := s.answers[0]
	s.answers = s.answers[1:]
	return a(), nil
}

func answer(code int, ctype, body string) func() *http.Response {
	return func() *http.Response {
		h := http.Header{}
		if ctype != "" {
			h.Set("Content-Type", ctype)
		}
		return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(body))}
	}
}

var fiberBusy = func() *http.Response {
	r := answer(409, "application/json", `{"reason":"FiberBusy","message":"fiber f1 is serving a request"}`)()
	r.Header.Set(fiberdclient.AnswerHeader, "1")
	return r
}

func TestHandlersOwnFiberBusyPassesThrough(t *testing.T) {
	forged := `{"reason":"FiberBusy","message":"not fiberd"}`
	s := &scripted{answers: []func() *http.Response{answer(409, "application/json", forged)}}
	resp, body := send(t, busyRetry{s}, true, "")
	if resp.StatusCode != 409 || body != forged || len(s.bodies) != 1 {
		t.Fatalf("a handler's own FiberBusy: %d %q after %d tries, want it passed through once", resp.StatusCode, body, len(s.bodies))
	}
}

func send(t *testing.T, rt http.RoundTripper, reused bool, body string) (*http.Response, string) {
	t.Helper()
	ctx := context.WithValue(context.Background(), leaseKey{}, &pool.Lease{Reused: reused})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://fiberd/x", strings.NewReader(body))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestBusyReusedFiberIsRetriedWithTheSameBody(t *testing.T) {
	s := &scripted{answers: []func() *http.Response{fiberBusy, fiberBusy, answer(200, "text/plain", "done")}}
	resp, body := send(t, busyRetry{s}, true, "payload")
	if resp.StatusCode != 200 || body != "done" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if len(s.bodies) != 3 || s.bodies[2] != "payload" {
		t.Fatalf("bodies sent %q, want the payload three times", s.bodies)
	}
}

func TestHandlersOwnConflictPassesThrough(t *testing.T) {
	own := `{"reason":"VersionConflict","message":"stale"}`
	s := &scripted{answers: []func() *http.Response{answer(409, "application/json", own)}}
	resp, body := send(t, busyRetry{s}, true, "")
	if resp.StatusCode != 409 || body != own || len(s.bodies) != 1 {
		t.Fatalf("%d %q after %d tries", resp.StatusCode, body, len(s.bodies))
	}
}

func TestFreshFiberIsNeverRetried(t *testing.T) {
	s := &scripted{answers: []func() *http.Response{fiberBusy}}
	resp, _ := send(t, busyRetry{s}, false, "x")
	if resp.StatusCode != 409 || len(s.bodies) != 1 {
		t.Fatalf("%d after %d tries", resp.StatusCode, len(s.bodies))
	}
}
