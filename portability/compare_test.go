package portability

// Plain tests of the comparison's own logic: they run with `go test`
// whether or not LAMPYR_E2E is set.

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseCall(t *testing.T) {
	// An answer as the fixture's /call writes it, the callee's /echo
	// carrying headers a platform's proxies add.
	raw := `{
  "url": "http://b.ns.svc.cluster.local/echo?via=call",
  "status": 200,
  "headers": {"Content-Type": "application/json"},
  "body": "{\"method\":\"GET\",\"path\":\"/echo\",\"query\":\"via=call\",\"host\":\"b.ns.svc.cluster.local\",\"headers\":{\"User-Agent\":[\"lampyr-fixture-call/1\"],\"X-Forwarded-For\":[\"10.244.0.7\"]},\"env\":{\"K_SERVICE\":\"b\"}}\n"
}`
	got, err := ParseCall([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := &Call{
		URL: "http://b.ns.svc.cluster.local/echo?via=call", Status: 200,
		Headers: map[string]string{"Content-Type": "application/json"},
		Echo: &Echo{Method: "GET", Path: "/echo", Query: "via=call", Host: "b.ns.svc.cluster.local",
			Headers: map[string][]string{"User-Agent": {"lampyr-fixture-call/1"}}, Env: map[string]string{"K_SERVICE": "b"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ParseCall (-want +got):\n%s", d)
	}

	// A failed call, and a body that is not an echo, are kept as they are.
	for _, raw := range []string{
		`{"url": "http://nope.ns.svc.cluster.local/", "status": 0, "body": "", "error": "dns"}`,
		`{"url": "http://b.ns/", "status": 200, "headers": {"Content-Type": "text/plain; charset=utf-8"}, "body": "Hello World!\n"}`,
		`{"url": "http://b.ns/echo", "status": 404, "body": "not here"}`,
	} {
		c, err := ParseCall([]byte(raw))
		if err != nil || c.Echo != nil {
			t.Errorf("ParseCall(%s) = %+v, %v; want it as it is", raw, c, err)
		}
	}
	if _, err := ParseCall([]byte(`{"url": "http://b.ns/echo", "status": 200, "body": "not json"}`)); err == nil {
		t.Error("an /echo answer that is not an echo must be an error")
	}
}
