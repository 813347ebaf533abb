package install

import (
	"os"
	"path/filepath"
	"testing"

	"lampyr.dev/serving/impl/install/networking"
)

func TestBackendStrategyFor(t *testing.T) {
	for prov, want := range map[string]string{
		"gateway-api":     "endpointslice",
		"traefik-knative": "endpointslice",
		"traefik":         "endpointslice", // the old name of traefik-knative
		"kourier":         "externalname",
	} {
		if got := BackendStrategyFor(prov); got != want {
			t.Errorf("BackendStrategyFor(%s) = %s, want %s", prov, got, want)
		}
	}
	for _, n := range networking.Names() {
		if _, ok := backendStrategies[n]; !ok {
			t.Errorf("provider %s has no backend strategy from the feasibility gate", n)
		}
	}
}

func TestInstallerDefaults(t *testing.T) {
	i := &Installer{Cache: "/tmp/c"}
	p := i.Publisher()
	if p.Registry != LocalRegistry || p.Go.WorkDir != filepath.Join("/tmp/c", "go") {
		t.Errorf("Publisher() = registry %s, work dir %s", p.Registry, p.Go.WorkDir)
	}
	if got := i.registryMirror(); got != "localhost:5002=lampyr-registry:5000" {
		t.Errorf("registryMirror() = %s", got)
	}
	if _, err := os.Stat(filepath.Join(i.root(), ImplConfigDir)); err != nil {
		t.Errorf("root() = %s, not this checkout: %v", i.root(), err)
	}
}

func TestRecordedNodePort(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name+".json"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("lampyr", `{"name":"lampyr","ports":[{"nodePort":32080,"hostPort":32080},{"nodePort":32443,"hostPort":32443}]}`)
	write("bare", `{"name":"bare","ports":[]}`)
	write("broken", `{`)
	if p, ok := RecordedNodePort(dir, "lampyr"); !ok || p != 32080 {
		t.Errorf("RecordedNodePort(lampyr) = %d, %v; want the first port, 32080", p, ok)
	}
	for _, name := range []string{"bare", "broken", "absent"} {
		if p, ok := RecordedNodePort(dir, name); ok {
			t.Errorf("RecordedNodePort(%s) = %d, want none", name, p)
		}
	}
}
