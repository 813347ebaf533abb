// Package fiberdtest starts a real fiberd with the process backend on
// loopback for tests, with everything it needs around it: an in-memory OCI
// registry on 127.0.0.1, a snapshot artifact of a handler built with
// `go build`, a router key and a signed grant (carrying the template facts
// the grant controller would have opened).
//
//	endpoint, token := fiberdtest.Start(t, fiberdtest.Options{Mode: "reuse", IdleTimeout: time.Second})
//	c, _ := client.New(endpoint, token)
//
// token is a router credential minted for this Home, valid for an hour.
//
// The process backend needs root and the cgroup v1 memory controller; where
// they are missing, Start skips the test and says why.
package fiberdtest

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/backend/gvisor"
	"lampyr.dev/serving/impl/fiberd/backend/gvisor/runscpin"
	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/server"
	"lampyr.dev/serving/impl/install/installenv"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// TestHandlerPackage is the default handler: endpoints that expose the
// sandbox (/, /read, /write, /ps, /dial, /alloc, /stream, /sleep, /exit, /ws),
// HTTP/1.1 and h2c.
const TestHandlerPackage = "lampyr.dev/serving/impl/fiberd/internal/testhandler"

// HelperPackage is lampyr-helper's main package.
const HelperPackage = "lampyr.dev/serving/impl/cmd/lampyr-helper"

// Options shape the fiberd under test. Zero values give a fresh-mode
// Revision "hello-00001" of the test handler, 10 fibers max, 2 warm.
type Options struct {
	Namespace, Revision string
	// Mode is "fresh" (default) or "reuse".
	Mode string
	// IdleTimeout for reuse mode (whole seconds; default 30s).
	IdleTimeout time.Duration
	MaxFibers   int32
	// WarmFibers is the warm pool size (default 2; -1 for none).
	WarmFibers int
	// WarmIdle empties the warm pool after that long without a request
	// (server.Config.WarmIdle); 0: never.
	WarmIdle          time.Duration
	MemoryPerFiber    int64
	MaxRequestSeconds int64
	// Protocol is "http1" (default) or "h2c".
	Protocol string
	// HandlerPackage is a main package built (CGO_ENABLED=0) as the handler;
	// default TestHandlerPackage. It must listen on $PORT.
	HandlerPackage string
	// HandlerBinary is a prebuilt static handler used instead.
	HandlerBinary string
	// Port the handler listens on (default 8080).
	Port int32
	// Env is added to every fiber's environment (K_SERVICE etc. have defaults).
	Env map[string]string
	// Logf receives fiberd's and the fibers' logs; default t.Logf.
	Logf func(format string, args ...any)
	// NoWait returns before fiberd is ready.
	NoWait bool
	// UserSpaceTunnels makes fiberd copy tunneled bytes itself instead of
	// joining the sockets in the kernel.
	UserSpaceTunnels bool
	// RouterKey is the router key whose public half fiberd trusts; default
	// a new one. Give two instances the same key to model one installation.
	RouterKey ed25519.PrivateKey
	// PidsMax caps each fiber's tasks (threads included); default 1024.
	PidsMax int
	// HomePidsMax caps the tasks of all fibers together (process.Config;
	// default sized from MaxFibers × PidsMax, capped).
	HomePidsMax int
	// FiberCPUMillis bounds each fiber's CPU (thousandths); default 1000.
	FiberCPUMillis int
	// UID is the handler's uid and gid inside its user namespace; default
	// 65534.
	UID uint32
	// Egress gives the fibers service bindings (nil: loopback only).
	Egress *process.Egress
	// Backend is "process" or "gvisor" (runsc built from the pinned
	// module, or LAMPYR_RUNSC); default LAMPYR_FIBERDTEST_BACKEND, else
	// "process". The test handler listens on all of the fiber's addresses
	// on gvisor (TESTHANDLER_HOST): fiberd reaches it through the
	// sandbox's own network stack, not its loopback.
	Backend string
	// GVisorPreinit restores gvisor fibers from a checkpoint of the
	// initialized handler; GVisorCheckpointTimeout bounds making it
	// (gvisor.Config).
	GVisorPreinit           bool
	GVisorCheckpointTimeout time.Duration
	// HomeKey, if set, is the Home's TLS key: fiberd serves TLS with it
	// (server.Config.TLSKeyFile), the grant names it, and Client dials
	// TLS accepting that key only, as in a cluster.
	HomeKey ed25519.PrivateKey
	// Spare starts fiberd with no grant (a spare Home): Claims is made but
	// not written; push it (Client.PushGrant) or WriteGrant it.
	Spare bool
}

