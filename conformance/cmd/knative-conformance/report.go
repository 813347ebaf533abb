package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/conformance/upstream"
)

// writeReport writes report.yaml, JUnit and Markdown, prints each suite's
// result with what the declarations did not expect, and writes the
// side-by-side comparison with --reference. A failed conformance result is
// run's to return, after this.
func (r *runner) writeReport(context.Context) error {
	o, rep := r.o, r.rep
	rep.Finish()
	if err := rep.Write(o.out); err != nil {
		return err
	}
	for _, s := range rep.Suites {
		st := s.Statistics
		fmt.Printf("%s %s: %s: %d passed, %d failed, %d expected failures, %d skipped (%.0fs)\n", o.implementation, s.Suite.Name, s.Result, st.Passed, st.Failed, st.ExpectedFailures, st.Skipped, s.Seconds)
		for _, u := range s.Undeclared {
			fmt.Printf("  undeclared failure: %s\n", u)
		}
		for _, u := range s.UnexpectedPasses {
			fmt.Printf("  declared to fail, passed (remove the declaration): %s\n", u)
		}
		for _, u := range s.MissingDeclared {
			fmt.Printf("  declared, but the suite has no such test: %s\n", u)
		}
	}
	for _, c := range rep.Claims {
		switch c.Verdict {
		case upstream.ClaimStale:
			fmt.Printf("  stale claim (every test it names passed; remove it from %s): %s\n", o.expectations, c)
		case upstream.ClaimUnconfirmed:
			fmt.Printf("  intermittent claim not seen this run: %s\n", c)
		}
	}
	fmt.Printf("report: %s (%s)\n", filepath.Join(o.out, "report.yaml"), rep.Result)
	if o.reference != "" {
		ref, err := readReport(o.reference)
		if err != nil {
			return err
		}
		side := upstream.SideBySide(ref, rep)
		if err := os.WriteFile(filepath.Join(o.out, "side-by-side.md"), []byte(side), 0o644); err != nil {
			return err
		}
		fmt.Printf("side by side with %s: %s\n", o.reference, filepath.Join(o.out, "side-by-side.md"))
	}
	return nil
}

func readReport(path string) (*upstream.Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r upstream.Report
	if err := yaml.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}
