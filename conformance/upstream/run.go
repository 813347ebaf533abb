// Package upstream runs Knative's own conformance suites, compiled from the
// modules this repository pins, against a cluster, and turns `go test -json`
// into per-test results checked against an implementation's declared
// expectations (expectations.go) and a ConformanceReport (report.go).
package upstream

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"time"

	"lampyr.dev/serving/impl/progress"
)

// Suite is one upstream test package.
type Suite struct {
	// Name is short and stable: it names the report's section and files.
	Name string `json:"name"`
	// Package is the Go package holding the tests.
	Package string `json:"package"`
	// Module and Version say where Package comes from.
	Module  string `json:"module"`
	Version string `json:"version"`
	// Tags are the build tags the package's files need.
	Tags string `json:"tags,omitempty"`
	// Root, when set, is the one Go test that runs the whole suite as its
	// subtests (networking's TestIngressConformance): the suite's tests are
	// then Root's subtests, named as the suite names them in Tests
	// ("basics", "dispatch/path"), and Root's own outcome is not a result.
	Root  string   `json:"root,omitempty"`
	Tests []string `json:"tests,omitempty"`
}

// name maps a `go test -json` test name to the suite's test it belongs to,
// and tells whether it is that test itself (not one of its subtests). ok is
// false for names outside the suite (a rooted suite's Root itself).
func (s Suite) name(goName string) (test string, self, ok bool) {
	if s.Root == "" {
		top, _, nested := strings.Cut(goName, "/")
		return top, !nested, true
	}
	rest, ok := strings.CutPrefix(goName, s.Root+"/")
	if !ok {
		return "", false, false
	}
	best := ""
	for _, t := range s.Tests {
		if (rest == t || strings.HasPrefix(rest, t+"/")) && len(t) > len(best) {
			best = t
		}
	}
	if best == "" {
		// a test the list does not know (a newer suite): its first element
		best, _, _ = strings.Cut(rest, "/")
	}
	return best, rest == best, true
}

