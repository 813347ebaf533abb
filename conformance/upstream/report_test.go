package upstream

import (
	"path/filepath"
	"testing"
)

// One report holds the upstream suites and Lampyr's: AddSuite adds or
// replaces a section and sets the overall result; ReadReport reads back
// what Write wrote.
func TestAddSuiteKeepsOneReport(t *testing.T) {
	r := &Report{Implementation: Implementation{Name: "lampyr"}, Suites: []SuiteReport{{Suite: Suite{Name: "api"}, Result: "partial"}}}
	r.AddSuite(SuiteReport{Suite: Suite{Name: "lampyr"}, Result: "success", Claimed: []string{"serving"}, Tests: []Result{{Name: "valid", Outcome: Pass, Labels: []string{"routing"}}}})
	if len(r.Suites) != 2 || r.Result != "partial" {
		t.Fatalf("added: %d suites, result %s", len(r.Suites), r.Result)
	}
	r.AddSuite(SuiteReport{Suite: Suite{Name: "lampyr"}, Result: "failure"})
	if len(r.Suites) != 2 || r.Result != "failure" || r.Kind != "ConformanceReport" {
		t.Fatalf("replaced: %d suites, result %s, kind %s", len(r.Suites), r.Result, r.Kind)
	}
	r.Suites[1] = SuiteReport{Suite: Suite{Name: "lampyr"}, Result: "success", Claimed: []string{"serving"}, Tests: []Result{{Name: "valid", Outcome: Pass, Labels: []string{"routing"}}}}
	dir := t.TempDir()
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	back, err := ReadReport(filepath.Join(dir, "report.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if s := back.Suites[1]; s.Claimed[0] != "serving" || s.Tests[0].Labels[0] != "routing" {
		t.Errorf("read back: %+v", s)
	}
}
