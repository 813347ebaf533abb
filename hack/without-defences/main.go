// Command without-defences judges a tenancy run made with guard-rail
// defences removed (hack/without-defences.sh): every row it ran must fail
// because the attack succeeded on Lampyr (or its verdict left stock's), not
// because it could not be carried out. It prints one line per row and
// exits 1 when a row passed (its defence is not what it tests) or was
// inconclusive.
//
//	go run ./hack/without-defences JUNIT-REPORT [ROW...]
//
// With ROWs, only those are judged (others ran to set the scene: G2b's
// shared egress Pod is the one G2a's tenant asked for first).
package main

import (
	"encoding/xml"
	"fmt"
	"os"
	"regexp"
	"strings"
)

type junit struct {
	Suites []struct {
		Cases []struct {
			Name    string `xml:"name,attr"`
			Status  string `xml:"status,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// row finds a guard-rail row's id (G1a, G7, ...) in a spec's name.
var row = regexp.MustCompile(`tenant guard rails (G[0-9][a-z]?) `)

// verdict classifies one row run without its defence.
func verdict(status, message string) (string, bool) {
	switch {
	case status == "passed":
		return "PASSED: the row does not notice this defence's absence", false
	case strings.Contains(message, "succeeded on Lampyr"), strings.Contains(message, "parity row"),
		strings.HasPrefix(message, "control ") && strings.Contains(message, " failed on Lampyr"):
		// An attack row's attack succeeded; a parity row left stock's
		// verdict; a control row (what the tenant may do: reach its own
		// db) no longer works.
		return "fails, as it must: " + oneLine(message), true
	default:
		return "inconclusive (failed for another reason): " + oneLine(message), false
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: without-defences JUNIT-REPORT [ROW...]")
		os.Exit(2)
	}
	only := map[string]bool{}
	for _, r := range os.Args[2:] {
		only[r] = true
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "without-defences:", err)
		os.Exit(2)
	}
	var j junit
	if err := xml.Unmarshal(raw, &j); err != nil {
		fmt.Fprintf(os.Stderr, "without-defences: %s is not a JUnit report: %v\n", os.Args[1], err)
		os.Exit(2)
	}
	rows, good := 0, 0
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			m := row.FindStringSubmatch(c.Name)
			if m == nil {
				continue
			}
			if len(only) > 0 && !only[m[1]] {
				continue
			}
			if c.Status == "skipped" || c.Status == "pending" {
				// Not focused in this run.
				continue
			}
			msg := ""
			if c.Failure != nil {
				msg = c.Failure.Message
			}
			v, ok := verdict(c.Status, msg)
			rows++
			if ok {
				good++
			}
			fmt.Printf("%-4s %s\n", m[1], v)
		}
	}
	if rows == 0 {
		fmt.Println("no guard-rail row ran (did the suite's setup fail? see the run's log)")
		os.Exit(1)
	}
	fmt.Printf("%d of %d rows failed without their defence\n", good, rows)
	if rows == 0 || good != rows {
		os.Exit(1)
	}
}
