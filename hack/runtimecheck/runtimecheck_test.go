package runtimecheck

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// root is the repository root (this file is hack/runtimecheck/...).
func root(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func reaches(t *testing.T) []Reach {
	t.Helper()
	pkgs, err := List(root(t), "./...")
	if err != nil {
		t.Fatal(err)
	}
	var out []Reach
	for _, p := range pkgs {
		r, ok, err := Inspect(p)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			out = append(out, r)
		}
	}
	return out
}

// TestRuntimeDataUsersKnowThisGo: every linked package that reaches into
// the runtime's data says it was written for the running Go release.
func TestRuntimeDataUsersKnowThisGo(t *testing.T) {
	running := RunningMinor(runtime.Version())
	found := reaches(t)
	if len(found) == 0 {
		t.Fatal("no linked package reaches into runtime data; gVisor's pkg/sync (linked by fiberd and by this test) always does: the scan is broken")
	}
	for _, r := range found {
		t.Logf("%s (%s): knows go1.%d; asm data refs %d, +checkoffset %d, go1.N constraints %v, module go 1.%d",
			r.Package.ImportPath, r.Package.ModuleString(), r.Knows(), len(r.DataRefs), len(r.Offsets), r.Versions, r.ModuleGo)
		if r.Knows() < running {
			var why []string
			why = append(why, r.DataRefs...)
			for _, o := range r.Offsets {
				why = append(why, o.File+": "+o.Const+" // +checkoffset "+o.Pkg+" "+o.Type+"."+o.Field)
			}
			t.Errorf("%s (%s) reaches into the Go runtime's data but was written for Go 1.%d at the newest (go1.N build constraints %v, module go directive 1.%d), and this is %s: its offsets may point at other fields. Move %s to a version written for %s or newer, or build with Go 1.%d. Its runtime uses:\n\t%s",
				r.Package.ImportPath, r.Package.ModuleString(), r.Knows(), r.Versions, r.ModuleGo, runtime.Version(),
				modulePath(r.Package), strings.Join(strings.SplitN(runtime.Version(), ".", 3)[:2], "."), r.Knows(), strings.Join(why, "\n\t"))
		}
	}
}

func modulePath(p Package) string {
	if p.Module == nil {
		return p.ImportPath
	}
	return p.Module.Path
}

// The probe (layoutprobe) built once per test binary, with DWARF, and
// what it printed.
var probe struct {
	once   sync.Once
	layout *Layout
	addrs  map[string]uint64
	err    error
}

func layout(t *testing.T) (*Layout, map[string]uint64) {
	t.Helper()
	probe.once.Do(func() {
		dir, err := exec.Command("mktemp", "-d").Output()
		if err != nil {
			probe.err = err
			return
		}
		bin := filepath.Join(strings.TrimSpace(string(dir)), "layoutprobe")
		build := exec.Command("go", "build", "-o", bin, "./hack/runtimecheck/layoutprobe")
		build.Dir = root(t)
		if out, err := build.CombinedOutput(); err != nil {
			probe.err = err
			probe.err = &probeError{"go build ./hack/runtimecheck/layoutprobe", err, out}
			return
		}
		if probe.layout, probe.err = ReadLayout(bin); probe.err != nil {
			return
		}
		out, err := exec.Command(bin).Output()
		if err != nil {
			probe.err = &probeError{bin, err, out}
			return
		}
		probe.addrs = map[string]uint64{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			name, v, _ := strings.Cut(line, " ")
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				probe.err = &probeError{bin, err, out}
				return
			}
			probe.addrs[name] = n
		}
	})
	if probe.err != nil {
		t.Fatal(probe.err)
	}
	return probe.layout, probe.addrs
}

type probeError struct {
	what string
	err  error
	out  []byte
}

func (e *probeError) Error() string { return e.what + ": " + e.err.Error() + "\n" + string(e.out) }

// TestCheckOffsetsMatchThisRuntime: every `+checkoffset` annotation into
// the runtime, in a package this project links, holds for the runtime this
// binary was built with: the package's own copy of the type has the field
// at the runtime's offset. (gVisor checks these with its own tooling under
// Bazel; nothing checked them for a plain `go build`.)
func TestCheckOffsetsMatchThisRuntime(t *testing.T) {
	l, _ := layout(t)
	found, checked := 0, 0
	for _, r := range reaches(t) {
		for _, o := range r.Offsets {
			found++
			want, err := l.Offset(o.Pkg+"."+o.Type, o.Field)
			if err != nil {
				t.Errorf("%s: %s is annotated +checkoffset %s %s.%s, but %v: the runtime it was written for is not this one (%s)", r.Package.ImportPath+"/"+o.File, o.Const, o.Pkg, o.Type, o.Field, err, runtime.Version())
				continue
			}
			typ, field, ok := o.MirrorField()
			if !ok {
				t.Logf("%s: %s = %s: not an unsafe.Offsetof of a local copy; skipped", r.Package.ImportPath, o.Const, o.Expr)
				continue
			}
			got, err := l.Offset(r.Package.ImportPath+"."+typ, field)
			if err != nil {
				t.Errorf("%s: %v; link the package into hack/runtimecheck/layoutprobe (a blank import) so its layout can be checked", r.Package.ImportPath, err)
				continue
			}
			if got != want {
				t.Errorf("%s: %s.%s is at offset %d, the runtime's %s.%s at %d under %s", r.Package.ImportPath, typ, field, got, o.Pkg+"."+o.Type, o.Field, want, runtime.Version())
				continue
			}
			checked++
			t.Logf("%s: %s.%s at %d = %s.%s (%s)", r.Package.ImportPath, typ, field, got, o.Pkg, o.Type+"."+o.Field, runtime.Version())
		}
	}
	if found == 0 {
		t.Error("no +checkoffset annotation into the runtime was found; gVisor's pkg/sync carries one (maptype.Hasher): the scan is broken")
	}
	t.Logf("%d of %d +checkoffset annotations hold", checked, found)
}

