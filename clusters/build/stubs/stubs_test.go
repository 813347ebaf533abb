package stubs

import (
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
