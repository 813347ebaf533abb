// Package gobuild builds Go main packages of a pinned module version into
// static binaries, the way ko and Knative's release tooling do, without a
// checkout: each build gets a scratch module that requires the pinned module
// and is compiled through the Go module proxy. Results are cached by a key
// over everything that changes the output.
package gobuild

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/mod/modfile"

	"lampyr.dev/serving/impl/build/filelock"
)

// Spec says what to build.
type Spec struct {
	// Name is a short human name used in directory names and progress lines.
	Name string
	// Module and Version pin the module that holds the packages. An empty
	// Module builds from Dir (the caller's own module) instead.
	Module, Version string
	// Dir is a local module root, used when Module is empty; such builds
	// are never served from the done-marker cache.
	Dir string
	// Packages are import paths of main packages.
	Packages []string
	// Replace maps module paths to published versions (module@version
	// replacements, e.g. Kubernetes' staging modules).
	Replace map[string]string
	// Require adds requirements (module path -> version) to the scratch
	// module, for builds whose dependencies must be raised or lowered.
	Require map[string]string
	// Inherit copies the pinned module's own replace (to published
	// versions) and exclude directives, which Go ignores in dependencies;
	// modules such as Traefik only build with them.
	Inherit []byte `json:",omitempty"`
	// LDFlags and Tags are passed to go build.
	LDFlags string
	Tags    []string
	// CGO enables cgo; the default is a static CGO_ENABLED=0 build.
	CGO bool
	// GOOS/GOARCH default to linux/amd64... of the host.
	GOARCH string
	// MainSource, with a pinned Module, is the scratch module's own main
	// package (main.go at its root, import path lampyr.dev/build/<Name>):
	// for programs assembled from the module's packages, such as a CoreDNS
	// with only the plugins a cluster uses. List that import path in
	// Packages to build it.
	MainSource string `json:",omitempty"`
	// Local supplies modules the module proxy cannot serve, from source:
	// each is written into the scratch module's directory and used through
	// a directory replace. It is how a pinned module whose go.mod replaces
	// a dependency with a directory outside its module zip (Traefik v3.7's
	// nested github.com/traefik/traefik/dynamic/ext) still builds. The
	// sources are part of the cache key.
	Local []LocalModule `json:",omitempty"`
	// Patches build pinned modules with some of their files replaced:
	// each is copied from the module cache into the scratch module at the
	// version given (which must be the one the build resolves), the files
	// overwritten, and used through a directory replace. For a file that
	// only wires in what an offline test build has no use for (Traefik's
	// registry of ACME DNS providers, each with its cloud SDK). The
	// contents are part of the cache key.
	Patches []ModulePatch `json:",omitempty"`
}

// ModulePatch is a pinned module built with files replaced.
type ModulePatch struct {
	Path, Version string
	// Files maps slash paths relative to the module root to their new
	// content; each must exist in the module (a patch that no longer
	// matches its module fails instead of adding a file).
	Files map[string]string
	// Origin says where the replacement lives in this repository and why.
	Origin string
}

func (m ModulePatch) localDir() string { return "./patched/" + sanitize(m.Path) }

// LocalModule is a module supplied from source instead of the proxy.
type LocalModule struct {
	// Path is the module path the pinned module requires.
	Path string
	// GoVersion is the go directive of its generated go.mod (default 1.22).
	GoVersion string `json:",omitempty"`
	// Files are its source files (name -> content), without go.mod, which
	// is generated.
	Files map[string]string
	// Origin says where the source lives in this repository and why it is
	// supplied; build errors that mention Path repeat it.
	Origin string
}

// localDir is where a LocalModule goes, relative to the scratch module.
func (l LocalModule) localDir() string { return "./local/" + sanitize(l.Path) }

// ScratchPath is the import path of s's scratch module (and of its
// MainSource program).
func (s Spec) ScratchPath() string { return "lampyr.dev/build/" + sanitize(s.Name) }

// Binary is one built executable.
type Binary struct {
	Package string
	Path    string
}

