package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"knative.dev/networking/pkg/http/header"

	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
	"lampyr.dev/serving/impl/trust/homekey"
)

// Two Revisions, each with its own Home (a real fiberd) of one installation
// (one router key). Every request must run in a fiber of exactly the
// Revision the gateway selected, each Home must let the router in with the
// credential minted for it, and a selection that names no routable Revision
// must reach no fiber at all.
func TestSelectionNeverCrossesRevisions(t *testing.T) {
	e := startEnv(t, envOptions{})
	otherKey, _ := homekey.Generate()
	other := fiberdtest.StartInstance(t, fiberdtest.Options{
		Namespace: "team-b", Revision: "other-00001", HandlerPackage: handlerPackage, Logf: func(string, ...any) {},
		RouterKey: e.fd.RouterKey, HomeKey: otherKey,
	})
	b := e.meta
	b.Namespace, b.Revision, b.HomeEndpoint, b.Home, b.HomeKeySHA256 = "team-b", "other-00001", other.Endpoint, other.Home, other.HomeKeySHA256
	e.srv.Table.Upsert(b)
	down := e.meta
	down.Revision, down.Ready = "down-00001", false
	e.srv.Table.Upsert(down)

	ask := func(ns, rev string) (int, string) {
		req := e.request(context.Background(), http.MethodGet, "/", nil)
		if ns == "" {
			req.Header.Del(proxy.NamespaceHeader)
		} else {
			req.Header.Set(proxy.NamespaceHeader, ns)
		}
		if rev == "" {
			req.Header.Del(proxy.RevisionHeader)
		} else {
			req.Header.Set(proxy.RevisionHeader, rev)
		}
		resp, body := e.do(req)
		if resp.StatusCode == http.StatusOK {
			return resp.StatusCode, decodeSeen(t, body).KRevision
		}
		return resp.StatusCode, string(body)
	}
	for i := 0; i < 3; i++ {
		if code, rev := ask("default", "hello-00001"); code != 200 || rev != "hello-00001" {
			t.Fatalf("selected hello-00001, answered %d by %q", code, rev)
		}
		if code, rev := ask("team-b", "other-00001"); code != 200 || rev != "other-00001" {
			t.Fatalf("selected other-00001, answered %d by %q", code, rev)
		}
	}
	for _, c := range []struct {
		ns, rev string
		code    int
		body    string
	}{
		{"team-b", "hello-00001", 404, "not known"}, // right name, wrong namespace
		{"default", "other-00001", 404, "not known"},
		{"default", "nope-00001", 404, "not known"},
		{"", "hello-00001", 404, "no Revision selected"},
		{"default", "", 404, "no Revision selected"},
		{"default", "down-00001", 503, "not ready"},
		{"default", strings.Repeat("x", 5000), 404, "not known"},
	} {
		if code, body := ask(c.ns, c.rev); code != c.code || !strings.Contains(body, c.body) || len(body) > 512 {
			t.Errorf("namespace %q revision %.20q: %d %.200q, want %d containing %q", c.ns, c.rev, code, body, c.code, c.body)
		}
	}
	e.assertNoLeasedFibers()
	if a := e.counter("acquired"); a != 3 {
		t.Fatalf("hello-00001 acquired %v fibers for its 3 requests", a)
	}
	for _, fd := range []*fiberdtest.Instance{e.fd, other} {
		if n := fd.Metric(t, "fiberd_refused_credentials_total"); n != 0 {
			t.Fatalf("Home %s refused %v router credentials", fd.Home, n)
		}
	}

	// Metadata pairing B's endpoint with A's name gets A's credential,
	// which B refuses: a Home is reached only with its own.
	crossed := b
	crossed.Revision, crossed.Home = "crossed-00001", e.fd.Home
	e.srv.Table.Upsert(crossed)
	if code, body := ask("team-b", "crossed-00001"); code != http.StatusBadGateway {
		t.Fatalf("A's credential at B's endpoint: %d %q, want 502", code, body)
	}
	if n := other.Metric(t, "fiberd_refused_credentials_total"); n == 0 {
		t.Fatal("B did not refuse A's credential")
	}
	e.srv.Table.Delete(revision.Key{Namespace: "team-b", Name: "crossed-00001"})

	// A probe through the router answers without a fiber.
	req := e.request(context.Background(), http.MethodGet, "/healthz", nil)
	req.Header.Set(header.ProbeKey, header.ProbeValue)
	req.Header.Set(header.HashKey, "deadbeef")
	resp, _ := e.do(req)
	if resp.StatusCode != 200 || resp.Header.Get(header.HashKey) != "deadbeef" {
		t.Fatalf("ingress probe: %d hash %q", resp.StatusCode, resp.Header.Get(header.HashKey))
	}
	if a := e.counter("acquired"); a != 3 {
		t.Fatal("the probe acquired a fiber")
	}

	// Revision B goes away: its traffic stops, A's does not.
	e.srv.Table.Delete(revision.Key{Namespace: "team-b", Name: "other-00001"})
	if code, _ := ask("team-b", "other-00001"); code != 404 {
		t.Fatalf("after B's metadata was deleted: %d", code)
	}
	if code, rev := ask("default", "hello-00001"); code != 200 || rev != "hello-00001" {
		t.Fatalf("A after B left: %d %q", code, rev)
	}
}
