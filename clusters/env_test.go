package clusters

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/progress"
)

func TestGatewayPortsAndPairedProfiles(t *testing.T) {
	if got := GatewayPortFor("lampyr"); got.NodePort != LampyrGatewayPort || got.HostPort != LampyrGatewayPort {
		t.Errorf("GatewayPortFor(lampyr) = %+v", got)
	}
	// A name that starts like a paired cluster's is not one of them.
	if got := GatewayPortFor("lampyr-x"); got.NodePort != DefaultNodePort || got.HostPort != 0 {
		t.Errorf("GatewayPortFor(lampyr-x) = %+v, want NodePort %d on a free host port", got, DefaultNodePort)
	}
	if p, ok := PairedProfile("stock"); !ok || p != ProfileStock {
		t.Errorf("PairedProfile(stock) = %q, %v", p, ok)
	}
	if p, ok := PairedProfile("stock-x"); ok {
		t.Errorf("PairedProfile(stock-x) = %q: a profile must be stated for any other name", p)
	}
}

// TestInstallerAgreesWithKind: `ly cluster install` uses the installer's
// defaults and reads the framework's cluster records without this
// package; they must be what the framework's Kind clusters use.
func TestInstallerAgreesWithKind(t *testing.T) {
	e := NewEnv(progress.New(io.Discard), Settings{Cache: t.TempDir()})
	i := e.Installer()
	if def := (&install.Installer{Cache: e.Cache}).Publisher().Registry; i.Registry != def {
		t.Errorf("the framework's registry %s, the installer's default %s", i.Registry, def)
	}
	if i.RegistryMirror != install.LocalRegistryMirror {
		t.Errorf("the framework's registry mirror %s, the installer's default %s", i.RegistryMirror, install.LocalRegistryMirror)
	}
	if i.Root != install.RepoRoot() {
		t.Errorf("RepoRoot %s, install.RepoRoot %s", i.Root, install.RepoRoot())
	}

	dir := t.TempDir()
	m := kindcluster.NewManager(dir, e.Log)
	info := kindcluster.Info{Name: "lampyr", Ports: []kindcluster.PortMapping{GatewayPortFor("lampyr"), TLSPortFor("lampyr")}}
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "lampyr.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	read, err := m.ReadInfo("lampyr")
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := install.RecordedNodePort(dir, "lampyr"); !ok || p != read.Gateway().NodePort || p != LampyrGatewayPort {
		t.Errorf("install.RecordedNodePort = %d, %v; the record's gateway NodePort is %d", p, ok, read.Gateway().NodePort)
	}
}
