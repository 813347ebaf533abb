package install

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// repoRoot is this checkout's root, for the tests below.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// goList runs `go list` in the checkout's root and returns its lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), append([]string{"list"}, args...)...)
	cmd.Dir = repoRoot()
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestImplDoesNotLinkTheTestFramework: what ships (every package under
// impl, `ly cluster install` with this installer among them) links neither
// the suites' helpers nor a test framework (issue 20; docs: STYLE "impl never
// imports a suite").
func TestImplDoesNotLinkTheTestFramework(t *testing.T) {
	for _, dep := range goList(t, "-deps", "./impl/...") {
		for _, banned := range []string{"lampyr.dev/serving/clusters/e2eutil", "lampyr.dev/serving/clusters/harness", "github.com/onsi/ginkgo", "github.com/onsi/gomega", "sigs.k8s.io/e2e-framework"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("a package under impl links %s; find the chain with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./impl/... | grep %s", dep, banned)
			}
		}
	}
}

// frameworkRoot is the cluster framework's import path: clusters/ builds
// on impl/ (the installer is product code, issue 33), never the reverse.
const frameworkRoot = "lampyr.dev/serving/clusters"

func isFramework(path string) bool {
	return path == frameworkRoot || strings.HasPrefix(path, frameworkRoot+"/")
}

// TestImplImportsNothingUnderClusters: no package under impl, its tests
// included, imports the cluster framework, directly (any .go file under
// impl, whatever its build constraints) or through another package (the
// dependencies of every impl package and test binary).
func TestImplImportsNothingUnderClusters(t *testing.T) {
	root := repoRoot()
	files := 0
	err := filepath.WalkDir(filepath.Join(root, "impl"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir // not packages of this module
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if isFramework(p) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s imports %s: impl must not import the cluster framework (move what it needs into impl, as impl/install, impl/build and impl/progress were)", rel, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d .go files under impl: the walk missed the tree", files)
	}
	seen := map[string]bool{}
	for _, line := range goList(t, "-deps", "-test", "./impl/...") {
		dep := strings.Fields(line)[0] // "pkg [x.test]": pkg as x's test links it
		if isFramework(dep) && !seen[dep] {
			seen[dep] = true
			t.Errorf("a package or test under impl links %s; find the chain with: go list -deps -test -f '{{.ImportPath}}: {{.Imports}}' ./impl/... | grep %s", dep, frameworkRoot)
		}
	}
}
