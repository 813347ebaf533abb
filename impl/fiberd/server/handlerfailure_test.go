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

// A Revision whose handler exits at start-up never fills its warm pool;
// /readyz then says why with a typed reason, the exit code and the end of
// the handler's own output (what the grant controller turns into the
// Revision's ContainerHealthy=False ExitCode5), and retries back off.
func TestReadyzReportsHandlerExit(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{NoWait: true, Env: map[string]string{"TESTHANDLER_START": "exit:5"}})
	var e *client.Error
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := inst.Client.Ready(ctx)
		cancel()
		if err == nil {
			t.Fatal("fiberd is ready although its handler exits at start-up")
		}
		if errors.As(err, &e) && e.Reason == contract.ReasonHandlerExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never reported the handler's exit: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("/readyz: %s %q %+v", e.Reason, e.Message, *e.Handler)
	if e.Handler == nil || e.Handler.ExitCode != 5 || !strings.HasSuffix(e.Handler.Output, "Crashed...") || e.Handler.ConsecutiveFailures < 1 {
		t.Fatalf("handler failure %+v", e.Handler)
	}
	for _, leak := range []string{"127.0.0.1", inst.Endpoint, "fiber "} {
		if strings.Contains(e.Message+e.Handler.Output, leak) {
			t.Errorf("report carries %q: %q / %q", leak, e.Message, e.Handler.Output)
		}
	}
	// Acquire does not start a fiber per call while the failure stands.
	ctx := context.Background()
	t0 := time.Now()
	if _, err := inst.Client.Acquire(ctx); err == nil || !client.IsUnavailable(err) {
		t.Fatalf("acquire with a failing handler: %v, want 503", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("acquire during the back-off took %s; want the standing failure at once", d)
	}
}