// Instance is a running fiberd under test.
type Instance struct {
	// Endpoint is host:port of fiberd's API (like status.homeEndpoint).
	Endpoint string
	// Token is a router credential for this Home (valid an hour).
	Token  string
	Client *client.Client
	Server *server.Server
	// Home is the Home's name (the grant's home, the credentials' audience).
	Home string
	// RouterKey mints credentials (routercred.Mint, routercred.NewMinter).
	RouterKey ed25519.PrivateKey
	// Registry is host:port of the in-memory registry holding the artifacts.
	Registry    string
	GrantKey    ed25519.PrivateKey
	GrantFile   string
	SnapshotRef string
	// TemplateRef is what the grant names as its template (fiberd does not
	// fetch it: the grant controller opened it).
	TemplateRef string
	// Claims is the grant last written.
	Claims signedgrant.Claims
	// HomeKeySHA256 is the fingerprint of Options.HomeKey ("" without).
	HomeKeySHA256 string
}

// Start starts fiberd and returns its endpoint and router token. Everything
// is torn down when the test ends.
func Start(t testing.TB, opts Options) (endpoint, token string) {
	i := StartInstance(t, opts)
	return i.Endpoint, i.Token
}

var (
	buildMu  sync.Mutex
	built    = map[string]string{}
	buildDir string
)

// Build compiles a main package (static) once per test process and returns
// the binary's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	if buildDir == "" {
		removeStaleBuildDirs()
		buildDir = filepath.Join(os.TempDir(), fmt.Sprintf("%s%d", buildDirPrefix, os.Getpid()))
		if err := os.MkdirAll(buildDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(buildDir, strings.ReplaceAll(pkg, "/", "_"))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out
}

const buildDirPrefix = "lampyr-fiberdtest-bin-"

// removeStaleBuildDirs deletes binaries built by test processes that have
// exited (a test process cannot know when its last test is done, so each
// cleans up after its predecessors).
func removeStaleBuildDirs() {
	ents, _ := os.ReadDir(os.TempDir())
	for _, e := range ents {
		pid, ok := strings.CutPrefix(e.Name(), buildDirPrefix)
		if !ok {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); err != nil {
			os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
		}
	}
}