// Key identifies the build output. It covers the Go toolchain too, so a new
// Go version rebuilds. For local builds (Dir) the caller must add a source
// hash through Extra.
func (s Spec) Key(goVersion, extra string) string {
	h := sha256.New()
	enc := json.NewEncoder(h)
	_ = enc.Encode(struct {
		S     Spec
		Go    string
		Extra string
	}{s, goVersion, extra})
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// BinaryName is the file name go build gives a package's binary: its last
// path element, or the one before a major-version suffix (go.etcd.io/etcd/server/v3
// builds "server").
func BinaryName(pkg string) string {
	base := path.Base(pkg)
	if len(base) > 1 && base[0] == 'v' && strings.Trim(base[1:], "0123456789") == "" && base != "v0" && base != "v1" {
		return path.Base(path.Dir(pkg))
	}
	return base
}

// ScratchGoMod renders the go.mod of the scratch module for s.
func ScratchGoMod(s Spec, goVersion string) ([]byte, error) {
	f := &modfile.File{}
	if err := f.AddModuleStmt(s.ScratchPath()); err != nil {
		return nil, err
	}
	if err := f.AddGoStmt(strings.TrimPrefix(goVersion, "go")); err != nil {
		return nil, err
	}
	if err := f.AddRequire(s.Module, s.Version); err != nil {
		return nil, err
	}
	for _, m := range sortedKeys(s.Require) {
		if err := f.AddRequire(m, s.Require[m]); err != nil {
			return nil, err
		}
	}
	for _, m := range sortedKeys(s.Replace) {
		if err := f.AddReplace(m, "", m, s.Replace[m]); err != nil {
			return nil, err
		}
	}
	local := map[string]bool{}
	for _, l := range s.Local {
		if l.Path == "" || len(l.Files) == 0 {
			return nil, fmt.Errorf("local module %q: a path and its source files are required", l.Path)
		}
		if local[l.Path] {
			return nil, fmt.Errorf("local module %s is given twice", l.Path)
		}
		local[l.Path] = true
		if err := f.AddReplace(l.Path, "", l.localDir(), ""); err != nil {
			return nil, err
		}
	}
	for _, m := range s.Patches {
		if local[m.Path] {
			return nil, fmt.Errorf("module %s is both local and patched", m.Path)
		}
		local[m.Path] = true
		if err := f.AddReplace(m.Path, "", m.localDir(), ""); err != nil {
			return nil, err
		}
	}
	if len(s.Inherit) > 0 {
		pinned, err := modfile.Parse("go.mod", s.Inherit, nil)
		if err != nil {
			return nil, fmt.Errorf("parse %s's go.mod: %w", s.Module, err)
		}
		for _, r := range pinned.Replace {
			if r.New.Version == "" {
				// A directory replacement points into the module's own
				// tree, which its module zip may lack (a nested module
				// never is in it): the build needs the module from Local.
				if !local[r.Old.Path] {
					return nil, fmt.Errorf("%s@%s's go.mod replaces %s with the directory %s, which the module proxy does not serve: supply that module's source as Spec.Local", s.Module, s.Version, r.Old.Path, r.New.Path)
				}
				continue
			}
			if err := f.AddReplace(r.Old.Path, r.Old.Version, r.New.Path, r.New.Version); err != nil {
				return nil, err
			}
		}
		for _, x := range pinned.Exclude {
			if err := f.AddExclude(x.Mod.Path, x.Mod.Version); err != nil {
				return nil, err
			}
		}
	}
	f.Cleanup()
	return f.Format()
}

// Builder runs builds.
type Builder struct {
	// WorkDir holds scratch modules and outputs; one subdirectory per key.
	WorkDir string
	// Log receives progress lines.
	Log io.Writer
}

// GoVersion returns `go env GOVERSION`.
func GoVersion(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOVERSION: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Jobs is how many go commands the builders of this process run at once
// (LAMPYR_BUILD_JOBS, default 2 on up to 4 cores, else half the cores). A
// go build keeps about one core busy on average on these machines (a
// link is mostly one thread, and module resolution waits on the network:
// Traefik measured 6 min 55 s of CPU in 6 min 44 s), so two at a time fill
// two cores where one after another left one idle.
func Jobs() int {
	if v, err := strconv.Atoi(os.Getenv("LAMPYR_BUILD_JOBS")); err == nil && v > 0 {
		return v
	}
	return max(2, runtime.NumCPU()/2)
}

// slots bounds the go commands running at once. Waiting builds are served
// by priority, then in the order they asked: what a run needs first (the
// cluster inputs) before what it prebuilds in the background (Background).
var slots = struct {
	sync.Mutex
	init  bool
	free  int
	queue [2][]chan struct{}
}{}

type priorityKey struct{}

// Background marks ctx's builds as prebuilds: they take a build slot only
// when no build of normal priority waits for one.
func Background(ctx context.Context) context.Context {
	return context.WithValue(ctx, priorityKey{}, 1)
}

func priorityOf(ctx context.Context) int {
	if p, ok := ctx.Value(priorityKey{}).(int); ok {
		return p
	}
	return 0
}

func acquire(ctx context.Context) (release func(), err error) {
	pr := priorityOf(ctx)
	slots.Lock()
	if !slots.init {
		slots.init, slots.free = true, Jobs()
	}
	if slots.free > 0 && len(slots.queue[0]) == 0 && (pr == 0 || len(slots.queue[1]) == 0) {
		slots.free--
		slots.Unlock()
		return releaseSlot, nil
	}
	ch := make(chan struct{})
	slots.queue[pr] = append(slots.queue[pr], ch)
	slots.Unlock()
	select {
	case <-ch:
		return releaseSlot, nil
	case <-ctx.Done():
		slots.Lock()
		for i, w := range slots.queue[pr] {
			if w == ch {
				slots.queue[pr] = append(slots.queue[pr][:i:i], slots.queue[pr][i+1:]...)
				slots.Unlock()
				return nil, ctx.Err()
			}
		}
		slots.Unlock()
		// Granted as we gave up: hand the slot on.
		releaseSlot()
		return nil, ctx.Err()
	}
}

func releaseSlot() {
	slots.Lock()
	defer slots.Unlock()
	for pr := range slots.queue {
		if len(slots.queue[pr]) > 0 {
			ch := slots.queue[pr][0]
			slots.queue[pr] = slots.queue[pr][1:]
			close(ch)
			return
		}
	}
	slots.free++
}

// inflight holds the builds under way in this process, by output directory,
// so that two callers of the same build (a prebuild and the install that
// needs it) wait for one go command instead of racing in one directory.
var inflight = struct {
	sync.Mutex
	m map[string]*call
}{m: map[string]*call{}}

type call struct {
	done chan struct{}
	bins []Binary
	err  error
}

// Build builds s (or returns the cached result) and returns one Binary per
// package, in s.Packages order. Concurrent calls for the same build share
// one go command; at most Jobs() go commands run at once.
func (b *Builder) Build(ctx context.Context, s Spec, extraKey string) ([]Binary, error) {
	goVersion, err := GoVersion(ctx)
	if err != nil {
		return nil, err
	}
	key := s.Key(goVersion, extraKey)
	dir := filepath.Join(b.WorkDir, sanitize(s.Name)+"-"+key)
	outDir := filepath.Join(dir, "bin")
	bins := make([]Binary, len(s.Packages))
	for i, p := range s.Packages {
		bins[i] = Binary{Package: p, Path: filepath.Join(outDir, BinaryName(p))}
	}
	// Local sources change without a version: only pinned modules are
	// cached here (go's own build cache still makes local rebuilds quick).
	if _, err := os.Stat(filepath.Join(dir, "done")); err == nil && s.Module != "" {
		return bins, nil
	}
	inflight.Lock()
	if c, ok := inflight.m[dir]; ok {
		inflight.Unlock()
		select {
		case <-c.done:
			return c.bins, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c := &call{done: make(chan struct{})}
	inflight.m[dir] = c
	inflight.Unlock()
	defer func() {
		inflight.Lock()
		delete(inflight.m, dir)
		inflight.Unlock()
		close(c.done)
	}()
	// Another process (a background build of the inputs, another
	// terminal) may be building the same thing: wait for it, then use
	// what it made.
	if err := os.MkdirAll(b.WorkDir, 0o755); err != nil {
		c.err = err
		return nil, err
	}
	lock, err := filelock.Acquire(ctx, dir+".lock", func(holder string) {
		if b.Log != nil {
			fmt.Fprintf(b.Log, "   %s: waiting for process %s, which is building it\n", s.Name, holder)
		}
	})
	if err != nil {
		c.err = err
		return nil, err
	}
	defer lock.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "done")); err == nil && s.Module != "" {
		c.bins = bins
		return bins, nil
	}
	t0 := time.Now()
	release, err := acquire(ctx)
	if err != nil {
		c.err = err
		return nil, err
	}
	defer release()
	if waited := time.Since(t0); waited > time.Second && b.Log != nil {
		fmt.Fprintf(b.Log, "   %s: waited %s for one of %d build slots\n", s.Name, waited.Round(time.Second), Jobs())
	}
	c.bins, c.err = b.build(ctx, s, goVersion, dir, outDir, bins)
	return c.bins, c.err
}

// started counts builds run (not served from the cache or a shared call).
var started atomic.Int64

func (b *Builder) build(ctx context.Context, s Spec, goVersion, dir, outDir string, bins []Binary) ([]Binary, error) {
	started.Add(1)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	buildDir := s.Dir
	if s.Module != "" {
		buildDir = filepath.Join(dir, "mod")
		if err := os.MkdirAll(buildDir, 0o755); err != nil {
			return nil, err
		}
		gomod, err := ScratchGoMod(s, goVersion)
		if err != nil {
			return nil, fmt.Errorf("%s: render scratch go.mod: %w", s.Name, err)
		}
		if err := os.WriteFile(filepath.Join(buildDir, "go.mod"), gomod, 0o644); err != nil {
			return nil, err
		}
		// A scratch module has no packages of its own; a blank-import file
		// lets `go mod tidy` record every dependency of the packages with
		// the versions the pinned module itself requires.
		var imports bytes.Buffer
		imports.WriteString("//go:build tools\n\npackage scratch\n\nimport (\n")
		for _, p := range s.Packages {
			if p == s.ScratchPath() {
				continue // a program, not importable; main.go's imports count instead
			}
			fmt.Fprintf(&imports, "\t_ %q\n", p)
		}
		imports.WriteString(")\n")
		if err := os.WriteFile(filepath.Join(buildDir, "tools.go"), imports.Bytes(), 0o644); err != nil {
			return nil, err
		}
		if s.MainSource != "" {
			if err := os.WriteFile(filepath.Join(buildDir, "main.go"), []byte(s.MainSource), 0o644); err != nil {
				return nil, err
			}
		}
		if err := writeLocal(buildDir, s.Local); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		if err := writePatched(ctx, buildDir, s.Patches); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		if err := b.run(ctx, buildDir, s, "go", "mod", "tidy", "-e"); err != nil {
			return nil, fmt.Errorf("%s: resolve %s@%s: %w", s.Name, s.Module, s.Version, localHint(s, err))
		}
	}
	args := []string{"build", "-o", outDir + "/"}
	if s.Module != "" {
		// Pinned modules' binaries carry no path of this machine. Local
		// builds (this checkout) do not trim: -trimpath is part of every
		// compiled package's cache key, and without it the images reuse
		// what `go test` of the same packages just compiled (with the
		// justfile's CGO_ENABLED=0) instead of compiling it all again.
		args = append(args, "-trimpath")
	}
	if s.LDFlags != "" {
		args = append(args, "-ldflags", s.LDFlags)
	}
	if len(s.Tags) > 0 {
		args = append(args, "-tags", strings.Join(s.Tags, ","))
	}
	args = append(args, s.Packages...)
	if err := b.run(ctx, buildDir, s, "go", args...); err != nil {
		return nil, fmt.Errorf("%s: go build: %w", s.Name, localHint(s, err))
	}
	for _, bin := range bins {
		if _, err := os.Stat(bin.Path); err != nil {
			return nil, fmt.Errorf("%s: go build produced no %s: %w", s.Name, bin.Path, err)
		}
	}
	return bins, os.WriteFile(filepath.Join(dir, "done"), nil, 0o644)
}

func (b *Builder) run(ctx context.Context, dir string, s Spec, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	// debootstrap and go start children; on cancel (Ctrl-C) kill the whole
	// process group so nothing keeps writing into the cache.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Dir = dir
	cgo := "0"
	if s.CGO {
		cgo = "1"
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOOS=linux", "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off")
	if s.GOARCH != "" {
		cmd.Env = append(cmd.Env, "GOARCH="+s.GOARCH)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 4000 {
			msg = "..." + msg[len(msg)-4000:]
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// writeLocal writes each local module, with a generated go.mod, under
// dir/local/.
func writeLocal(dir string, mods []LocalModule) error {
	for _, l := range mods {
		d := filepath.Join(dir, filepath.FromSlash(l.localDir()))
		if err := os.RemoveAll(d); err != nil {
			return err
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		goVersion := l.GoVersion
		if goVersion == "" {
			goVersion = "1.22"
		}
		gomod := fmt.Sprintf("module %s\n\ngo %s\n", l.Path, goVersion)
		if err := os.WriteFile(filepath.Join(d, "go.mod"), []byte(gomod), 0o644); err != nil {
			return err
		}
		for name, body := range l.Files {
			if name == "go.mod" || name != filepath.Base(name) {
				return fmt.Errorf("local module %s: file name %q must be a plain file name other than go.mod", l.Path, name)
			}
			if err := os.WriteFile(filepath.Join(d, name), []byte(body), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// writePatched copies each patched module from the module cache under
// dir/patched/ and overwrites its files.
func writePatched(ctx context.Context, dir string, patches []ModulePatch) error {
	for _, m := range patches {
		src, err := Download(ctx, m.Path, m.Version)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(m.localDir()))
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
		if err := os.CopyFS(dst, os.DirFS(src.Dir)); err != nil {
			return fmt.Errorf("copying %s@%s to patch it: %w", m.Path, m.Version, err)
		}
		for rel, body := range m.Files {
			p := filepath.Join(dst, filepath.FromSlash(rel))
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("patch of %s@%s (%s): %s is not in the module: the patch no longer matches it", m.Path, m.Version, m.Origin, rel)
			}
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// localHint adds, to a failed build whose output names a local module (its
// path, or its package as a qualifier: "undefined: ext.HTTP"), that the
// stand-in may no longer match what the pinned module expects.
func localHint(s Spec, err error) error {
	for _, m := range s.Patches {
		for rel := range m.Files {
			if strings.Contains(err.Error(), path.Dir(rel)+"/") || strings.Contains(err.Error(), m.Path+"/"+path.Dir(rel)) {
				return fmt.Errorf("%w\nthe build failed in or around %s/%s, which is patched here (%s): the patch may no longer match %s@%s", err, m.Path, rel, m.Origin, m.Path, m.Version)
			}
		}
	}
	for _, l := range s.Local {
		qualified := regexp.MustCompile(`(^|[^\w/.])` + regexp.QuoteMeta(path.Base(l.Path)) + `\.[A-Za-z_]`)
		if strings.Contains(err.Error(), l.Path) || qualified.MatchString(err.Error()) {
			return fmt.Errorf("%w\nthe build failed in or around %s, which is supplied from source here (%s): it may no longer match what %s@%s expects; compare it with that module's source", err, l.Path, l.Origin, s.Module, s.Version)
		}
	}
	return err
}

// StagingReplaces reads a module's go.mod (e.g. k8s.io/kubernetes) and maps
// every directory replacement under ./staging to the published module of
// version, the way consumers of k8s.io/kubernetes must.
func StagingReplaces(gomod []byte, version string) (map[string]string, error) {
	f, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range f.Replace {
		if strings.HasPrefix(r.New.Path, "./staging/") && r.New.Version == "" {
			out[r.Old.Path] = version
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no ./staging replacements found")
	}
	return out, nil
}

// Downloaded is where `go mod download` put a module.
type Downloaded struct{ Dir, GoMod string }

// Download fetches module@version into the module cache (read-only) and says
// where its tree and go.mod are.
func Download(ctx context.Context, module, version string) (Downloaded, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+version)
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	cmd.Dir = os.TempDir()
	out, err := cmd.Output()
	var info struct{ Dir, GoMod, Error string }
	if jerr := json.Unmarshal(out, &info); jerr == nil && info.Error != "" {
		return Downloaded{}, fmt.Errorf("go mod download %s@%s: %s", module, version, info.Error)
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return Downloaded{}, fmt.Errorf("go mod download %s@%s: %w", module, version, err)
	}
	return Downloaded{Dir: info.Dir, GoMod: info.GoMod}, nil
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, s)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Cached says whether b holds s's output already (always false for a local
// build, which is relinked every time).
func (b *Builder) Cached(ctx context.Context, s Spec) (bool, error) {
	if s.Module == "" {
		return false, nil
	}
	goVersion, err := GoVersion(ctx)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(filepath.Join(b.WorkDir, sanitize(s.Name)+"-"+s.Key(goVersion, ""), "done"))
	return err == nil, nil
}