// TestGVisorSpinningOffset: the counter gVisor's pkg/sleep and pkg/sync
// raise around every wake-up (sync.Goready's wake-up suppression) is
// runtime.sched.nmspinning of this toolchain, not a neighbouring field.
func TestGVisorSpinningOffset(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("gVisor's pkg/sync reaches runtime.sched only on amd64 (this is %s)", runtime.GOARCH)
	}
	l, addrs := layout(t)
	want, err := l.Offset("runtime.schedt", "nmspinning")
	if err != nil {
		t.Fatal(err)
	}
	sched, ok := l.Symbol("runtime.sched")
	if !ok {
		t.Fatal("no runtime.sched in the symbol table")
	}
	// Link-time addresses to run-time ones (a PIE binary is loaded at an
	// offset): the same shift as a function of this package.
	at, ok := l.Symbol("main.anchor")
	if !ok {
		t.Fatal("no symbol main.anchor in the probe")
	}
	shift := addrs["anchor"] - at
	got := int64(addrs["gvisor-nmspinning"] - (sched + shift))
	if got != want {
		t.Fatalf("gvisor.dev/gvisor/pkg/sync adds %d to runtime.sched for nmspinning; under %s nmspinning is at %d and %d is %q: every wake-up suppression changes the wrong scheduler counter. Move gvisor.dev/gvisor to a go-branch version generated for this Go release",
			got, runtime.Version(), want, got, l.FieldAt("runtime.schedt", got))
	}
	t.Logf("gVisor's nmspinning = runtime.sched + %d = runtime.schedt.nmspinning under %s", got, runtime.Version())
}

// TestInspectFindsAStaleCopy: the rule on a package laid out as the gVisor
// pinned before issue 30 (assembly for go1.25, used under any later Go).
func TestInspectFindsAStaleCopy(t *testing.T) {
	dir := filepath.Join("testdata", "stale")
	p := Package{ImportPath: "example.com/stale/sync", Dir: dir,
		GoFiles:        []string{"runtime_go124_unsafe.go"},
		IgnoredGoFiles: []string{"runtime_go121_unsafe.go"},
		SFiles:         []string{"runtime_spinning_go125_amd64.s", "calls_amd64.s"},
		Module:         &struct{ Path, Version, GoVersion string }{"example.com/stale", "v0.0.0", "1.23.1"}}
	r, ok, err := Inspect(p)
	if err != nil || !ok {
		t.Fatalf("Inspect = %v, %v; want a reach", ok, err)
	}
	if got := r.Knows(); got != 25 {
		t.Errorf("Knows() = %d, want 25 (go1.25 constraint beats module go 1.23)", got)
	}
	if len(r.DataRefs) != 1 || !strings.Contains(r.DataRefs[0], "runtime·sched(SB)") {
		t.Errorf("DataRefs = %q, want the LEAQ of runtime·sched only (calls are not data)", r.DataRefs)
	}
	if len(r.Offsets) != 1 || r.Offsets[0].Pkg != "internal/abi" || r.Offsets[0].Type != "SwissMapType" || r.Offsets[0].Field != "Hasher" {
		t.Errorf("Offsets = %+v, want the selected file's internal/abi SwissMapType.Hasher only", r.Offsets)
	}
	if typ, field, ok := r.Offsets[0].MirrorField(); !ok || typ != "maptype" || field != "Hasher" {
		t.Errorf("MirrorField = %q %q %v", typ, field, ok)
	}
	if RunningMinor("go1.26.8") <= r.Knows() {
		t.Error("go1.26.8 must count as newer than a package written for go1.25")
	}
	// A package that only calls into the runtime is not a reach.
	if _, ok, _ := Inspect(Package{ImportPath: "example.com/calls", Dir: dir, SFiles: []string{"calls_amd64.s"}}); ok {
		t.Error("a package whose assembly only calls runtime functions was reported")
	}
}
