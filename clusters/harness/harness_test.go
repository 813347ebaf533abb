package harness

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/impl/progress"
)

func TestTargetFromNamesWhatThereIs(t *testing.T) {
	if _, err := TargetFrom(context.Background(), "stock"); err == nil || !strings.Contains(err.Error(), "setup has not run") {
		t.Fatalf("TargetFrom without a setup: %v", err)
	}
	ctx := withTargets(context.Background())
	targetsFrom(ctx).put(&Target{Name: "stock"})
	targetsFrom(ctx).put(&Target{Name: "lampyr"})
	if tg, err := TargetFrom(ctx, "lampyr"); err != nil || tg.Name != "lampyr" {
		t.Fatalf("TargetFrom(lampyr) = %v, %v", tg, err)
	}
	_, err := TargetFrom(ctx, "lampyr-x")
	if err == nil || !strings.Contains(err.Error(), "[lampyr stock]") {
		t.Fatalf("TargetFrom(lampyr-x) = %v, want an error naming the targets", err)
	}
	var names []string
	for _, tg := range Targets(ctx) {
		names = append(names, tg.Name)
	}
	if strings.Join(names, ",") != "stock,lampyr" {
		t.Fatalf("Targets = %v, want the declared order", names)
	}
}

func TestValuesAreKeyedByType(t *testing.T) {
	type a struct{ n int }
	type b struct{ n int }
	ctx := With(With(context.Background(), &a{1}), &b{2})
	if v, ok := Value[*a](ctx); !ok || v.n != 1 {
		t.Fatalf("Value[*a] = %v, %v", v, ok)
	}
	if v, ok := Value[*b](ctx); !ok || v.n != 2 {
		t.Fatalf("Value[*b] = %v, %v", v, ok)
	}
	if _, ok := Value[string](ctx); ok {
		t.Fatal("Value[string] found a value never put")
	}
}

type key string

// A spec's context keeps its own values and cancellation; the suite's
// values come after.
func TestJoinedPrefersTheNodesValues(t *testing.T) {
	node, cancel := context.WithCancel(context.WithValue(context.Background(), key("k"), "node"))
	vals := context.WithValue(context.WithValue(context.Background(), key("k"), "suite"), key("only"), "suite")
	j := joined{Context: node, values: vals}
	if j.Value(key("k")) != "node" || j.Value(key("only")) != "suite" {
		t.Fatalf("joined values: k=%v only=%v", j.Value(key("k")), j.Value(key("only")))
	}
	cancel()
	if j.Err() == nil {
		t.Fatal("joined ignores the node's cancellation")
	}
}

func testRun(t *testing.T, keep bool) (context.Context, *bytes.Buffer) {
	var out bytes.Buffer
	log := progress.New(&out)
	r := &run{suite: "t", opts: Options{Keep: keep, KeepVar: "LAMPYR_KEEP"}, log: log,
		env: clusters.NewEnv(log, clusters.Settings{StateDir: t.TempDir()}), images: map[string]string{}}
	return withTargets(context.WithValue(context.Background(), runKey{}, r)), &out
}

// Nothing found running or external is deleted; a kept cluster is named
// with how to delete it.
func TestKeepOrDeleteLeavesWhatItDidNotCreate(t *testing.T) {
	ctx, out := testRun(t, true)
	ts := targetsFrom(ctx)
	ts.put(&Target{Name: "found", Created: false})
	ts.put(&Target{Name: "theirs", External: true, Created: true})
	ts.put(&Target{Name: "made", Created: true, Kubeconfig: "/k", Gateway: "http://g"})
	if _, err := KeepOrDeleteCreated()(ctx, envconf.New()); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"cluster found existed before this run: left running", "LAMPYR_KEEP=1: cluster made left running: KUBECONFIG=/k, gateway http://g", "just cluster-down made"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "theirs") {
		t.Errorf("an external installation was mentioned as a cluster:\n%s", got)
	}
}

func TestDumpOnlyAfterAFailedSetup(t *testing.T) {
	ctx, _ := testRun(t, false)
	r, _ := runFrom(ctx)
	r.setupDone = true
	r.artifacts = t.TempDir()
	// A target with clients would be dumped; none is, since the setup
	// finished.
	targetsFrom(ctx).put(&Target{Name: "x"})
	if _, err := DumpIfSetupFailed()(ctx, envconf.New()); err != nil {
		t.Fatal(err)
	}
}

func TestFuncsNeedARun(t *testing.T) {
	ctx := withTargets(context.Background())
	for name, f := range map[string]func() error{
		"CreateOrReuse": func() error { _, err := CreateOrReuse(Cluster{Name: "x"})(ctx, envconf.New()); return err },
		"Install":       func() error { _, err := Install(Cluster{Name: "x", Profile: "stock"})(ctx, envconf.New()); return err },
		"Image":         func() error { _, err := Image(ctx, &Target{}, "p"); return err },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "no harness run") {
			t.Errorf("%s without a run: %v", name, err)
		}
	}
}

func TestConnectExternalNeedsTheGateway(t *testing.T) {
	ctx := withTargets(context.Background())
	_, err := ConnectExternal(Cluster{Name: "lampyr", Profile: clusters.ProfileLampyr}, External{Kubeconfig: "/k"})(ctx, envconf.New())
	if err == nil || !strings.Contains(err.Error(), "LAMPYR_CONFORMANCE_GATEWAY") {
		t.Fatalf("ConnectExternal without a gateway: %v", err)
	}
}
