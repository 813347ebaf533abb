package resources

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/config"
)

// home-warm-idle (default 90s) reaches fiberd as --warm-idle unless 0, in a grant's
// Home Pod and a spare alike, so that a spare still fits.
func TestWarmIdleArg(t *testing.T) {
	g := grant(v1alpha1.ExecutionFresh, 4)
	for value, want := range map[string]string{"": "--warm-idle=1m30s", "0": "", "5m": "--warm-idle=5m0s"} {
		data := map[string]string{}
		if value != "" {
			data[lampyrconfig.KeyHomeWarmIdle] = value
		}
		cfg, err := config.FromConfigMap(&corev1.ConfigMap{Data: data})
		if err != nil {
			t.Fatal(err)
		}
		home := MakeHomePod(g, cfg, "lampyr-homes", 0).Spec.Containers[0].Args
		spare := MakeSparePod(cfg, "lampyr-homes", "home-spare-x").Spec.Containers[0].Args
		has := slices.ContainsFunc(home, func(a string) bool { return strings.HasPrefix(a, "--warm-idle") })
		switch {
		case want == "" && has:
			t.Errorf("home-warm-idle %q: args %v, want no --warm-idle", value, home)
		case want != "" && !slices.Contains(home, want):
			t.Errorf("home-warm-idle %q: args %v, want %s", value, home, want)
		case !slices.Contains(spare, want) && want != "":
			t.Errorf("home-warm-idle %q: spare args %v, want %s", value, spare, want)
		}
		if ok, why := SpareFits(MakeSparePod(cfg, "lampyr-homes", "home-spare-x"), g, cfg, "lampyr-homes"); !ok {
			t.Errorf("home-warm-idle %q: a spare does not fit: %s", value, why)
		}
	}
}

// An idle request is never above a full Home's: config-lampyr's bounds are
// this package's overhead and CPU request.
func TestIdleBoundsAreTheHomes(t *testing.T) {
	if lampyrconfig.MaxHomeIdleMemory.Cmp(HomeOverhead) != 0 || lampyrconfig.MaxHomeIdleCPU.Cmp(HomeCPURequest) != 0 {
		t.Errorf("lampyrconfig bounds %s/%s, want HomeOverhead %s and HomeCPURequest %s",
			lampyrconfig.MaxHomeIdleMemory.String(), lampyrconfig.MaxHomeIdleCPU.String(), HomeOverhead.String(), HomeCPURequest.String())
	}
}

// WithRequests changes the fiberd container's requests only: limits stay.
func TestWithRequestsKeepsLimits(t *testing.T) {
	cfg := config.Defaults()
	g := grant(v1alpha1.ExecutionFresh, 4)
	p := MakeHomePod(g, cfg, "lampyr-homes", 0)
	idle := WithRequests(p, IdleRequests(cfg))
	c := FiberdOf(idle)
	if !SameRequests(c.Resources.Requests, corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("1m")}) {
		t.Errorf("idle requests %v", c.Resources.Requests)
	}
	if full := HomeResources(g, cfg); !SameRequests(c.Resources.Limits, full.Limits) || !SameRequests(FiberdOf(p).Resources.Requests, full.Requests) {
		t.Errorf("limits %v (want %v), or the original Pod changed", c.Resources.Limits, full.Limits)
	}
}
