package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/e2e-framework/pkg/env"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/impl/progress"
)

// Options are what the environment decides for a run; New reads them
// (clusters/environ), a test may build them by hand.
type Options struct {
	// Enabled: run on real clusters (LAMPYR_E2E=1); otherwise the suite
	// skips, saying how to run it.
	Enabled bool
	// Keep leaves the clusters this run created running.
	Keep bool
	// KeepVar names the variable that sets Keep, for messages.
	KeepVar string
	// Artifacts is the root artifacts folder; the suite writes below
	// Artifacts/<suite>.
	Artifacts string
	// Provider is the networking provider installs use.
	Provider string
	// Clusters are the cluster framework's settings (cache, state, etcd).
	Clusters clusters.Settings
	// External, when set, is a third party's installation: the suite's
	// single declared cluster is that installation, not a Kind cluster.
	External *External
	// Knobs are the suite's own variables, by name.
	Knobs map[string]string
}

// run is one suite run's harness state, in the context.
type run struct {
	suite     string
	opts      Options
	env       *clusters.Env
	log       *progress.Log
	artifacts string
	// setupDone: every setup step succeeded (otherwise the finish steps
	// dump every target before cleaning up: a failed setup is the hardest
	// failure to debug).
	setupDone bool

	mu     sync.Mutex
	images map[string]string
	lyBin  string
	tmp    string
}

type runKey struct{}

func runFrom(ctx context.Context) (*run, error) {
	r, _ := ctx.Value(runKey{}).(*run)
	if r == nil {
		return nil, errors.New("no harness run in this context: call the harness's funcs from a Suite's setup or finish steps")
	}
	return r, nil
}

// Env is the cluster framework's Env of this run (cache, registry,
// installer), for suites that drive it directly (the clusters suite times
// the inputs; the feasibility gate switches providers).
func Env(ctx context.Context) (*clusters.Env, error) {
	r, err := runFrom(ctx)
	if err != nil {
		return nil, err
	}
	return r.env, nil
}

// Artifacts is this suite's artifacts folder (created by the setup).
func Artifacts(ctx context.Context) string {
	if r, err := runFrom(ctx); err == nil {
		return r.artifacts
	}
	return ""
}

// CreateOrReuse creates the declared Kind clusters in parallel, or reuses
// those that already run from the same spec, each connected to the local
// registry and enforcing NetworkPolicies; it records a Target for each.
func CreateOrReuse(cs ...Cluster) env.Func {
	return func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		r, err := runFrom(ctx)
		if err != nil {
			return ctx, err
		}
		names := make([]string, len(cs))
		var profiles []string
		for i, c := range cs {
			names[i] = c.Name
			profiles = append(profiles, c.Profile)
		}
		// The profiles' builds run beside the cluster inputs' (the Install
		// step finds them done or joins them under way), for each provider
		// a cluster states (a build under way is joined, not repeated).
		r.env.Announce(ctx, profiles, r.opts.Provider)
		for _, p := range providersOf(cs, r.opts.Provider) {
			r.env.Prebuild(ctx, profiles, p)
		}
		infos, err := r.env.Up(ctx, names, r.opts.Keep)
		ts := targetsFrom(ctx)
		for i, info := range infos {
			// After a failure Up has deleted what it created (unless the
			// run keeps it); what is left is recorded, for the dump and so
			// that a kept cluster is reported.
			if info.Name == "" || (err != nil && info.Created && !r.opts.Keep) {
				continue
			}
			t, terr := managedTarget(cs[i], info, r.opts.Provider)
			if terr != nil {
				err = errors.Join(err, terr)
				continue
			}
			ts.put(t)
		}
		if err != nil {
			return ctx, fmt.Errorf("creating or reusing clusters %s: %w", strings.Join(names, ", "), err)
		}
		return ctx, nil
	}
}