// Artifact builds a snapshot artifact of the handler binary and pushes it
// to registry; it returns the digest-pinned reference.
func Artifact(t testing.TB, registryHost, handlerBinary string, port int32, protocol string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(handlerBinary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "app", "handler"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := artifact.Build(dir, artifact.Config{
		Entrypoint: []string{"/app/handler"},
		Port:       port,
		Protocol:   protocol,
		Runtime:    artifact.Runtime{Name: "go"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := artifact.Push(context.Background(), img, registryHost+"/lampyr/snapshots:test")
	if err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// StartRegistry serves an in-memory OCI registry on 127.0.0.1 until the
// test ends and returns its host:port.
func StartRegistry(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// StartInstance is Start with access to everything around fiberd.
func StartInstance(t testing.TB, opts Options) *Instance {
	t.Helper()
	if err := process.Supported(); err != nil {
		t.Skipf("fiberdtest: skipping, real fibers are not possible here: %v", err)
	}
	setDefaults(&opts, t)
	// Fibers and pool goroutines may log while the test is being torn down;
	// testing panics on Logf after a test completes, so the log is cut off
	// after the last cleanup.
	logs := &guardedLog{logf: opts.Logf}
	opts.Logf = logs.Logf
	t.Cleanup(logs.close)
	handler := opts.HandlerBinary
	if handler == "" {
		handler = Build(t, opts.HandlerPackage)
	}
	helperBin := Build(t, HelperPackage)

	i := &Instance{Home: opts.Revision + "-" + fmt.Sprintf("%010x", time.Now().UnixNano()&0xffffffffff)}
	i.Registry = StartRegistry(t)
	i.SnapshotRef = Artifact(t, i.Registry, handler, opts.Port, opts.Protocol)
	i.TemplateRef = i.Registry + "/lampyr/templates@sha256:" + strings.Repeat("0", 64)

	routerPub, routerKey, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if opts.RouterKey != nil {
		routerKey, routerPub = opts.RouterKey, opts.RouterKey.Public().(ed25519.PublicKey)
	}
	i.RouterKey = routerKey
	if i.Token, err = routercred.Mint(routerKey, i.Home, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	var idle int64
	if opts.Mode == "reuse" {
		idle = int64(opts.IdleTimeout / time.Second)
	}

	var pub ed25519.PublicKey
	if pub, i.GrantKey, err = signedgrant.GenerateKey(); err != nil {
		t.Fatal(err)
	}
	// Socket paths are limited to 107 bytes, so the state lives under a
	// short directory rather than t.TempDir().
	state, err := os.MkdirTemp("/tmp", "fd")
	if err != nil {
		t.Fatal(err)
	}
	// Fibers' helpers run as unprivileged host ids: they must search it.
	os.Chmod(state, 0o711)
	t.Cleanup(func() { os.RemoveAll(state) })
	i.GrantFile = filepath.Join(state, "grant")
	env := map[string]string{
		"K_SERVICE":       strings.TrimSuffix(opts.Revision, "-00001"),
		"K_CONFIGURATION": strings.TrimSuffix(opts.Revision, "-00001"),
		"K_REVISION":      opts.Revision,
	}
	for k, v := range opts.Env {
		env[k] = v
	}
	now := time.Now()
	i.Claims = signedgrant.Claims{
		GrantID:             "grant-test-1",
		Home:                i.Home,
		Namespace:           opts.Namespace,
		Revision:            opts.Revision,
		Template:            i.TemplateRef,
		Helper:              signedgrant.Helper{Port: opts.Port, Protocol: opts.Protocol},
		SnapshotArtifact:    i.SnapshotRef,
		MemoryPerFiberBytes: opts.MemoryPerFiber,
		MaxFibers:           opts.MaxFibers,
		MaxRequestSeconds:   opts.MaxRequestSeconds,
		Execution:           signedgrant.Execution{Mode: opts.Mode, IdleTimeoutSeconds: idle},
		Env:                 env,
		IssuedAt:            now,
		ExpiresAt:           now.Add(time.Hour),
	}
	var tlsKeyFile string
	if opts.HomeKey != nil {
		i.HomeKeySHA256 = homekey.Fingerprint(opts.HomeKey.Public().(ed25519.PublicKey))
		i.Claims.HomeKeySHA256 = i.HomeKeySHA256
		b, err := homekey.MarshalPrivateKey(opts.HomeKey)
		if err != nil {
			t.Fatal(err)
		}
		tlsKeyFile = filepath.Join(state, "home-key.pem")
		if err := os.WriteFile(tlsKeyFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Spare {
		opts.NoWait = true
	} else {
		i.WriteGrant(t, i.Claims)
	}

	var be backend.Backend
	if opts.Backend == "gvisor" {
		be, err = gvisor.New(gvisor.Config{
			Runsc:             Runsc(t),
			StateDir:          filepath.Join(state, "g"),
			CgroupParent:      "lampyr-fiberdtest-" + filepath.Base(state),
			PidsMax:           int64(opts.PidsMax),
			CPUMillis:         int64(opts.FiberCPUMillis),
			UID:               opts.UID,
			GID:               opts.UID,
			Egress:            opts.Egress,
			Log:               logWriter{opts.Logf},
			Preinit:           opts.GVisorPreinit,
			CheckpointTimeout: opts.GVisorCheckpointTimeout,
			DebugLogDir:       os.Getenv("LAMPYR_GVISOR_DEBUG_LOG"),
		})
	} else {
		be, err = process.New(process.Config{
			HelperPath:   helperBin,
			StateDir:     filepath.Join(state, "f"),
			CgroupParent: filepath.Join(process.DefaultCgroupParent, filepath.Base(state)),
			PidsParent:   filepath.Join(process.DefaultPidsRoot, "lampyr-fiberd", filepath.Base(state)),
			PidsMax:      opts.PidsMax,
			HomePidsMax:  opts.HomePidsMax,
			CPUParent:    filepath.Join(process.DefaultCPURoot, "lampyr-fiberd", filepath.Base(state)),
			CPUMillis:    opts.FiberCPUMillis,
			UID:          opts.UID,
			GID:          opts.UID,
			Egress:       opts.Egress,
			// As fiberd's --sandbox-shells default: starts take ready shells.
			Shells: 1,
			Log:    logWriter{opts.Logf},
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	warm := opts.WarmFibers
	if warm < 0 {
		warm = 0
	}
	srv, err := server.New(server.Config{
		RouterKeys:        []ed25519.PublicKey{routerPub},
		TLSKeyFile:        tlsKeyFile,
		GrantFile:         i.GrantFile,
		GrantKey:          pub,
		StateDir:          filepath.Join(state, "s"),
		Backend:           be,
		WarmFibers:        warm,
		WarmIdle:          opts.WarmIdle,
		GrantPollInterval: 200 * time.Millisecond,
		Logf:              opts.Logf,
		KernelSplice:      !opts.UserSpaceTunnels,
	})
	if err != nil {
		t.Fatal(err)
	}
	i.Server = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		if c, ok := be.(io.Closer); ok {
			c.Close()
		}
	})
	i.Endpoint = ln.Addr().String()
	if i.HomeKeySHA256 != "" {
		i.Client, err = client.NewTLS(i.Endpoint, i.Token, i.HomeKeySHA256)
	} else {
		i.Client, err = client.New(i.Endpoint, i.Token)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !opts.NoWait {
		i.WaitReady(t, 30*time.Second)
	}
	return i
}

// Runsc is runsc built once from the pinned gvisor.dev/gvisor module into
// the project's cache (the build the Home image ships), or LAMPYR_RUNSC.
// It skips the test, saying why, where sandboxes cannot run.
func Runsc(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("LAMPYR_RUNSC")
	if bin == "" {
		if os.Geteuid() != 0 {
			t.Skip("skipping: the gvisor backend needs root to create sandboxes")
		}
		b := &gobuild.Builder{WorkDir: filepath.Join(installenv.Cache(), "go")}
		bins, err := b.Build(context.Background(), runscpin.Spec(), "")
		if err != nil {
			t.Fatalf("building runsc from gvisor.dev/gvisor@%s: %v", runscpin.Version, err)
		}
		bin = bins[0].Path
	}
	if err := gvisor.Supported(bin); err != nil {
		t.Skipf("skipping: %v", err)
	}
	return bin
}

// BackendConfig is a process backend configuration for a test whose
// state lives under dir (made searchable by the fibers' unprivileged
// helpers): per-test memory, pids and cpu cgroups, removed when the test
// ends.
func BackendConfig(t testing.TB, helperPath, dir string) process.Config {
	t.Helper()
	os.Chmod(dir, 0o711)
	base := filepath.Base(dir)
	cfg := process.Config{
		HelperPath:   helperPath,
		StateDir:     filepath.Join(dir, "f"),
		CgroupParent: filepath.Join(process.DefaultCgroupParent, base),
		PidsParent:   filepath.Join(process.DefaultPidsRoot, "lampyr-fiberd", base),
		CPUParent:    filepath.Join(process.DefaultCPURoot, "lampyr-fiberd", base),
	}
	t.Cleanup(func() {
		os.Remove(cfg.CgroupParent)
		os.Remove(cfg.PidsParent)
		os.Remove(cfg.CPUParent)
	})
	return cfg
}

func setDefaults(o *Options, t testing.TB) {
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Revision == "" {
		o.Revision = "hello-00001"
	}
	if o.Mode == "" {
		o.Mode = "fresh"
	}
	if o.Mode == "reuse" && o.IdleTimeout < time.Second {
		if o.IdleTimeout == 0 {
			o.IdleTimeout = 30 * time.Second
		} else {
			o.IdleTimeout = time.Second
		}
	}
	if o.MaxFibers == 0 {
		o.MaxFibers = 10
	}
	if o.WarmFibers == 0 {
		o.WarmFibers = 2
	}
	if o.MemoryPerFiber == 0 {
		o.MemoryPerFiber = 128 << 20
	}
	if o.MaxRequestSeconds == 0 {
		o.MaxRequestSeconds = 300
	}
	if o.Protocol == "" {
		o.Protocol = "http1"
	}
	if o.HandlerPackage == "" {
		o.HandlerPackage = TestHandlerPackage
	}
	if o.Port == 0 {
		o.Port = 8080
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	if o.Backend == "" {
		o.Backend = os.Getenv("LAMPYR_FIBERDTEST_BACKEND")
	}
	switch o.Backend {
	case "", "process":
		o.Backend = "process"
	case "gvisor":
		if _, ok := o.Env["TESTHANDLER_HOST"]; !ok && o.HandlerPackage == TestHandlerPackage && o.HandlerBinary == "" {
			env := map[string]string{"TESTHANDLER_HOST": "0.0.0.0"}
			for k, v := range o.Env {
				env[k] = v
			}
			o.Env = env
		}
	default:
		t.Fatalf("fiberdtest: Backend %q: want \"process\" or \"gvisor\"", o.Backend)
	}
}

// WriteGrant signs c with the test grant key and installs it as the grant
// file, as the grant controller's Secret update would; fiberd picks it up
// immediately.
func (i *Instance) WriteGrant(t testing.TB, c signedgrant.Claims) {
	t.Helper()
	b, err := signedgrant.Sign(i.GrantKey, c)
	if err != nil {
		t.Fatal(err)
	}
	i.WriteRawGrant(t, b)
	i.Claims = c
}

// WriteRawGrant installs b as the grant file as is (e.g. a forged grant).
func (i *Instance) WriteRawGrant(t testing.TB, b []byte) {
	t.Helper()
	tmp := i.GrantFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, i.GrantFile); err != nil {
		t.Fatal(err)
	}
	if i.Server != nil {
		i.Server.SyncGrant()
	}
}

// WaitReady waits until /readyz answers 200.
func (i *Instance) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = i.Client.Ready(ctx)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("fiberd at %s not ready within %s: %v", i.Endpoint, timeout, err)
}

type logWriter struct{ logf func(string, ...any) }

func (l logWriter) Write(b []byte) (int, error) {
	l.logf("%s", strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

type guardedLog struct {
	mu     sync.Mutex
	logf   func(string, ...any)
	closed bool
}

func (g *guardedLog) Logf(format string, args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.logf(format, args...)
	}
}

func (g *guardedLog) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// Metric sums the samples on fiberd's /metrics whose series (name and
// labels as exposed, e.g. `fiberd_tunnels_total{splice="kernel"}`) starts
// with prefix; 0 when none does.
func (i *Instance) Metric(t testing.TB, prefix string) float64 {
	t.Helper()
	u := i.Client.URL()
	u.Path = client.MetricsPath
	req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
	req.Header.Set("Authorization", "Bearer "+i.Token)
	// i.Client's transport: plain, or TLS to the Home key.
	resp, err := i.Client.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("fiberd /metrics: %d %v", resp.StatusCode, err)
	}
	var n float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		n += v
	}
	return n
}

// HostListener listens on a loopback port of the test's own network
// namespace, accepting and closing every connection, and returns its
// address: a port a fiber must not reach, and fiberd itself must.
func HostListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}
