package server

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
)

func refusedTotal(t *testing.T, s *Server, reason string) float64 {
	t.Helper()
	var d dto.Metric
	if err := s.Metrics.MetadataRefused.WithLabelValues(reason).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetCounter().GetValue()
}

// Refused metadata is logged and counted once per Revision, and every
// reason has a series from the start.
func TestMetadataRefusalsAreLoggedAndCounted(t *testing.T) {
	var log bytes.Buffer
	s := New(Options{Proxy: proxy.DefaultConfig(), Source: revision.NewStatic(), MaxRevisions: 2, MaxRevisionsPerNamespace: 1,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	mfs, err := s.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series int
	for _, mf := range mfs {
		if mf.GetName() == "lampyr_router_metadata_refused_total" {
			series = len(mf.GetMetric())
		}
	}
	if series != 4 {
		t.Fatalf("%d refusal series before any refusal, want malformed, endpoint, full and namespace-full", series)
	}
	m := func(ns, rev string) routermeta.Metadata {
		return routermeta.Metadata{Revision: rev, Namespace: ns, Mode: "fresh", Protocol: routermeta.ProtocolHTTP1}
	}
	s.Table.Upsert(m("demo", "a-00001"))
	s.Table.Upsert(m("demo", "b-00001"))
	s.Table.Upsert(m("demo", "b-00001"))
	if n := refusedTotal(t, s, revision.RefusedNamespaceFull); n != 1 {
		t.Fatalf("namespace-full refusals counted %v, want 1", n)
	}
	if !strings.Contains(log.String(), "demo/b-00001") || !strings.Contains(log.String(), "--max-revisions-per-namespace=1") {
		t.Fatalf("log %q does not name the Revision and the flag", log.String())
	}
	s.Table.Upsert(m("other", "a-00001"))
	s.Table.Upsert(m("third", "a-00001"))
	if n := refusedTotal(t, s, revision.RefusedFull); n != 1 {
		t.Fatalf("full refusals counted %v, want 1", n)
	}
	if !strings.Contains(log.String(), "--max-revisions=2") {
		t.Fatalf("log %q does not name --max-revisions", log.String())
	}
}
