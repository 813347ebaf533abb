package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
)

type hello struct {
	Served    int64               `json:"served"`
	PID       int                 `json:"pid"`
	UID       int                 `json:"uid"`
	Hostname  string              `json:"hostname"`
	Port      string              `json:"port"`
	KRevision string              `json:"k_revision"`
	KService  string              `json:"k_service"`
	Headers   map[string][]string `json:"headers"`
	Proto     string              `json:"proto"`
	Host      string              `json:"host"`
	Env       []string            `json:"env"`
}

func get(t *testing.T, c *client.Client, id, path string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://app.example.com"+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req, id)
	if err != nil {
		t.Fatalf("GET %s in fiber %s: %v", path, id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func decodeHello(t *testing.T, b []byte) hello {
	t.Helper()
	var h hello
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("handler answer %q: %v", b, err)
	}
	return h
}

func TestAcquireServeRelease(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{})
	c := inst.Client
	ctx := context.Background()

	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, c, f.ID, "/", "Authorization", "Bearer user-token", "X-Custom", "v")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	h := decodeHello(t, body)
	if h.PID > 64 {
		t.Errorf("handler pid %d: want a small PID of the fiber's own PID namespace (PID 1 is lampyr-helper)", h.PID)
	}
	if h.UID == 0 {
		t.Errorf("handler runs as root; want an unprivileged uid")
	}
	if h.Port != "8080" || h.KRevision != "hello-00001" || h.KService != "hello" {
		t.Errorf("runtime contract env: PORT=%q K_REVISION=%q K_SERVICE=%q", h.Port, h.KRevision, h.KService)
	}
	if h.Host != "app.example.com" {
		t.Errorf("Host %q: want the original Host kept", h.Host)
	}
	if got := h.Headers["Authorization"]; len(got) != 1 || got[0] != "Bearer user-token" {
		t.Errorf("the client's Authorization header must reach the handler untouched, got %q", got)
	}
	for _, k := range []string{client.FiberHeader, client.ProxyAuthHeader} {
		if _, ok := h.Headers[k]; ok {
			t.Errorf("internal header %s leaked to the handler", k)
		}
	}
	for _, e := range h.Env {
		if len(e) > 24 && e[:24] == "KUBERNETES_SERVICE_HOST=" {
			t.Errorf("fiber environment leaks %s", e)
		}
	}

	l, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hasFiber(l, f.ID) {
		t.Fatalf("acquired fiber %s not listed: %+v", f.ID, l)
	}
	if err := c.Release(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	l, _ = c.List(ctx)
	if hasFiber(l, f.ID) {
		t.Fatalf("released fiber %s still listed", f.ID)
	}
	resp, body = get(t, c, f.ID, "/")
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("request into a released fiber: %d %s, want 404", resp.StatusCode, body)
	}
}

func hasFiber(l client.FiberList, id string) bool {
	for _, f := range l.Fibers {
		if f.ID == id {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", timeout, what)
}
