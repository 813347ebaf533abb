package portability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/onsi/ginkgo/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/ly"
)

// Fleet deploys fixtures identically on any number of targets, one of
// them the reference the others are compared with: the proof's way to
// run over a list of installations (the managed pair is a Fleet of two,
// stock the reference).
type Fleet struct {
	// Targets in the run's order; Reference is one of them.
	Targets   []*harness.Target
	Reference *harness.Target
	// Namespace the Services live in on every target.
	Namespace string
	// Repo prefixes the snapshot images in each lampyr target's registry.
	Repo string
	// FieldManager applies the Services.
	FieldManager string
	// Runnable is the fixture handler as a runnable image in each
	// target's registry, by target name (the same digest everywhere).
	Runnable map[string]string
	// Ly is the ly binary built from this tree.
	Ly string
	// Artifacts receives each applied manifest; Work holds ly's builds.
	Artifacts, Work string
	// Log receives ly's output and the waits' timings.
	Log io.Writer
}

// NewFleet is the Fleet of the harness's targets in ctx, named in order
// with ref the reference.
func NewFleet(ctx context.Context, names []string, ref, ns, repo string) (*Fleet, error) {
	f := &Fleet{Namespace: ns, Repo: repo, FieldManager: repo, Runnable: map[string]string{},
		Artifacts: harness.Artifacts(ctx), Work: ginkgo.GinkgoT().TempDir(), Log: ginkgo.GinkgoWriter}
	for _, n := range names {
		t, err := harness.TargetFrom(ctx, n)
		if err != nil {
			return nil, err
		}
		f.Targets = append(f.Targets, t)
		if n == ref {
			f.Reference = t
		}
	}
	if f.Reference == nil {
		return nil, fmt.Errorf("reference %q is not one of the targets %v", ref, names)
	}
	return f, nil
}

// Others are the targets compared with the reference.
func (f *Fleet) Others() []*harness.Target {
	var out []*harness.Target
	for _, t := range f.Targets {
		if t != f.Reference {
			out = append(out, t)
		}
	}
	return out
}

// Lampyrs are the lampyr-profile targets.
func (f *Fleet) Lampyrs() []*harness.Target {
	var out []*harness.Target
	for _, t := range f.Targets {
		if t.Profile == clusters.ProfileLampyr {
			out = append(out, t)
		}
	}
	return out
}

// Seal builds fx as a snapshot artifact once and has `ly deploy` seal its
// template on every lampyr target (each to its own fleet key), deleting
// each Service ly made so that Apply creates it anew from the manifest.
func (f *Fleet) Seal(ctx context.Context, fx *Fixture) error {
	if len(f.Lampyrs()) == 0 {
		return nil
	}
	dir, err := buildArtifact(ctx, f.Ly, f.Log, f.Work, fx)
	if err != nil {
		return err
	}
	if fx.Sealed == nil {
		fx.Sealed = map[string]*ly.DeployResult{}
	}
	for _, t := range f.Lampyrs() {
		res, err := sealOn(ctx, f.Ly, f.Log, t, f.Namespace, f.Repo, fx, dir)
		if err != nil {
			return err
		}
		if res.Revision != fx.Name+"-00001" {
			return fmt.Errorf("ly deploy sealed %s on %s for Revision %s: the template must be for the first Revision of a new Service", fx.Name, t.Name, res.Revision)
		}
		fx.Sealed[t.Name] = res
	}
	return nil
}

// sealedFor is the sealed template and snapshot t's manifest carries: its
// own on a lampyr target; on any other, the first lampyr target's (stock
// ignores them, and the pair's two manifests stay identical).
func (f *Fleet) sealedFor(fx *Fixture, t *harness.Target) (snapshot, template string) {
	if r := fx.Sealed[t.Name]; r != nil {
		return r.Snapshot, r.Template
	}
	for _, l := range f.Lampyrs() {
		if r := fx.Sealed[l.Name]; r != nil {
			return r.Snapshot, r.Template
		}
	}
	return "", ""
}

