// Package runtimecheck finds the packages this project links that depend
// on the Go runtime's internal data layout, and checks them against the Go
// toolchain the project is built with (issue 30).
//
// A linkname to a runtime *function* is safe to leave alone: since Go 1.23
// the linker refuses a pull linkname into the standard library unless the
// standard library marks that symbol as exported to such users (its "hall
// of shame"), and it keeps those stable. What nothing checks is a package
// that reaches into runtime *data*: assembly that adds a fixed offset to a
// runtime variable (gVisor's pkg/sync adds NMSPINNING_OFFSET to
// runtime·sched), or a Go copy of a runtime type whose field offsets must
// match (gVisor's `+checkoffset internal/abi MapType.Hasher`). Such a
// package is written for particular Go versions; built with a newer one it
// compiles and silently reads or writes the wrong field. Go 1.26 moved
// runtime.sched.nmspinning from offset 100 to 116, and the gVisor pinned
// before issue 30 (written up to Go 1.25) kept adding 100.
//
// The checks (runtimecheck_test.go, part of `go test ./...` and so of `just
// test-unit`):
//   - every such package says it knows the running Go release: a file
//     constrained to it (//go:build go1.N with N the running minor), or a
//     module go directive of that release or newer;
//   - every `+checkoffset` annotation into the runtime names a field whose
//     offset in this binary's runtime (its DWARF) equals the offset of the
//     package's own copy;
//   - gVisor's spinning counter address is runtime.sched's nmspinning
//     field, as this toolchain lays it out.
package runtimecheck

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/build/constraint"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Package is what `go list -json` says of one package, as far as the checks
// need it.
type Package struct {
	ImportPath        string
	Dir               string
	Standard          bool
	GoFiles           []string
	CgoFiles          []string
	IgnoredGoFiles    []string
	SFiles            []string
	IgnoredOtherFiles []string
	Module            *struct{ Path, Version, GoVersion string }
}

// ModuleString is module@version, or the import path for packages outside
// a module.
func (p Package) ModuleString() string {
	if p.Module == nil {
		return p.ImportPath
	}
	if p.Module.Version == "" {
		return p.Module.Path
	}
	return p.Module.Path + "@" + p.Module.Version
}

