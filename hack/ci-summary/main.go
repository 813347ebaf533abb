// Command ci-summary prints, after a failed CI run, every failed spec of the
// Ginkgo JUnit reports under a directory (default _artifacts): its name,
// its failure message and the end of what it wrote (GinkgoWriter); and
// every failed go test of the unit run's report (gotestsum's unit-junit.xml)
// with the lines the test wrote itself. CI
// shows the last lines of a run; without this they name the failed spec
// but not why it failed (the reason sits hundreds of lines above).
//
//	go run ./hack/ci-summary [-since UNIX-SECONDS] [dir]
//
// -since skips reports older than the run (a reused _artifacts holds the
// reports of earlier runs).
package main

import (
	"encoding/xml"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

type junit struct {
	Suites []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Name    string `xml:"name,attr"`
			Status  string `xml:"status,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"error"`
			SystemErr string `xml:"system-err"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// tailLines is how much of a failed spec's own output is printed.
const tailLines = 25

// goTestLines bounds what testLines keeps of a failed go test.
const goTestLines = 60

// testFileLine is how go test starts a line a test wrote (t.Log, t.Error,
// t.Fatal): "    name_test.go:123: ".
var testFileLine = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: `)

func main() {
	since := flag.Int64("since", 0, "skip reports last written before this Unix time")
	flag.Parse()
	dir := "_artifacts"
	if flag.NArg() > 0 {
		dir = flag.Arg(0)
	}
	var files []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "-junit.xml") {
			return nil
		}
		if info, err := d.Info(); err == nil && info.ModTime().Before(time.Unix(*since, 0)) {
			return nil
		}
		files = append(files, p)
		return nil
	})
	sort.Strings(files)
	failed := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			fmt.Printf("ci-summary: %s: %v\n", f, err)
			continue
		}
		var j junit
		if err := xml.Unmarshal(raw, &j); err != nil {
			fmt.Printf("ci-summary: %s: not a JUnit report: %v\n", f, err)
			continue
		}
		for _, s := range j.Suites {
			for _, c := range s.Cases {
				msg, text := "", ""
				switch {
				case c.Failure != nil:
					msg, text = c.Failure.Message, c.Failure.Text
				case c.Error != nil:
					msg, text = c.Error.Message, c.Error.Text
				default:
					continue
				}
				failed++
				fmt.Printf("\n=== FAILED (%s, %s): %s\n", s.Name, f, c.Name)
				fmt.Println(indent(strings.TrimSpace(msg)))
				if loc := where(c.SystemErr + "\n" + text); loc != "" {
					fmt.Println(indent(loc))
				}
				if c.SystemErr == "" && text != "" {
					// A go test case (gotestsum's report of `just test-unit`):
					// the failure is in the test's own t.Log/t.Error lines,
					// among the logs of the processes it ran.
					fmt.Printf("  --- what the test said (its *_test.go lines):\n%s\n", indent(testLines(text, goTestLines)))
					continue
				}
				// What the spec wrote before it failed (the failure itself,
				// repeated after it, is printed above).
				before := c.SystemErr
				if i := strings.LastIndex(before, "[FAILED]"); i >= 0 {
					before = before[:i]
				}
				if out := tail(before, tailLines); out != "" {
					fmt.Printf("  --- the last %d lines it wrote before it failed:\n%s\n", tailLines, indent(out))
				}
			}
		}
	}
	if failed == 0 {
		fmt.Printf("ci-summary: no failed spec in the %d JUnit report(s) under %s (a unit test or a recipe failed: see above)\n", len(files), dir)
	}
}

// where is the line Ginkgo writes to say where a spec failed.
func where(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "In [") && strings.Contains(l, " at: ") {
			return l
		}
	}
	return ""
}

// testLines keeps the lines a go test wrote itself (those that start with
// its file and line, and the indented lines that continue them) and the
// "--- FAIL" lines, at most n of them; the end of the output when there are
// none.
func testLines(s string, n int) string {
	var out []string
	cont := false
	for _, l := range strings.Split(s, "\n") {
		switch {
		case testFileLine.MatchString(l), strings.Contains(l, "--- FAIL: "):
			cont = true
		case cont && strings.HasPrefix(l, "        "):
		default:
			cont = false
			continue
		}
		out = append(out, strings.TrimRight(l, " "))
	}
	if len(out) == 0 {
		return tail(s, tailLines)
	}
	if len(out) > n {
		out = append(out[:n], fmt.Sprintf("(%d more lines)", len(out)-n))
	}
	return strings.Join(out, "\n")
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}