// Manifest is fx's Service for t: its runnable image in t's registry and
// the sealed template t's profile needs. The reference's goes to
// service-<name>.yaml, another target's to service-<name>-<target>.yaml
// when it differs.
func (f *Fleet) Manifest(fx *Fixture, t *harness.Target) (*unstructured.Unstructured, error) {
	snap, tmpl := f.sealedFor(fx, t)
	svc, raw, err := serviceManifest(fx, f.Namespace, f.Runnable[t.Name], snap, tmpl)
	if err != nil {
		return nil, err
	}
	file := "service-" + fx.Name + ".yaml"
	if t != f.Reference {
		rs, rt := f.sealedFor(fx, f.Reference)
		_, ref, err := serviceManifest(fx, f.Namespace, f.Runnable[f.Reference.Name], rs, rt)
		if err != nil {
			return nil, err
		}
		if bytes.Equal(ref, raw) {
			return svc, nil
		}
		file = "service-" + fx.Name + "-" + t.Name + ".yaml"
	}
	if err := os.WriteFile(filepath.Join(f.Artifacts, file), raw, 0o644); err != nil {
		return nil, err
	}
	fmt.Fprintf(f.Log, "the Service applied to %s:\n%s", t.Name, raw)
	return svc, nil
}

// Apply applies each fixture's Service to every target, then waits (4
// minutes each) until every one is Ready on each.
func (f *Fleet) Apply(ctx context.Context, fxs ...*Fixture) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(f.Targets)*len(fxs))
	for _, fx := range fxs {
		for _, t := range f.Targets {
			svc, err := f.Manifest(fx, t)
			if err != nil {
				return err
			}
			body, err := svc.MarshalJSON()
			if err != nil {
				return err
			}
			force := true
			if _, err := t.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(f.Namespace).Patch(ctx, fx.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: f.FieldManager, Force: &force}); err != nil {
				return fmt.Errorf("applying %s on %s: %w", fx.Name, t.Name, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				_, err := t.Clients.WaitReady(ctx, e2eutil.KServices, f.Namespace, fx.Name, 4*time.Minute)
				fmt.Fprintf(f.Log, "%s: Service %s Ready after %s\n", t.Name, fx.Name, time.Since(t0).Round(100*time.Millisecond))
				if err != nil {
					errs <- fmt.Errorf("Service %s on %s: %w", fx.Name, t.Name, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// Facts are the per-target values that differ by design between two
// installations of the same Service: the registry host, the sealed
// template and snapshot (each lampyr target seals to its own fleet key),
// the route's hostname (another config-domain). Align maps a target's onto
// the reference's before comparing, so a difference left is behaviour.
type Facts map[string]string

// Aligner maps a target's facts onto the reference's: nil when they are
// the same (nothing to rewrite: the managed pair).
func Aligner(target, reference Facts) *strings.Replacer {
	var olds []string
	for k, v := range target {
		if r, ok := reference[k]; ok && v != "" && r != "" && v != r {
			olds = append(olds, v)
		}
	}
	if len(olds) == 0 {
		return nil
	}
	// Longer values first: a template reference contains the registry.
	sortByLengthDesc(olds)
	inv := map[string]string{}
	for k, v := range target {
		inv[v] = reference[k]
	}
	var pairs []string
	for _, o := range olds {
		pairs = append(pairs, o, inv[o])
	}
	return strings.NewReplacer(pairs...)
}

func sortByLengthDesc(s []string) {
	sort.Slice(s, func(i, j int) bool {
		if len(s[i]) != len(s[j]) {
			return len(s[i]) > len(s[j])
		}
		return s[i] < s[j]
	})
}

// Align rewrites v's strings with r (through JSON, into a new value of v's
// type); v itself when r is nil or v does not round-trip.
func Align[T any](r *strings.Replacer, v T) T {
	if r == nil {
		return v
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var s any
	if json.Unmarshal(raw, &s) != nil {
		return v
	}
	raw, err = json.Marshal(replaceStrings(r, s))
	if err != nil {
		return v
	}
	out := reflect.New(reflect.TypeOf(&v).Elem())
	if json.Unmarshal(raw, out.Interface()) != nil {
		return v
	}
	return out.Elem().Interface().(T)
}

func replaceStrings(r *strings.Replacer, v any) any {
	switch x := v.(type) {
	case string:
		return r.Replace(x)
	case []any:
		for i := range x {
			x[i] = replaceStrings(r, x[i])
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[r.Replace(k)] = replaceStrings(r, e)
		}
		return out
	}
	return v
}
