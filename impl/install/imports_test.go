package install

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestImplDoesNotLinkTheTestFramework: what ships (every package under
// impl, `ly cluster install` with this installer among them) links neither
// the suites' helpers nor a test framework (issue 20; docs: STYLE "impl never
// imports a suite").
func TestImplDoesNotLinkTheTestFramework(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", "./impl/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./impl/...: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"lampyr.dev/serving/clusters/e2eutil", "lampyr.dev/serving/clusters/harness", "github.com/onsi/ginkgo", "github.com/onsi/gomega", "sigs.k8s.io/e2e-framework"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("a package under impl links %s; find the chain with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./impl/... | grep %s", dep, banned)
			}
		}
	}
}