// List runs `go list -deps -json patterns...` in dir and returns the
// packages outside the standard library.
func List(dir string, patterns ...string) ([]Package, error) {
	args := append([]string{"list", "-deps", "-json"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p Package
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		if !p.Standard {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs, nil
}

// Reach is how one package depends on the runtime's data layout.
type Reach struct {
	Package Package
	// DataRefs are assembly lines that use a runtime variable (not a call
	// or jump to a runtime function), as "file:line: text".
	DataRefs []string
	// Offsets are the package's `+checkoffset` annotations into the
	// runtime or the standard library's internal packages.
	Offsets []CheckOffset
	// Versions are the Go minor releases the package's files are written
	// for (//go:build go1.N, not under a negation), whether or not this
	// build selects them.
	Versions []int
	// ModuleGo is the minor release of the module's go directive (0 if
	// none).
	ModuleGo int
}

// Knows is the newest Go minor release the package says it was written
// for: its newest go1.N constraint, or its module's go directive if newer.
func (r Reach) Knows() int {
	n := r.ModuleGo
	for _, v := range r.Versions {
		n = max(n, v)
	}
	return n
}

// CheckOffset is one `+checkoffset` annotation on a selected file: the
// constant Const, its value written as Expr, asserted equal to the offset
// of Field in Pkg's type Type.
type CheckOffset struct {
	File, Const, Expr string
	Pkg, Type, Field  string
}

// MirrorField parses Expr when it is unsafe.Offsetof(T{}.F): the package's
// own copy T and field F whose offset the annotation compares.
func (c CheckOffset) MirrorField() (typ, field string, ok bool) {
	m := offsetofRE.FindStringSubmatch(c.Expr)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

var (
	// A use of a runtime symbol in Go assembly: runtime·name(SB).
	asmRuntimeRE = regexp.MustCompile(`runtime·[A-Za-z0-9_]+(\+[0-9]+)?\(SB\)`)
	// Instructions that only transfer control to a function.
	asmBranchRE   = regexp.MustCompile(`^\s*(CALL|JMP|BL|B|BR|JAL|TAIL)\b`)
	checkOffsetRE = regexp.MustCompile(`^\s*(?:const\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+?)\s*//\s*\+checkoffset\s+(\S+)\s+([A-Za-z0-9_]+)\.([A-Za-z0-9_]+)\s*$`)
	offsetofRE    = regexp.MustCompile(`^unsafe\.Offsetof\(\s*([A-Za-z_][A-Za-z0-9_]*)\{\}\.([A-Za-z_][A-Za-z0-9_]*)\s*\)$`)
	goMinorRE     = regexp.MustCompile(`^go1\.([0-9]+)$`)
)

// intoRuntime says whether an import path is the runtime or one of the
// standard library's internal packages.
func intoRuntime(pkg string) bool {
	return pkg == "runtime" || strings.HasPrefix(pkg, "runtime/") || pkg == "internal" || strings.HasPrefix(pkg, "internal/")
}

// Inspect reads p's files and returns how it depends on the runtime's data
// layout; ok is false when it does not.
func Inspect(p Package) (Reach, bool, error) {
	r := Reach{Package: p}
	if p.Module != nil && p.Module.GoVersion != "" {
		r.ModuleGo = minorOf(p.Module.GoVersion)
	}
	for _, f := range p.SFiles {
		lines, err := readLines(filepath.Join(p.Dir, f))
		if err != nil {
			return r, false, err
		}
		for i, l := range lines {
			code, _, _ := strings.Cut(l, "//")
			if asmRuntimeRE.MatchString(code) && !asmBranchRE.MatchString(code) {
				r.DataRefs = append(r.DataRefs, fmt.Sprintf("%s:%d: %s", f, i+1, strings.TrimSpace(code)))
			}
		}
	}
	for _, f := range append(append([]string{}, p.GoFiles...), p.CgoFiles...) {
		lines, err := readLines(filepath.Join(p.Dir, f))
		if err != nil {
			return r, false, err
		}
		for _, l := range lines {
			m := checkOffsetRE.FindStringSubmatch(l)
			if m == nil || !intoRuntime(m[3]) {
				continue
			}
			r.Offsets = append(r.Offsets, CheckOffset{File: f, Const: m[1], Expr: strings.TrimSpace(m[2]), Pkg: m[3], Type: m[4], Field: m[5]})
		}
	}
	if len(r.DataRefs) == 0 && len(r.Offsets) == 0 {
		return r, false, nil
	}
	seen := map[int]bool{}
	var all []string
	all = append(all, p.GoFiles...)
	all = append(all, p.CgoFiles...)
	all = append(all, p.IgnoredGoFiles...)
	all = append(all, p.SFiles...)
	all = append(all, p.IgnoredOtherFiles...)
	for _, f := range all {
		vs, err := goVersionsOf(filepath.Join(p.Dir, f))
		if err != nil {
			return r, false, err
		}
		for _, v := range vs {
			if !seen[v] {
				seen[v] = true
				r.Versions = append(r.Versions, v)
			}
		}
	}
	sort.Ints(r.Versions)
	return r, true, nil
}

// goVersionsOf returns the minor releases a file's //go:build line
// requires (25 for "amd64 && go1.25"; nothing for "!go1.26").
func goVersionsOf(path string) ([]int, error) {
	lines, err := readLines(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t != "" && !strings.HasPrefix(t, "//") && !strings.HasPrefix(t, "#") && !strings.HasPrefix(t, "/*") && !strings.HasPrefix(t, "*") {
			break // build constraints come before any code
		}
		if !constraint.IsGoBuild(t) {
			continue
		}
		expr, err := constraint.Parse(t)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, tag := range positiveTags(expr, false) {
			if m := goMinorRE.FindStringSubmatch(tag); m != nil {
				n, _ := strconv.Atoi(m[1])
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// positiveTags lists the tags an expression requires rather than excludes:
// "go1.24 && !go1.26" is a file for 1.24 and 1.25, written knowing that
// 1.26 differs, not a file for 1.26.
func positiveTags(e constraint.Expr, negated bool) []string {
	switch x := e.(type) {
	case *constraint.TagExpr:
		if negated {
			return nil
		}
		return []string{x.Tag}
	case *constraint.NotExpr:
		return positiveTags(x.X, !negated)
	case *constraint.AndExpr:
		return append(positiveTags(x.X, negated), positiveTags(x.Y, negated)...)
	case *constraint.OrExpr:
		return append(positiveTags(x.X, negated), positiveTags(x.Y, negated)...)
	}
	return nil
}

// minorOf is 26 for "1.26", "1.26.3" or "go1.26".
func minorOf(v string) int {
	v = strings.TrimPrefix(v, "go")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 || parts[0] != "1" {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return n
}

// RunningMinor is the minor release of a runtime.Version() string
// ("go1.26.8" -> 26).
func RunningMinor(version string) int { return minorOf(version) }

func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	return lines, s.Err()
}
