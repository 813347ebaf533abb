package clusters

import (
	"context"
	"fmt"
	"strings"
	"time"

	"lampyr.dev/serving/clusters/build/gobuild"
	"lampyr.dev/serving/clusters/inputs"
	"lampyr.dev/serving/clusters/networking"
	"lampyr.dev/serving/impl/install"
)

// coldMinutes is how long each build takes from nothing (empty Go build and
// module caches) alone on an idle 2-vCPU, 24 GiB machine of the kind this
// project runs on, from the progress lines of a fresh-machine run (issue 30:
// Kubernetes 6 min 43 s, Traefik v3.7.9 8 min 7 s, ...). Machines of this
// kind differ up to 3x; the first-run line says so.
var coldMinutes = map[string]float64{
	"kubernetes": 6.7, "coredns": 1.4, "kube-router-netpol": 1.3, "distribution": 0.7, "crictl": 0.6, "etcd": 0.6,
	"knative-serving": 2.9, "traefik": 8.1, "net-gateway-api": 1.0, "net-kourier": 1.5, "lampyr": 3.0,
}

// parallelGain is the wall time of the first run's builds over the sum of
// their coldMinutes. Measured, not assumed: on a fresh 2-vCPU machine of
// this kind (2026-12-03, `just test-knative-portability` from a fresh clone,
// nothing else running) the builds, with the suite's own compile beside
// them, took 32 min where their figures add up to 26.4: two go builds at
// once keep both cores busy each, so running them side by side gains no
// wall time on two cores; it only lets I/O-bound steps overlap.
const parallelGain = 1.2

// Announce prints, before a run's long steps and only when the cache lacks
// them, one line saying what will be built from source and about how long
// that takes here, so that a first run does not look stuck.
func (e *Env) Announce(ctx context.Context, profiles []string, provider string) {
	b := &gobuild.Builder{WorkDir: e.goCache()}
	specs := []gobuild.Spec{inputs.EtcdSpec(), inputs.CoreDNSSpec(), inputs.CrictlSpec(), inputs.RegistrySpec(), inputs.NetworkPolicySpec()}
	if k, err := inputs.KubernetesSpec(ctx); err == nil {
		specs = append([]gobuild.Spec{k}, specs...)
	}
	want := map[string]bool{}
	for _, p := range profiles {
		want[p] = true
	}
	if want[ProfileStock] || want[ProfileLampyr] {
		specs = append(specs, install.ServingSpec())
		if prov, err := networking.Get(provider); err == nil {
			if ps, err := networking.Specs(ctx, prov); err == nil {
				specs = append(specs, ps...)
			}
		}
	}
	var cold []string
	total := 0.0
	servingCold := false
	for _, s := range specs {
		ok, err := b.Cached(ctx, s)
		if err != nil || ok {
			continue
		}
		if s.Name == "knative-serving" {
			servingCold = true
		}
		m := coldMinutes[s.Name]
		total += m
		cold = append(cold, fmt.Sprintf("%s %s (~%s)", s.Name, s.Version, minutes(m)))
	}
	if want[ProfileLampyr] && servingCold && e.LampyrSources == (install.LampyrSources{}) {
		// Lampyr is relinked from this checkout every run; from an empty
		// Go build cache it compiles Serving's reconcilers and client-go.
		total += coldMinutes["lampyr"]
		cold = append(cold, fmt.Sprintf("lampyr from this checkout (~%s)", minutes(coldMinutes["lampyr"])))
	}
	if len(cold) == 0 {
		return
	}
	e.Log.Printf(" ℹ First run with this cache (%s): building %d inputs from pinned sources, %d at a time: %s, plus the node's Debian rootfs beside them. Each figure is the build alone on an idle 2-core machine of this kind; all of it takes about %s here (machines of this kind differ up to 3x). Later runs reuse the cache.",
		e.Cache, len(cold), gobuild.Jobs(), strings.Join(cold, ", "), minutes(total*parallelGain))
}

func minutes(m float64) string {
	return (time.Duration(m*60) * time.Second).Round(10 * time.Second).String()
}

// goCache is where the framework's Go builds live (Publisher's and the
// inputs builder's work directory).
func (e *Env) goCache() string { return e.Publisher().Go.WorkDir }
