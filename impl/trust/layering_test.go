package trust_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestSharedLibrariesStayBelowTheComponents: the trust libraries
// (impl/trust/...) and the contract (impl/contract/...) are what the grant
// controller, the Revision reconciler, fiber-router, fiberd and ly share, so
// they import none of those components (issue 31: impl/contract used to
// import impl/fiberd for the egress policy).
func TestSharedLibrariesStayBelowTheComponents(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	components := []string{"impl/fiberd", "impl/grant", "impl/router", "impl/reconciler", "impl/ly", "impl/install", "impl/cmd"}
	for _, shared := range []string{"./impl/trust/...", "./impl/contract/..."} {
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", shared)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", shared, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, c := range components {
				if dep == "lampyr.dev/serving/"+c || strings.HasPrefix(dep, "lampyr.dev/serving/"+c+"/") {
					t.Errorf("%s links %s; find the chain with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' %s | grep %s", shared, dep, shared, c)
				}
			}
		}
	}
}
