package stubs

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTraefikDynamicExt(t *testing.T) {
	m := TraefikDynamicExt()
	if m.Path != "github.com/traefik/traefik/dynamic/ext" {
		t.Fatalf("path = %s", m.Path)
	}
	src := m.Files["ext.go"]
	for _, want := range []string{"package ext", "type HTTP struct{}", "type Router struct{}"} {
		if !strings.Contains(src, want) {
			t.Errorf("ext.go lacks %q", want)
		}
	}
	if len(m.Files) != 1 {
		t.Errorf("files = %v, want only ext.go", m.Files)
	}
}

// TestTraefikGatewayExternalName: the patch applies to a file holding the
// refusal once, parses, keeps refusing every other ExternalName, and
// refuses to apply to a file that changed.
func TestTraefikGatewayExternalName(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, filepath.FromSlash(TraefikGatewayFile))
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	orig := `package gateway

import (
	"errors"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	gatev1 "sigs.k8s.io/gateway-api/apis/v1"
)

func (p *Provider) getBackendAddresses(namespace string, ref gatev1.BackendRef) ([]backendAddress, corev1.ServicePort, error) {
	service, err := p.client.GetService(namespace, string(ref.Name))
	if err != nil {
		return nil, corev1.ServicePort{}, fmt.Errorf("getting service: %w", err)
	}
` + traefikExternalNameRefusal + `	return nil, corev1.ServicePort{}, nil
}
`
	if err := os.WriteFile(file, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := TraefikGatewayExternalName("github.com/traefik/traefik/v3", "v3.7.9", dir)
	if err != nil {
		t.Fatal(err)
	}
	got := p.Files[TraefikGatewayFile]
	if _, err := parser.ParseFile(token.NewFileSet(), "kubernetes.go", got, 0); err != nil {
		t.Fatalf("the patched file does not parse: %v\n%s", err, got)
	}
	for _, want := range []string{"lampyrExternalNameTarget(service.Spec.ExternalName)", "func lampyrExternalNameTarget", TraefikExternalNameEnv, `errors.New("type ExternalName is not supported for Kubernetes Service reference")`} {
		if !strings.Contains(got, want) {
			t.Errorf("the patched file lacks %q", want)
		}
	}
	if strings.Contains(got, traefikExternalNameRefusal) {
		t.Error("the unconditional refusal is still there")
	}
	if err := os.WriteFile(file, []byte(strings.Replace(orig, "type ExternalName is not supported", "ExternalName unsupported", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := TraefikGatewayExternalName("github.com/traefik/traefik/v3", "v9.9.9", dir); err == nil || !strings.Contains(err.Error(), "no longer matches") {
		t.Fatalf("a changed file was patched: %v", err)
	}
}
