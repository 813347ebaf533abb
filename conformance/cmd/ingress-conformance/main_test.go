package main

import (
	"io"
	"strings"
	"testing"

	"lampyr.dev/serving/clusters/progress"
	"lampyr.dev/serving/conformance/upstream"
)

func TestParseKeepsTheCauseOfEachFailure(t *testing.T) {
	events := strings.Join([]string{
		`{"Action":"run","Test":"TestIngressConformance/tls"}`,
		`{"Action":"output","Test":"TestIngressConformance/tls","Output":"    tls.go:34: [x] Using port 77\n"}`,
		`{"Action":"output","Test":"TestIngressConformance/tls","Output":"    util.go:1131: Error making GET request: service doesn't contain a matching port: 443\n"}`,
		`{"Action":"fail","Test":"TestIngressConformance/tls","Elapsed":4.3}`,
		`{"Action":"run","Test":"TestIngressConformance/grpc"}`,
		`{"Action":"pass","Test":"TestIngressConformance/grpc","Elapsed":8.4}`,
		`{"Action":"run","Test":"TestIngressConformance/update"}`,
		`{"Action":"output","Test":"TestIngressConformance/update/some-random-child","Output":"    update.go:115: Header[\"Who-Are-You\"] = \"a\", wanted \"b\"\n"}`,
		`{"Action":"fail","Test":"TestIngressConformance/update","Elapsed":95}`,
	}, "\n")
	rs := parse(strings.NewReader(events), progress.New(io.Discard), "")
	if len(rs) != 3 {
		t.Fatalf("results %+v", rs)
	}
	got := map[string]string{}
	for _, r := range rs {
		got[r.Name] = r.Outcome + ": " + upstream.Cause(r.Reason)
	}
	for name, want := range map[string]string{
		"tls":    "fail: util.go:1131: Error making GET request: service doesn't contain a matching port: 443",
		"grpc":   "pass: ",
		"update": `fail: update.go:115: Header["Who-Are-You"] = "a", wanted "b"`,
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
}
