package installenv

import (
	"path/filepath"
	"testing"
)

func TestDefaults(t *testing.T) {
	t.Setenv(CacheDir, "")
	t.Setenv("XDG_CACHE_HOME", "/tmp/x")
	if got := Cache(); got != filepath.Join("/tmp/x", "lampyr") {
		t.Errorf("Cache() = %s with XDG_CACHE_HOME=/tmp/x", got)
	}
	t.Setenv(CacheDir, "/tmp/c")
	if got := Cache(); got != "/tmp/c" {
		t.Errorf("Cache() = %s with %s=/tmp/c", got, CacheDir)
	}
	t.Setenv(StateDir, "")
	if got := State("/tmp/c"); got != filepath.Join("/tmp/c", "clusters") {
		t.Errorf("State = %s, want <cache>/clusters", got)
	}
	t.Setenv(StateDir, "/tmp/s")
	if got := State("/tmp/c"); got != "/tmp/s" {
		t.Errorf("State = %s with %s=/tmp/s", got, StateDir)
	}
	t.Setenv(Networking, "")
	if got := Provider("gateway-api"); got != "gateway-api" {
		t.Errorf("Provider = %s, want the default", got)
	}
	t.Setenv(Networking, "kourier")
	if got := Provider("gateway-api"); got != "kourier" {
		t.Errorf("Provider = %s with %s=kourier", got, Networking)
	}
}
