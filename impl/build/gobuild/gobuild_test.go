package gobuild

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestScratchGoMod(t *testing.T) {
	got, err := ScratchGoMod(Spec{
		Name: "Kubernetes", Module: "k8s.io/kubernetes", Version: "v1.35.4",
		Replace: map[string]string{"k8s.io/api": "v0.35.4", "k8s.io/apimachinery": "v0.35.4"},
		Require: map[string]string{"golang.org/x/net": "v0.50.0"},
	}, "go1.26.8")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"module lampyr.dev/build/kubernetes",
		"go 1.26.8",
		"k8s.io/kubernetes v1.35.4",
		"golang.org/x/net v0.50.0",
		"k8s.io/api => k8s.io/api v0.35.4",
		"k8s.io/apimachinery => k8s.io/apimachinery v0.35.4",
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("go.mod lacks %q:\n%s", want, got)
		}
	}
}

func TestKeyChangesWithEveryInput(t *testing.T) {
	base := Spec{Name: "x", Module: "m", Version: "v1", Packages: []string{"m/cmd/a"}}
	k := base.Key("go1.26.8", "")
	variants := []Spec{base, base, base, base}
	variants[0].Version = "v2"
	variants[1].Packages = []string{"m/cmd/b"}
	variants[2].LDFlags = "-s"
	variants[3].Replace = map[string]string{"a": "v1"}
	for i, v := range variants {
		if v.Key("go1.26.8", "") == k {
			t.Errorf("variant %d has the same key as the base", i)
		}
	}
	if base.Key("go1.27.0", "") == k || base.Key("go1.26.8", "src") == k {
		t.Error("the Go version and the extra key must change the key")
	}
	if base.Key("go1.26.8", "") != k {
		t.Error("the key must be stable")
	}
}

func TestStagingReplaces(t *testing.T) {
	gomod := []byte(`module k8s.io/kubernetes

go 1.25

require k8s.io/api v0.0.0

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go => ./staging/src/k8s.io/client-go
	github.com/x/y => github.com/x/y v1.0.0
)
`)
	got, err := StagingReplaces(gomod, "v0.35.4")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["k8s.io/api"] != "v0.35.4" || got["k8s.io/client-go"] != "v0.35.4" {
		t.Fatalf("got %v", got)
	}
	if _, err := StagingReplaces([]byte("module x\n"), "v0"); err == nil {
		t.Fatal("a go.mod without staging replacements must be an error")
	}
}

