package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
)

// A snapshot fiberd cannot fetch is a load failure: /readyz answers 503
// with the typed reason SnapshotUnavailable, GET /v1/grant carries it in
// loadReason, and the grant controller classifies it from the reason alone
// (contract.LoadFailure), never from the message.
func TestLoadFailureReasonRoundTrip(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{})
	c := inst.Claims
	c.GrantID = "missing-snapshot"
	c.SnapshotArtifact = inst.Registry + "/lampyr/absent@sha256:" + strings.Repeat("0", 64)
	inst.WriteGrant(t, c)

	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	var g client.GrantInfo
	for {
		var err error
		g, err = inst.Client.Grant(ctx)
		if err == nil && g.GrantID == c.GrantID && g.LoadReason != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /v1/grant never named a load reason for an absent snapshot: %+v %v", g, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g.LoadReason != contract.ReasonSnapshotUnavailable || g.TemplateLoaded || !strings.Contains(g.LoadError, "absent") {
		t.Errorf("grant info: loadReason %q loadError %q loaded %v, want %s naming the artifact", g.LoadReason, g.LoadError, g.TemplateLoaded, contract.ReasonSnapshotUnavailable)
	}

	err := inst.Client.Ready(ctx)
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 503 || e.Reason != contract.ReasonSnapshotUnavailable {
		t.Fatalf("/readyz with an absent snapshot: %v, want 503 %s", err, contract.ReasonSnapshotUnavailable)
	}
	if !contract.LoadFailure(e.Reason) || contract.HandlerFailure(e.Reason) || e.Handler != nil {
		t.Errorf("/readyz reason %s: want a load failure without handler details", e.Reason)
	}
}