// pattern is a go test -run/-skip pattern selecting exactly test.
func (s Suite) pattern(test string) string {
	parts := strings.Split(test, "/")
	if s.Root != "" {
		parts = append([]string{s.Root}, parts...)
	}
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// Outcomes of a test. A declared expectation turns fail into
// expected-fail; a skip the suite made itself (for example of an optional
// API it was told not to test) stays skip.
const (
	Pass         = "pass"
	Fail         = "fail"
	Skip         = "skip"
	ExpectedFail = "expected-fail"
)

// Result is one top-level test of a suite.
type Result struct {
	Name    string  `json:"name"`
	Outcome string  `json:"outcome"`
	Seconds float64 `json:"seconds"`
	// Subtests counts the test's subtests; FailedSubtests names those that failed.
	Subtests       int      `json:"subtests,omitempty"`
	FailedSubtests []string `json:"failedSubtests,omitempty"`
	// Reason is the skip message, or the tail of a failure's output.
	Reason string `json:"reason,omitempty"`
	// Feature and Declared are set when an expectation covers the test:
	// the feature the test needs and why it is not claimed.
	Feature  string `json:"feature,omitempty"`
	Declared string `json:"declared,omitempty"`
	// Labels are the test's labels in a suite that has them (Lampyr's:
	// what a -ginkgo.label-filter selects).
	Labels []string `json:"labels,omitempty"`
}

// Invocation is one `go test` run of a suite.
type Invocation struct {
	Suite Suite
	// Dir is the module whose go.mod pins the suite's module (the repository root).
	Dir string
	// Args go to the test binary (after -args).
	Args []string
	// Env is added to the environment.
	Env []string
	// Skip lists tests not to run at all (go test -skip), by top-level name.
	Skip []string
	// Run, when set, selects tests (go test -run): a partial run, reported as such.
	Run string
	// Parallel bounds the suite's t.Parallel tests (go test -parallel).
	Parallel int
	Timeout  time.Duration
	// Raw receives go test's JSON stream as it comes.
	Raw io.Writer
	Log *progress.Log
}

// Command is the go test command line Run executes, for the report's
// Reproduce section.
func (inv Invocation) Command() []string {
	args := []string{"go", "test", "-json", "-count=1"}
	if inv.Suite.Tags != "" {
		args = append(args, "-tags="+inv.Suite.Tags)
	}
	if inv.Timeout > 0 {
		args = append(args, "-timeout="+inv.Timeout.String())
	}
	if inv.Parallel > 0 {
		args = append(args, fmt.Sprintf("-parallel=%d", inv.Parallel))
	}
	args = append(args, inv.Suite.Package)
	if inv.Run != "" {
		args = append(args, "-run="+inv.Run)
	}
	if len(inv.Skip) > 0 {
		names := append([]string(nil), inv.Skip...)
		sort.Strings(names)
		for i, n := range names {
			names[i] = inv.Suite.pattern(n)
		}
		args = append(args, "-skip="+strings.Join(names, "|"))
	}
	if len(inv.Args) > 0 {
		args = append(append(args, "-args"), inv.Args...)
	}
	return args
}

// Run executes the suite and returns one Result per top-level test. An
// error means the suite could not run (it did not compile, or reported no
// test); failing tests are results, not errors.
func Run(ctx context.Context, inv Invocation) ([]Result, error) {
	argv := inv.Command()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = inv.Dir
	cmd.Env = append(os.Environ(), inv.Env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var r io.Reader = stdout
	if inv.Raw != nil {
		r = io.TeeReader(stdout, inv.Raw)
	}
	results, buildOut := inv.Suite.Parse(r, func(res Result) {
		if inv.Log != nil {
			inv.Log.Printf("   %-4s %-52s %6.1fs %s", res.Outcome, res.Name, res.Seconds, Cause(res.Reason))
		}
	})
	waitErr := cmd.Wait()
	if len(results) == 0 {
		return nil, fmt.Errorf("%s reported no test (go test: %v): %s%s", inv.Suite.Package, waitErr, strings.TrimSpace(stderr.String()), strings.TrimSpace(buildOut))
	}
	return results, nil
}

type event struct {
	Action, Test, Output string
	Elapsed              float64
}

// Parse reads `go test -json` of a suite without a Root.
func Parse(r io.Reader, done func(Result)) ([]Result, string) {
	return Suite{}.Parse(r, done)
}

// Parse reads `go test -json` and returns the suite's tests in name
// order (top-level tests, or Root's subtests), each with its own subtests
// rolled up, and the output that belonged to no test (build errors, a
// panic's trace). done is called as each test ends.
func (s Suite) Parse(r io.Reader, done func(Result)) ([]Result, string) {
	type acc struct {
		out    strings.Builder
		subs   int
		failed []string
	}
	tests := map[string]*acc{}
	var results []Result
	var loose strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			loose.WriteString(sc.Text() + "\n")
			continue
		}
		if e.Test == "" {
			if e.Action == "output" {
				loose.WriteString(e.Output)
			}
			continue
		}
		top, self, ok := s.name(e.Test)
		if !ok {
			continue
		}
		nested := !self
		_, sub, _ := strings.Cut(strings.TrimPrefix(e.Test, s.Root+"/"), top+"/")
		a := tests[top]
		if a == nil {
			a = &acc{}
			tests[top] = a
		}
		switch e.Action {
		case "output":
			a.out.WriteString(e.Output)
		case "run":
			if nested {
				a.subs++
			}
		case "fail":
			if nested {
				a.failed = append(a.failed, sub)
			}
		}
		if nested {
			continue
		}
		switch e.Action {
		case Pass, Fail, Skip:
			res := Result{Name: top, Outcome: e.Action, Seconds: e.Elapsed, Subtests: a.subs, FailedSubtests: a.failed}
			if e.Action != Pass {
				res.Reason = Reason(a.out.String(), e.Action)
			}
			results = append(results, res)
			if done != nil {
				done(res)
			}
		}
	}
	sort.Slice(results, func(i, j int) bool { return results[i].Name < results[j].Name })
	return results, loose.String()
}

// Reason keeps what a reader needs of a test's output: a skip's message,
// or the last lines of a failure, without go test's own framing lines.
func Reason(out, action string) string {
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		l = strings.TrimSpace(l)
		// client-go's warnings (klog lines) say nothing about the test.
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ") || strings.Contains(l, "] \"Warning: ") {
			continue
		}
		keep = append(keep, l)
	}
	limit := 20
	if action == Skip {
		limit = 3
		// t.Skip() without a message leaves only "file_test.go:NN:".
		if len(keep) == 1 && strings.HasSuffix(keep[0], ":") {
			return "skipped by the suite without a message at " + strings.TrimSuffix(keep[0], ":") + " (a flag or feature gate it checks: see that line)"
		}
	}
	if len(keep) > limit {
		keep = keep[len(keep)-limit:]
	}
	return strings.Join(keep, "\n")
}

// Cause is the one line of a reason that says what went wrong: the last
// line carrying an error marker (a test fails at its end; earlier lines
// that merely contain such a word, in an object dump, are progress), else
// the first line.
func Cause(reason string) string {
	lines := strings.Split(reason, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if strings.HasPrefix(l, ", headers:") {
			continue // the tail of a spoofing error, split over two lines
		}
		for _, m := range []string{"Error", "error", "unexpected", "wanted", "Fatal", "failed", "Failed", "timed out", "not Ready", "deadline exceeded", "did not"} {
			if strings.Contains(l, m) {
				return firstLine(l)
			}
		}
	}
	return firstLine(reason)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	if len(l) > 200 {
		l = l[:200] + "..."
	}
	return l
}