// TestBuildLocal builds a tiny main package from a local module: a real go
// build, seconds with a warm cache.
func TestBuildLocal(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/hello\n\ngo 1.22\n")
	write("main.go", "package main\n\nfunc main() { println(\"hi\") }\n")
	b := &Builder{WorkDir: t.TempDir()}
	bins, err := b.Build(context.Background(), Spec{Name: "hello", Dir: dir, Packages: []string{"example.com/hello"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(bins) != 1 || filepath.Base(bins[0].Path) != "hello" {
		t.Fatalf("bins = %v", bins)
	}
	if st, err := os.Stat(bins[0].Path); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("binary missing or not executable: %v", err)
	}
}

func TestBinaryName(t *testing.T) {
	for pkg, want := range map[string]string{
		"go.etcd.io/etcd/server/v3":                 "server",
		"k8s.io/kubernetes/cmd/kubelet":             "kubelet",
		"github.com/traefik/traefik/v3/cmd/traefik": "traefik",
		"example.com/tool/v1":                       "v1",
	} {
		if got := BinaryName(pkg); got != want {
			t.Errorf("BinaryName(%s) = %s, want %s", pkg, got, want)
		}
	}
}

func TestScratchGoModInherits(t *testing.T) {
	pinned := []byte(`module github.com/traefik/traefik/v3

go 1.24

replace (
	github.com/abbot/go-http-auth => github.com/containous/go-http-auth v0.4.1-0.20200324110947-a37a7636d23e
	example.com/local => ./local
)

exclude github.com/tencentcloud/tencentcloud-sdk-go v3.0.83+incompatible
`)
	spec := Spec{Name: "traefik", Module: "github.com/traefik/traefik/v3", Version: "v3.7.9", Inherit: pinned}
	if _, err := ScratchGoMod(spec, "go1.26.8"); err == nil || !strings.Contains(err.Error(), "example.com/local") || !strings.Contains(err.Error(), "Spec.Local") {
		t.Fatalf("a directory replacement nobody supplies must be an error naming it and the fix, got %v", err)
	}
	spec.Local = []LocalModule{{Path: "example.com/local", Files: map[string]string{"a.go": "package local\n"}}}
	got, err := ScratchGoMod(spec, "go1.26.8")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"github.com/abbot/go-http-auth => github.com/containous/go-http-auth v0.4.1-0.20200324110947-a37a7636d23e",
		"exclude github.com/tencentcloud/tencentcloud-sdk-go v3.0.83+incompatible",
		"example.com/local => ./local/example.com-local",
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("go.mod lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(string(got), "=> ./local\n") {
		t.Errorf("the pinned module's own directory replacement must not be inherited:\n%s", got)
	}
}

func TestLocalModuleChangesKey(t *testing.T) {
	base := Spec{Name: "x", Module: "m", Version: "v1", Packages: []string{"m/cmd/a"},
		Local: []LocalModule{{Path: "m/ext", Files: map[string]string{"ext.go": "package ext\n\ntype HTTP struct{}\n"}}}}
	changed := base
	changed.Local = []LocalModule{{Path: "m/ext", Files: map[string]string{"ext.go": "package ext\n\ntype HTTP struct{ X int }\n"}}}
	if base.Key("go1.26.8", "") == changed.Key("go1.26.8", "") {
		t.Error("a local module's source must be part of the cache key")
	}
}

// TestBuildWithLocalModule builds a pinned-module-style scratch build whose
// dependency exists only as supplied source: a program (MainSource) that
// imports a module no proxy serves, replaced by a directory. A real go
// build, offline (nothing to download).
func TestBuildWithLocalModule(t *testing.T) {
	ext := LocalModule{Path: "example.invalid/ext", Origin: "test", Files: map[string]string{
		"ext.go": "package ext\n\n// HTTP is empty.\ntype HTTP struct{}\n",
	}}
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A local module as the "pinned" one too, so no proxy is needed: the
	// same replace mechanics, exercised through writeLocal and go build.
	write("go.mod", "module example.com/uses\n\ngo 1.22\n\nrequire example.invalid/ext v0.0.0\n\nreplace example.invalid/ext => "+filepath.ToSlash(filepath.Join(dir, "local", "example.invalid-ext"))+"\n")
	write("main.go", "package main\n\nimport \"example.invalid/ext\"\n\nvar _ ext.HTTP\n\nfunc main() {}\n")
	if err := writeLocal(dir, []LocalModule{ext}); err != nil {
		t.Fatal(err)
	}
	b := &Builder{WorkDir: t.TempDir()}
	if _, err := b.Build(context.Background(), Spec{Name: "uses", Dir: dir, Packages: []string{"example.com/uses"}}, ""); err != nil {
		t.Fatal(err)
	}
	// A stand-in that no longer matches: the error says which module is
	// supplied from source and where it comes from.
	ext.Files["ext.go"] = "package ext\n\ntype Router struct{}\n"
	if err := writeLocal(dir, []LocalModule{ext}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Build(context.Background(), Spec{Name: "uses", Dir: dir, Packages: []string{"example.com/uses"}, Local: []LocalModule{ext}}, "")
	if err == nil || !strings.Contains(err.Error(), "supplied from source here (test)") {
		t.Fatalf("a mismatching stand-in must fail naming it, got %v", err)
	}
}

// TestConcurrentCallsShareOneBuild: a prebuild and the install that needs
// the same build, called at once, run one go command (the second waits for
// the first) instead of two in one directory.
func TestConcurrentCallsShareOneBuild(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/twice\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &Builder{WorkDir: t.TempDir()}
	before := started.Load()
	spec := Spec{Name: "twice", Dir: dir, Packages: []string{"example.com/twice"}}
	// Hold every slot so both calls are in flight before either builds.
	release := make([]func(), 0, Jobs())
	for range Jobs() {
		r, err := acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		release = append(release, r)
	}
	type result struct {
		bins []Binary
		err  error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			bins, err := b.Build(context.Background(), spec, "")
			results <- result{bins, err}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		inflight.Lock()
		n := len(inflight.m)
		inflight.Unlock()
		if n == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, r := range release {
		r()
	}
	a, c := <-results, <-results
	if a.err != nil || c.err != nil {
		t.Fatalf("errors: %v, %v", a.err, c.err)
	}
	if a.bins[0].Path != c.bins[0].Path {
		t.Errorf("two outputs: %s, %s", a.bins[0].Path, c.bins[0].Path)
	}
	if n := started.Load() - before; n != 1 {
		t.Errorf("%d builds ran, want one", n)
	}
}

// TestSlotsServeNormalBeforeBackground: with every slot taken, a waiting
// build of normal priority gets the next free slot before a background one
// that asked earlier.
func TestSlotsServeNormalBeforeBackground(t *testing.T) {
	var held []func()
	for range Jobs() {
		r, err := acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	order := make(chan string, 2)
	waiting := func() int {
		slots.Lock()
		defer slots.Unlock()
		return len(slots.queue[0]) + len(slots.queue[1])
	}
	go func() {
		r, _ := acquire(Background(context.Background()))
		order <- "background"
		r()
	}()
	for waiting() < 1 {
		time.Sleep(time.Millisecond)
	}
	go func() {
		r, _ := acquire(context.Background())
		order <- "normal"
		r()
	}()
	for waiting() < 2 {
		time.Sleep(time.Millisecond)
	}
	held[0]()
	if first := <-order; first != "normal" {
		t.Errorf("first served: %s, want normal", first)
	}
	<-order
	for _, r := range held[1:] {
		r()
	}
	// A cancelled waiter leaves no slot behind.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := acquire(ctx); err == nil {
		// Free slots are granted even to a done context; give it back.
		releaseSlot()
	}
	slots.Lock()
	free := slots.free
	slots.Unlock()
	if free != Jobs() {
		t.Errorf("free slots %d after everything released, want %d", free, Jobs())
	}
}

// TestBuildWithPatchedModule: a pinned dependency built with one of its
// files replaced (the copy of the module is used, not the module cache),
// and a patch naming a file the module lacks fails instead of adding it.
func TestBuildWithPatchedModule(t *testing.T) {
	const mod, ver = "golang.org/x/sync", "v0.22.0"
	if _, err := Download(context.Background(), mod, ver); err != nil {
		t.Skipf("%s@%s not downloadable here: %v", mod, ver, err)
	}
	main := "package main\n\nimport (\n\t\"fmt\"\n\n\t\"golang.org/x/sync/singleflight\"\n)\n\nfunc main() { fmt.Print(singleflight.Patched()) }\n"
	patch := ModulePatch{Path: mod, Version: ver, Origin: "test",
		Files: map[string]string{"singleflight/singleflight.go": "package singleflight\n\nfunc Patched() string { return \"patched\" }\n"}}
	spec := Spec{Name: "patched", Module: mod, Version: ver, MainSource: main, Patches: []ModulePatch{patch}}
	spec.Packages = []string{spec.ScratchPath()}
	b := &Builder{WorkDir: t.TempDir()}
	bins, err := b.Build(context.Background(), spec, "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bins[0].Path).Output()
	if err != nil || string(out) != "patched" {
		t.Fatalf("patched program printed %q, %v; want patched", out, err)
	}
	patch.Files = map[string]string{"nosuchdir/x.go": "package x\n"}
	spec.Patches = []ModulePatch{patch}
	if _, err := b.Build(context.Background(), spec, ""); err == nil || !strings.Contains(err.Error(), "no longer matches") {
		t.Errorf("a patch of a missing file: %v, want an error saying it no longer matches", err)
	}
}