// providersOf are the distinct networking providers the clusters get
// (each its own, else the run's), in declared order.
func providersOf(cs []Cluster, run string) []string {
	var out []string
	for _, c := range cs {
		p := c.Provider
		if p == "" {
			p = run
		}
		if pr, err := networking.Get(p); err == nil {
			p = pr.Name()
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func managedTarget(c Cluster, info kindcluster.Info, provider string) (*Target, error) {
	t := &Target{
		Name: c.Name, Profile: c.Profile, Kubeconfig: info.Kubeconfig, Info: info,
		Gateway: info.GatewayURL(), Registry: info.Registry, Created: info.Created,
		Config: envconf.NewWithKubeConfig(info.Kubeconfig),
	}
	if c.Profile != "" {
		t.Provider = provider
		if c.Provider != "" {
			p, err := networking.Get(c.Provider)
			if err != nil {
				return nil, fmt.Errorf("cluster %s: %w", c.Name, err)
			}
			t.Provider = p.Name()
		}
	}
	var err error
	t.Clients, err = e2eutil.NewClients(info.Kubeconfig)
	return t, err
}

// Install puts each declared cluster's profile on it with the run's
// networking provider (server-side apply of rendered manifests: idempotent
// on a reused cluster), then Knative Eventing where declared; one cluster
// at a time, since each install builds images on the host's few cores.
func Install(cs ...Cluster) env.Func {
	return func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		r, err := runFrom(ctx)
		if err != nil {
			return ctx, err
		}
		for _, c := range cs {
			if c.Profile == "" {
				continue
			}
			t, err := TargetFrom(ctx, c.Name)
			if err != nil {
				return ctx, err
			}
			t0 := time.Now()
			if err := r.env.Install(ctx, t.Info, c.Profile, t.Provider); err != nil {
				return ctx, fmt.Errorf("installing the %s profile with %s on %s: %w", c.Profile, t.Provider, c.Name, err)
			}
			t.Installed = time.Since(t0)
			if c.Eventing {
				t0 = time.Now()
				if err := r.env.InstallEventing(ctx, t.Info); err != nil {
					return ctx, fmt.Errorf("installing Knative Eventing on %s: %w", c.Name, err)
				}
				t.EventingInstalled = time.Since(t0)
			}
		}
		return ctx, nil
	}
}

// Reinstall puts t's profile on it again with another networking provider
// (what only the previous one installed is deleted), and records it.
func Reinstall(ctx context.Context, t *Target, provider string) error {
	r, err := runFrom(ctx)
	if err != nil {
		return err
	}
	if t.External {
		return fmt.Errorf("%s is an external installation: the harness installs nothing there", t.Name)
	}
	p, err := networking.Get(provider)
	if err != nil {
		return err
	}
	if err := r.env.Install(ctx, t.Info, t.Profile, p.Name()); err != nil {
		return fmt.Errorf("installing the %s profile with %s on %s: %w", t.Profile, p.Name(), t.Name, err)
	}
	t.Provider = p.Name()
	return nil
}

// ConnectExternal records the external installation as the Target of the
// one declared cluster.
func ConnectExternal(c Cluster, ext External) env.Func {
	return func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		if ext.Gateway == "" {
			return ctx, fmt.Errorf("third-party mode: set %s to the Knative gateway's http://host:port", environ.ConformanceGateway)
		}
		t := &Target{
			Name: c.Name, Profile: c.Profile, Kubeconfig: ext.Kubeconfig, Gateway: ext.Gateway,
			Config: envconf.NewWithKubeConfig(ext.Kubeconfig), External: true,
		}
		var err error
		if t.Clients, err = e2eutil.NewClients(ext.Kubeconfig); err != nil {
			return ctx, err
		}
		targetsFrom(ctx).put(t)
		return ctx, nil
	}
}

// DescribeLampyr connects `ly` to every lampyr-profile Target and reads
// its installation (fleet key, template repository, registry), waiting up
// to a minute for a fresh install's ConfigMap. An external installation's
// registry is the one it names.
func DescribeLampyr() env.Func {
	return func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		for _, t := range Targets(ctx) {
			if t.Profile != clusters.ProfileLampyr {
				continue
			}
			lc, err := ly.Connect(t.Kubeconfig, "")
			if err != nil {
				return ctx, fmt.Errorf("connecting ly to %s: %w", t.Name, err)
			}
			var inst *ly.Installation
			deadline := time.Now().Add(time.Minute)
			for {
				inst, err = lc.Describe(ctx)
				if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
				time.Sleep(2 * time.Second)
			}
			if err != nil {
				return ctx, fmt.Errorf("reading the Lampyr installation on %s (waited 1m): %w", t.Name, err)
			}
			t.Ly, t.Installation = lc, inst
			if t.Registry == "" {
				t.Registry = inst.Registry
			}
		}
		return ctx, nil
	}
}

