package lampyrconfig

import (
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract"
)

// Each component parses only its keys: a mistake in a grant key does not
// stop the Revision controller, and the reverse.
func TestParseReadsOnlyTheGivenKeys(t *testing.T) {
	data := map[string]string{KeyFiberEgress: "sometimes", KeyBackendStrategy: "nodeport"}
	_, err := Parse(data, RevisionKeys)
	if err == nil || !strings.Contains(err.Error(), KeyBackendStrategy) || strings.Contains(err.Error(), KeyFiberEgress) {
		t.Errorf("revision keys: %v, want only %s named", err, KeyBackendStrategy)
	}
	_, err = Parse(data, GrantKeys)
	if err == nil || !strings.Contains(err.Error(), KeyFiberEgress) || strings.Contains(err.Error(), KeyBackendStrategy) {
		t.Errorf("grant keys: %v, want only %s named", err, KeyFiberEgress)
	}
}

// Every error names the ConfigMap, the key and what is accepted; all bad
// keys are reported at once.
func TestParseErrorsNameKeyAndFix(t *testing.T) {
	data := map[string]string{
		KeyFiberMemoryCapacity:   "lots",
		KeyGrantTTL:              "5s",
		KeyDefaultMemoryPerFiber: "0",
		KeyVerifyArtifacts:       "maybe",
		KeyRegistryMirrors:       "localhost:5002",
		KeyTemplateRepository:    "UPPER/case",
	}
	_, err := Parse(data, append(append([]string(nil), GrantKeys...), RevisionKeys...))
	if err == nil {
		t.Fatal("no error")
	}
	for key, fix := range map[string]string{
		KeyFiberMemoryCapacity:   "positive quantity",
		KeyGrantTTL:              "at least 30s",
		KeyDefaultMemoryPerFiber: "positive quantity",
		KeyVerifyArtifacts:       "true or false",
		KeyRegistryMirrors:       "from=to",
		KeyTemplateRepository:    "want a repository",
	} {
		if !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), fix) {
			t.Errorf("error %q: want %s with %q", err, key, fix)
		}
	}
	if !strings.HasPrefix(err.Error(), "ConfigMap "+contract.ConfigMapName+": ") {
		t.Errorf("error %q does not name the ConfigMap", err)
	}
}

func TestRulesBetweenKeys(t *testing.T) {
	for _, tc := range []struct {
		data map[string]string
		want string
	}{
		{map[string]string{KeyDefaultMaxFibers: "20", KeyMaxFibersPerGrant: "10"}, KeyDefaultMaxFibers + " 20 exceeds " + KeyMaxFibersPerGrant},
		{map[string]string{KeyHomeCPULimit: "500m"}, KeyFiberCPULimit + " 1 exceeds " + KeyHomeCPULimit},
		{map[string]string{KeyHomeStorageLimit: "100Mi"}, "want at least 256Mi"},
	} {
		if _, err := Parse(tc.data, GrantKeys); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.data, err, tc.want)
		}
		if _, err := Parse(tc.data, RevisionKeys); err != nil {
			t.Errorf("%v: the Revision controller does not read these keys, got %v", tc.data, err)
		}
	}
}

func TestMirrors(t *testing.T) {
	c, err := Parse(map[string]string{KeyHomeRegistryMirrors: "localhost:5002=kind-registry:5000, "}, RevisionKeys)
	if err != nil || len(c.RegistryMirrors) != 1 || c.RegistryMirrors[0] != "localhost:5002=kind-registry:5000" {
		t.Errorf("home mirrors as the controller's: %+v %v", c, err)
	}
	c, err = Parse(map[string]string{KeyHomeRegistryMirrors: "a=b", KeyRegistryMirrors: "c=d"}, RevisionKeys)
	if err != nil || len(c.RegistryMirrors) != 1 || c.RegistryMirrors[0] != "c=d" || c.HomeRegistryMirrors[0] != "a=b" {
		t.Errorf("registry-mirrors wins for the controller: %+v %v", c, err)
	}
}

func TestFiberEgressModes(t *testing.T) {
	for _, v := range []string{EgressCluster, EgressDirect, EgressOff} {
		c, err := Parse(map[string]string{KeyFiberEgress: v}, GrantKeys)
		if err != nil || c.Egress != v {
			t.Errorf("%s=%s: %+v %v", KeyFiberEgress, v, c, err)
		}
	}
	if got := Defaults().EgressAPI; got != "http://lampyr-grant-controller.lampyr-system.svc:8092" {
		t.Errorf("default egress API %q", got)
	}
}

