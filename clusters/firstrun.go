package clusters

import (
	"context"

	"lampyr.dev/serving/clusters/firstrun"
	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/networking"
)

// Announce prints, before a run's long steps and only when the cache lacks
// them, one line saying what will be built from source and about how long
// that takes here, so that a first run does not look stuck.
func (e *Env) Announce(ctx context.Context, profiles []string, provider string) {
	b := &gobuild.Builder{WorkDir: e.goCache()}
	plan := firstrun.Inputs(ctx, e.goCache())
	want := map[string]bool{}
	for _, p := range profiles {
		want[p] = true
	}
	servingCold := false
	if want[ProfileStock] || want[ProfileLampyr] {
		specs := []gobuild.Spec{install.ServingSpec()}
		if prov, err := networking.Get(provider); err == nil {
			if ps, err := networking.Specs(ctx, prov); err == nil {
				specs = append(specs, ps...)
			}
		}
		for _, s := range specs {
			if s.Name == "knative-serving" {
				ok, err := b.Cached(ctx, s)
				servingCold = err == nil && !ok
			}
			plan.Add(ctx, b, s)
		}
	}
	if want[ProfileLampyr] && servingCold && e.LampyrSources == (install.LampyrSources{}) {
		// Lampyr is relinked from this checkout every run; from an empty
		// Go build cache it compiles Serving's reconcilers and client-go.
		plan.AddNamed("lampyr", "from this checkout")
	}
	if line := plan.Line(e.Cache, ""); line != "" {
		e.Log.Printf(" %s", line)
	}
}

// goCache is where the framework's Go builds live (Publisher's and the
// inputs builder's work directory).
func (e *Env) goCache() string { return e.Publisher().Go.WorkDir }
