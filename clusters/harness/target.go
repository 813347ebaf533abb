package harness

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/impl/ly"
)

// Cluster is a cluster a suite declares: its name and the install profile
// and extras it needs, all stated (nothing is inferred from the name).
type Cluster struct {
	// Name is the Kind cluster's name.
	Name string
	// Profile is clusters.ProfileStock, clusters.ProfileLampyr, or empty
	// for a bare cluster (nothing installed).
	Profile string
	// Eventing adds Knative Eventing after the profile.
	Eventing bool
	// Provider is the networking provider the harness installs on this
	// managed cluster (empty: the run's, Options.Provider), so one run can
	// compare clusters behind different gateways.
	Provider string
	// External, when set, makes this cluster an installation the suite
	// does not manage (nothing is created, installed or deleted), checked
	// before anything runs (Preflight).
	External *External
}

// Paired is the stock/lampyr pair, each with its profile.
func Paired() []Cluster {
	return []Cluster{{Name: "stock", Profile: clusters.ProfileStock}, {Name: "lampyr", Profile: clusters.ProfileLampyr}}
}

// External names an installation the suite does not manage: nothing is
// created, installed or deleted; only the suite's own objects are.
type External struct {
	// Kubeconfig is the installation's kubeconfig file.
	Kubeconfig string
	// Context is the kubeconfig context (empty: its current context).
	Context string
	// Gateway is the Knative gateway's http://host:port.
	Gateway string
	// Registry is the registry the cluster pulls the suite's images from,
	// as image references name it (empty: the Lampyr installation's, on a
	// lampyr target; none otherwise). Push is where this host pushes the
	// same digests (empty: Registry), e.g. localhost:5002 for a registry
	// the nodes reach under another name.
	Registry, Push string
	// Provider is the networking provider the installation runs, as its
	// owner states it (empty: read from config-network's ingress class).
	Provider string
}

// Target is one cluster (or external installation) as a spec reaches it.
type Target struct {
	// Name is the cluster's name (the kubeconfig's path for an external
	// installation).
	Name string
	// Profile is the install profile it runs (as declared).
	Profile string
	// Provider is the networking provider installed; empty on an external
	// installation (the harness did not install it).
	Provider string
	// Kubeconfig is its kubeconfig file.
	Kubeconfig string
	// Clients are its typed and dynamic clients.
	Clients *e2eutil.Clients
	// Config is e2e-framework's configuration for this cluster (its
	// klient is made on first use), for e2e-framework features and funcs.
	Config *envconf.Config
	// Gateway is the Knative gateway's http://host:port.
	Gateway string
	// Registry is the image registry as the host (and the nodes) name it.
	Registry string
	// Push is where the host pushes images that the cluster pulls from
	// Registry (empty: Registry itself).
	Push string
	// Source and Context are the kubeconfig file and context an external
	// installation was given by (with a context, Kubeconfig is a copy of
	// the run holding that context alone).
	Source, Context string
	// Info is the Kind cluster's record; zero for an external installation.
	Info kindcluster.Info
	// Installation is the Lampyr installation (lampyr profile only).
	Installation *ly.Installation
	// Ly is `ly`'s connection to it (lampyr profile only).
	Ly *ly.Cluster
	// Installed is how long installing its profile took, Eventing how long
	// Knative Eventing took (zero when not installed by this run).
	Installed, EventingInstalled time.Duration
	// Created: this run created the cluster, so this run deletes it
	// unless asked to keep it. A cluster found running is left running.
	Created bool
	// External: the suite does not manage this installation.
	External bool
}

// Address is how a person reaches the target: KUBECONFIG=file, and the
// context when one was given.
func (t *Target) Address() string {
	src := t.Source
	if src == "" {
		src = t.Kubeconfig
	}
	if t.Context != "" {
		return fmt.Sprintf("KUBECONFIG=%s, context %s", src, t.Context)
	}
	return "KUBECONFIG=" + src
}

// targets is the set of Targets of one run, kept in the context as a
// pointer so that a setup step that fails half-way still leaves what it
// created visible to the finish steps.
type targets struct {
	mu     sync.Mutex
	byName map[string]*Target
	order  []string
}

type targetsKey struct{}

func withTargets(ctx context.Context) context.Context {
	if targetsFrom(ctx) != nil {
		return ctx
	}
	return context.WithValue(ctx, targetsKey{}, &targets{byName: map[string]*Target{}})
}

func targetsFrom(ctx context.Context) *targets {
	t, _ := ctx.Value(targetsKey{}).(*targets)
	return t
}

func (ts *targets) put(t *Target) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if _, ok := ts.byName[t.Name]; !ok {
		ts.order = append(ts.order, t.Name)
	}
	ts.byName[t.Name] = t
}

// TargetFrom is the Target named name in ctx (a context the harness's setup
// passed on), or an error naming the targets there are.
func TargetFrom(ctx context.Context, name string) (*Target, error) {
	ts := targetsFrom(ctx)
	if ts == nil {
		return nil, fmt.Errorf("no harness targets in this context: the suite's setup has not run (or was skipped)")
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t, ok := ts.byName[name]; ok {
		return t, nil
	}
	names := append([]string(nil), ts.order...)
	sort.Strings(names)
	return nil, fmt.Errorf("no target %q: this suite's targets are %v", name, names)
}

// Targets are every Target in ctx, in the order the suite declared them.
func Targets(ctx context.Context) []*Target {
	ts := targetsFrom(ctx)
	if ts == nil {
		return nil
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make([]*Target, 0, len(ts.order))
	for _, n := range ts.order {
		out = append(out, ts.byName[n])
	}
	return out
}

// valueKey keys a suite's own state by its type.
type valueKey[T any] struct{}

// With returns ctx carrying v, found again by Value[T]: how a suite's setup
// step hands its own state (fixture images, sealed templates, a report
// being filled) to its specs and finish steps.
func With[T any](ctx context.Context, v T) context.Context {
	return context.WithValue(ctx, valueKey[T]{}, v)
}

// Value is the T a setup step put in ctx with With, and whether there was
// one.
func Value[T any](ctx context.Context) (T, bool) {
	v, ok := ctx.Value(valueKey[T]{}).(T)
	return v, ok
}