func TestFiberBackend(t *testing.T) {
	if c := Defaults(); c.FiberBackend != BackendProcess || !c.FiberGVisorPreinit {
		t.Errorf("defaults: backend %q preinit %v, want process and true", c.FiberBackend, c.FiberGVisorPreinit)
	}
	c, err := Parse(map[string]string{KeyFiberBackend: " gvisor ", KeyFiberGVisorPreinit: "false"}, GrantKeys)
	if err != nil || c.FiberBackend != BackendGVisor || c.FiberGVisorPreinit {
		t.Errorf("gvisor, preinit false: %+v %v", c, err)
	}
	for k, v := range map[string]string{KeyFiberBackend: "firecracker", KeyFiberGVisorPreinit: "sometimes"} {
		if _, err := Parse(map[string]string{k: v}, GrantKeys); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v, want an error naming the key", k, v, err)
		}
	}
}

// The idle give-back keys (home-idle-after, home-idle-memory,
// home-idle-cpu) and home-warm-idle: their defaults, what parses, and
// errors that name the key and what is accepted.
func TestHomeIdleKeys(t *testing.T) {
	d := Defaults()
	if d.HomeIdleAfter != 60*time.Second || d.HomeIdleMemory.String() != "64Mi" || d.HomeIdleCPU.String() != "1m" || d.HomeWarmIdle != 90*time.Second {
		t.Errorf("defaults: idle after %s, memory %s, cpu %s, warm idle %s; want 60s, 64Mi, 1m, 90s",
			d.HomeIdleAfter, d.HomeIdleMemory.String(), d.HomeIdleCPU.String(), d.HomeWarmIdle)
	}
	for _, tc := range []struct {
		data  map[string]string
		check func(*Config) bool
	}{
		{map[string]string{KeyHomeIdleAfter: "0"}, func(c *Config) bool { return c.HomeIdleAfter == 0 }},
		{map[string]string{KeyHomeIdleAfter: " 2m "}, func(c *Config) bool { return c.HomeIdleAfter == 2*time.Minute }},
		{map[string]string{KeyHomeIdleAfter: "15s"}, func(c *Config) bool { return c.HomeIdleAfter == 15*time.Second }},
		{map[string]string{KeyHomeIdleMemory: "32Mi"}, func(c *Config) bool { return c.HomeIdleMemory.String() == "32Mi" }},
		{map[string]string{KeyHomeIdleMemory: "256Mi"}, func(c *Config) bool { return c.HomeIdleMemory.String() == "256Mi" }},
		{map[string]string{KeyHomeIdleCPU: "5m"}, func(c *Config) bool { return c.HomeIdleCPU.String() == "5m" }},
		{map[string]string{KeyHomeWarmIdle: "5m"}, func(c *Config) bool { return c.HomeWarmIdle == 5*time.Minute }},
		{map[string]string{KeyHomeWarmIdle: "0s"}, func(c *Config) bool { return c.HomeWarmIdle == 0 }},
	} {
		c, err := Parse(tc.data, GrantKeys)
		if err != nil || !tc.check(c) {
			t.Errorf("%v: %+v %v", tc.data, c, err)
		}
	}
	for _, tc := range []struct {
		key, value, want string
	}{
		{KeyHomeIdleAfter, "soon", "want 0 (off) or a duration of at least 15s"},
		{KeyHomeIdleAfter, "-1s", "want 0 (off) or a duration of at least 15s"},
		{KeyHomeIdleAfter, "5s", "want 0 (off) or a duration of at least 15s"},
		{KeyHomeIdleMemory, "0", "positive quantity"},
		{KeyHomeIdleMemory, "lots", "positive quantity"},
		{KeyHomeIdleMemory, "512Mi", "want at most 256Mi"},
		{KeyHomeIdleCPU, "-1", "positive quantity"},
		{KeyHomeIdleCPU, "100m", "want at most 25m"},
		{KeyHomeWarmIdle, "-5m", "want 0 (off) or a positive duration"},
		{KeyHomeWarmIdle, "often", "want 0 (off) or a positive duration"},
	} {
		_, err := Parse(map[string]string{tc.key: tc.value}, GrantKeys)
		if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q: error %v, want one naming the key with %q", tc.key, tc.value, err, tc.want)
		}
		if _, err := Parse(map[string]string{tc.key: tc.value}, RevisionKeys); err != nil {
			t.Errorf("%s=%q: the Revision controller does not read it, got %v", tc.key, tc.value, err)
		}
	}
}
