// Package firstrun says, before a first run's long steps, what will be
// built from source and about how long that takes on a machine of this
// project's kind (issue 30). It links only the build packages, so
// `lampyr-inputs` can say it within seconds of a cold start, before the
// suite's own compile; the harness says it again with the profiles' builds
// once it knows them (clusters.Env.Announce).
package firstrun

import (
	"context"
	"fmt"
	"strings"
	"time"

	"lampyr.dev/serving/clusters/inputs"
	"lampyr.dev/serving/impl/build/gobuild"
)

// ColdMinutes is how long each build takes from nothing (empty Go build and
// module caches) alone on an idle 2-vCPU, 24 GiB machine of the kind this
// project runs on, from the progress lines of a fresh-machine run (issue 30:
// Kubernetes 6 min 43 s, Traefik v3.7.9 8 min 7 s, ...). Machines of this
// kind differ up to 3x; the line says so. "lampyr" includes runsc for the
// Home image since the gvisor backend (about 2.7 min of it, measured
// beside the backend's own tests on 2026-12-05).
var ColdMinutes = map[string]float64{
	"kubernetes": 6.7, "coredns": 1.4, "kube-router-netpol": 1.3, "distribution": 0.7, "crictl": 0.6, "etcd": 0.6,
	"knative-serving": 2.9, "traefik": 8.1, "net-gateway-api": 1.0, "net-kourier": 1.5, "lampyr": 5.7,
}

// ParallelGain is the wall time of the first run's builds over the sum of
// their ColdMinutes. Measured, not assumed: on a fresh 2-vCPU machine of
// this kind (2026-12-03, `just test-knative-portability` from a fresh clone,
// nothing else running) the builds, with the suite's own compile beside
// them, took 32 min where their figures add up to 26.4: two go builds at
// once keep both cores busy each, so running them side by side gains no
// wall time on two cores; it only lets I/O-bound steps overlap.
const ParallelGain = 1.2

// Plan is what a run still has to build.
type Plan struct {
	Items   []string // "kubernetes v1.35.4 (~6m40s)"
	Minutes float64  // the sum of their ColdMinutes
}

// Add adds spec when it is not cached in b's work directory.
func (p *Plan) Add(ctx context.Context, b *gobuild.Builder, s gobuild.Spec) {
	if ok, err := b.Cached(ctx, s); err != nil || ok {
		return
	}
	p.AddNamed(s.Name, s.Version)
}

// AddNamed adds a build that is not a gobuild.Spec (Lampyr from the
// checkout) under name.
func (p *Plan) AddNamed(name, version string) {
	m := ColdMinutes[name]
	p.Minutes += m
	item := name
	if version != "" {
		item += " " + version
	}
	p.Items = append(p.Items, fmt.Sprintf("%s (~%s)", item, Minutes(m)))
}

// Inputs is the plan for the node image's builds of a cache whose Go work
// directory is workDir (clusters/inputs). Kubernetes' spec needs its
// module fetched; when that fails it is counted as not built.
func Inputs(ctx context.Context, workDir string) *Plan {
	b := &gobuild.Builder{WorkDir: workDir}
	p := &Plan{}
	if k, err := inputs.KubernetesSpec(ctx); err == nil {
		p.Add(ctx, b, k)
	} else {
		p.AddNamed("kubernetes", "")
	}
	for _, s := range []gobuild.Spec{inputs.EtcdSpec(), inputs.CoreDNSSpec(), inputs.CrictlSpec(), inputs.RegistrySpec(), inputs.NetworkPolicySpec()} {
		p.Add(ctx, b, s)
	}
	return p
}

// Line is the first-run line for p: empty when nothing is to be built.
// more is said after the figure (what else a run adds), if anything.
func (p *Plan) Line(cache, more string) string {
	if len(p.Items) == 0 {
		return ""
	}
	line := fmt.Sprintf("ℹ First run with this cache (%s): building %d inputs from pinned sources, %d at a time: %s, plus the node's Debian rootfs beside them. Each figure is the build alone on an idle 2-core machine of this kind; all of it takes about %s here (machines of this kind differ up to 3x).",
		cache, len(p.Items), gobuild.Jobs(), strings.Join(p.Items, ", "), Minutes(p.Minutes*ParallelGain))
	if more != "" {
		line += " " + more
	}
	return line + " Later runs reuse the cache."
}

// PairMinutes is about how long the default pair's own builds add to the
// inputs' (Knative Serving, Traefik and net-gateway-api, Lampyr), for a
// line said before the suite knows its profiles.
func PairMinutes() float64 {
	return (ColdMinutes["knative-serving"] + ColdMinutes["traefik"] + ColdMinutes["net-gateway-api"] + ColdMinutes["lampyr"]) * ParallelGain
}

// Minutes renders m minutes as a rounded duration.
func Minutes(m float64) string {
	return (time.Duration(m*60) * time.Second).Round(10 * time.Second).String()
}