// Image builds a main package of this repository into a runnable image
// and pushes it to t's registry as fixtures/<name>:e2e, once per run and
// registry, returning the digest-pinned reference.
func Image(ctx context.Context, t *Target, pkg string) (string, error) {
	r, err := runFrom(ctx)
	if err != nil {
		return "", err
	}
	if t.Registry == "" {
		return "", fmt.Errorf("%s names no registry to push %s to", t.Name, pkg)
	}
	push := t.Push
	if push == "" {
		push = t.Registry
	}
	key := push + "|" + t.Registry + "|" + pkg
	r.mu.Lock()
	defer r.mu.Unlock()
	if ref, ok := r.images[key]; ok {
		return ref, nil
	}
	var ref string
	err = r.log.Step(fmt.Sprintf("Building %s into an image in %s", pkg, push), func() (err error) {
		ref, err = e2eutil.BuildAndPush(ctx, r.env.Cache, pkg, push, "fixtures/"+filepath.Base(pkg), "e2e")
		return err
	})
	if err != nil {
		return "", err
	}
	// The cluster pulls the same digest under the name it knows the
	// registry by.
	ref = t.Registry + strings.TrimPrefix(ref, push)
	r.images[key] = ref
	return ref, nil
}

// tempDir is the run's folder removed at the end (KeepOrDeleteCreated);
// call with r.mu held.
func (r *run) tempDir() (string, error) {
	if r.tmp == "" {
		d, err := os.MkdirTemp("", "lampyr-"+r.suite+"-")
		if err != nil {
			return "", err
		}
		r.tmp = d
	}
	return r.tmp, nil
}

// LyBinary builds the ly command from this tree, once per run, into a
// folder removed at the end.
func LyBinary(ctx context.Context) (string, error) {
	r, err := runFrom(ctx)
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lyBin != "" {
		return r.lyBin, nil
	}
	if _, err := r.tempDir(); err != nil {
		return "", err
	}
	bin := filepath.Join(r.tmp, "ly")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./impl/cmd/ly")
	cmd.Dir = e2eutil.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./impl/cmd/ly: %w\n%s", err, out)
	}
	r.lyBin = bin
	return bin, nil
}

// DumpIfSetupFailed writes every target's state (conditions, events, pod
// logs) to <artifacts>/dump/setup/<target> when the setup did not finish.
func DumpIfSetupFailed() env.Func {
	return func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		r, err := runFrom(ctx)
		if err != nil || r.setupDone {
			return ctx, err
		}
		return ctx, DumpTargets(ctx, filepath.Join(r.artifacts, "dump", "setup"))
	}
}

// DumpTargets writes each target's state under dir/<target>.
func DumpTargets(ctx context.Context, dir string) error {
	var errs []error
	for _, t := range Targets(ctx) {
		if t.Clients == nil {
			continue
		}
		if err := e2eutil.Dump(ctx, t.Clients, filepath.Join(dir, t.Name)); err != nil {
			errs = append(errs, fmt.Errorf("dumping %s into %s: %w", t.Name, dir, err))
		}
	}
	return errors.Join(errs...)
}

// KeepOrDeleteCreated deletes the clusters this run created, unless the run
// keeps them (then it says how to reach and delete them); clusters found
// running are left running.
func KeepOrDeleteCreated() env.Func {
	return func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		r, err := runFrom(ctx)
		if err != nil {
			return ctx, err
		}
		var errs, kept []string
		for _, t := range Targets(ctx) {
			switch {
			case t.External:
				continue
			case !t.Created:
				r.log.Printf("cluster %s existed before this run: left running", t.Name)
			case r.opts.Keep:
				kept = append(kept, t.Name)
				r.log.Printf("%s=1: cluster %s left running: KUBECONFIG=%s, gateway %s", r.opts.KeepVar, t.Name, t.Kubeconfig, t.Gateway)
			default:
				if err := r.log.Step(fmt.Sprintf("Deleting cluster %s, created by this run (set %s=1 to keep it)", t.Name, r.opts.KeepVar), func() error {
					return r.env.Manager().Delete(t.Name)
				}); err != nil {
					errs = append(errs, fmt.Sprintf("deleting cluster %s: %v (delete it with: just cluster-down %s)", t.Name, err, t.Name))
				}
			}
		}
		if len(kept) > 0 {
			r.log.Printf("delete them with: just cluster-down %s", strings.Join(kept, " "))
		}
		if r.tmp != "" {
			_ = os.RemoveAll(r.tmp)
		}
		if len(errs) > 0 {
			return ctx, errors.New(strings.Join(errs, "; "))
		}
		return ctx, nil
	}
}
