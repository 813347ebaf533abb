// Command fiberd runs in each Home: it holds the grant the grant controller
// issued (with the template the grant controller opened), pulls and verifies
// the snapshot artifact and serves fibers to fiber-router, which proves
// itself with a credential minted for this Home (docs/contracts.md §4, §5;
// docs/security.md §3).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/backend/gvisor"
	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/egress/proxy"
	"lampyr.dev/serving/impl/fiberd/server"
	"lampyr.dev/serving/impl/trust/egresspolicy"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if len(os.Args) > 1 && os.Args[1] == "egress-proxy" {
		if err := egressProxyMain(os.Args[2:]); err != nil {
			log.Fatalf("fiberd egress-proxy: %v", err)
		}
		return
	}
	var (
		listen       = flag.String("listen", ":9090", "address of the fiberd API")
		grantFile    = flag.String("grant-file", "/var/run/lampyr/home/grant", "signed grant (the Home Secret, mounted)")
		grantKeyFile = flag.String("grant-key-file", "/var/run/lampyr/home/grant-key.pub", "grant controller's public key (PEM)")
		routerKeys   = flag.String("router-keys-file", "/var/run/lampyr/home/router-keys.pub", "fiber-router's public key(s) (PEM), re-read with the grant: credentials must verify with one of them")
		tlsKeyFile   = flag.String("tls-key-file", "", "the Home's TLS key (PEM; the Home Secret's home-key.pem), re-read with the grant: the API is served only over TLS with it, and only a grant naming it (homeKeySHA256) is used. Empty: plain HTTP/h2c, which fiber-router refuses unless run with --allow-unauthenticated-homes")
		helper       = flag.String("helper", "/lampyr-helper", "lampyr-helper binary")
		stateDir     = flag.String("state-dir", "/var/lib/fiberd", "unpacked snapshots and per-fiber state")
		warm         = flag.Int("warm-fibers", 2, "warm pool size (capped by the grant's maxFibers)")
		warmIdle     = flag.Duration("warm-idle", 0, "end the warm fibers after this long without a request (no fiber leased, no acquisition) and keep none until the next acquisition, which starts its own fiber and then refills the warm pool; 0: never")
		kernelSplice = flag.Bool("kernel-splice", true, "join each reuse-mode tunnel's sockets in the kernel (BPF sockmap; needs CAP_BPF and CAP_NET_ADMIN) so tunneled bytes never pass through fiberd; falls back to copying, with a log line, where refused")
		cgroupParent = flag.String("cgroup-parent", "", "cgroup v1 memory directory for fibers (default: a child of fiberd's own memory cgroup, so the Home's limit covers its fibers)")
		sb           sandboxFlags
		mirrors      multi
	)
	flag.IntVar(&sb.homePidsMax, "home-pids-max", 0, fmt.Sprintf("most tasks (processes and threads) all fibers of this Home hold together: pids.max of the pids cgroup every fiber's own is under (each fiber: at most 1024). 0: the grant's maxFibers x 1024, at most %d; -1: no Home-wide bound", process.DefaultHomePidsCap))
	flag.IntVar(&sb.shells, "sandbox-shells", 1, "process backend: sandbox shells kept ready (a helper in its namespaces and cgroups waiting for a fiber's spec, no handler), so a fiber's start skips the clone and the cgroup moves; 0: none")
	flag.IntVar(&sb.fiberCPUMillis, "fiber-cpu", 1000, "each fiber's CPU bound in millicores (CFS quota; fibers of a Home share its CPU with equal weights, and the Home's own limit bounds them all)")
	flag.Var(&sb.idBase, "id-base", "first host uid/gid of the node's pool of per-fiber id ranges (65536 ids each); every Home on a node must agree")
	flag.IntVar(&sb.idRanges, "id-ranges", process.DefaultIDRanges, "number of per-fiber id ranges in the node's pool")
	flag.Int64Var(&sb.limits.LayerBytes, "max-snapshot-bytes", artifact.DefaultLimits.LayerBytes, "largest compressed snapshot layer fiberd fetches (it holds the layer in memory)")
	flag.Int64Var(&sb.limits.UnpackedBytes, "max-unpacked-bytes", artifact.DefaultLimits.UnpackedBytes, "largest unpacked snapshot (sum of file sizes) fiberd writes to its state volume")
	flag.IntVar(&sb.limits.Entries, "max-snapshot-entries", artifact.DefaultLimits.Entries, "most files, directories and symlinks in a snapshot")
	flag.StringVar(&sb.idLockDir, "id-lock-dir", process.DefaultIDLockDir, "directory shared by every Home on the node (a hostPath) in which fiberd locks the id ranges its fibers hold")
	flag.Var(&mirrors, "registry-mirror", "from=to: reach registry host `from` at `to` (repeatable), e.g. localhost:5002=kind-registry:5000")
	flag.StringVar(&sb.egress, "egress", "off", "fibers' service bindings: \"cluster\" (a restricted resolver and TCP to the addresses it answers, within --egress-allow) or \"off\" (loopback only)")
	flag.StringVar(&sb.egressDomains, "egress-domains", "svc.cluster.local", "comma-separated DNS suffixes fibers may resolve")
	flag.StringVar(&sb.egressDenyNames, "egress-deny-names", "", "comma-separated names (or .suffix) fibers may not resolve")
	flag.StringVar(&sb.egressAllow, "egress-allow", "", "comma-separated CIDRs fibers may connect to (e.g. the Service CIDR); required with --egress=cluster")
	flag.StringVar(&sb.egressDeny, "egress-deny", "", "comma-separated CIDRs refused inside --egress-allow (the Home's POD_IP and HOST_IP are added)")
	flag.StringVar(&sb.egressNamespace, "egress-namespace", "", "the Revision's namespace, first in fibers' DNS search path")
	flag.StringVar(&sb.egressDial, "egress-dial", "direct", "how fibers' allowed connections leave: \"proxy\" (through the tenant namespace's egress Pod, found with --egress-api) or \"direct\" (from the Home)")
	flag.StringVar(&sb.egressAPI, "egress-api", "", "the grant controller's egress API, e.g. http://lampyr-grant-controller.lampyr-system.svc:8092 (with --egress-dial=proxy)")
	flag.StringVar(&sb.backend, "backend", "process", "what runs fibers: \"process\" (a Linux process sandbox: namespaces, cgroups, a seccomp allowlist) or \"gvisor\" (a runsc sandbox per fiber: gVisor's user-space kernel between the handler and the host's)")
	flag.StringVar(&sb.runsc, "runsc", "/runsc", "runsc binary (--backend=gvisor)")
	flag.StringVar(&sb.gvisorPlatform, "gvisor-platform", "systrap", "runsc --platform (--backend=gvisor); systrap needs no KVM")
	flag.BoolVar(&sb.gvisorPreinit, "gvisor-preinit", true, "start each Revision's handler once, checkpoint it when it listens, and restore every fiber from that image (--backend=gvisor); where checkpointing fails the fibers start cold and fiberd logs why")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	sb.grantFile = *grantFile
	if err := run(ctx, *listen, *grantFile, *grantKeyFile, *routerKeys, *tlsKeyFile, *helper, *stateDir, *cgroupParent, *warm, *warmIdle, *kernelSplice, mirrors, sb); err != nil {
		log.Fatalf("fiberd: %v", err)
	}
}

// sandboxFlags configure the fibers' sandbox beyond memory.
type sandboxFlags struct {
	fiberCPUMillis int
	homePidsMax    int
	shells         int
	idBase         uint32Flag
	idRanges       int
	idLockDir      string
	limits         artifact.Limits

	egress, egressDomains, egressDenyNames, egressAllow, egressDeny, egressNamespace string
	egressDial, egressAPI, grantFile                                                 string

	backend, runsc, gvisorPlatform string
	gvisorPreinit                  bool
}

// egressConfig is the process backend's egress from the flags, nil when
// off. The Home's own addresses (downward API) are always denied.
func (sb sandboxFlags) egressConfig() (*process.Egress, error) {
	switch sb.egress {
	case "off", "":
		return nil, nil
	case "cluster":
	default:
		return nil, fmt.Errorf("--egress %q: want \"cluster\" or \"off\"", sb.egress)
	}
	allow, err := egresspolicy.ParsePrefixes("--egress-allow", sb.egressAllow)
	if err != nil {
		return nil, err
	}
	if len(allow) == 0 {
		return nil, errors.New("--egress=cluster needs --egress-allow (the ranges fibers may reach, e.g. the Service CIDR)")
	}
	deny, err := egresspolicy.ParsePrefixes("--egress-deny", sb.egressDeny+","+os.Getenv("POD_IP")+","+os.Getenv("HOST_IP"))
	if err != nil {
		return nil, err
	}
	split := func(v string) []string {
		var out []string
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		return out
	}
	eg := &process.Egress{Policy: &egresspolicy.Policy{
		Domains:         split(sb.egressDomains),
		DenyNames:       split(sb.egressDenyNames),
		Allow:           allow,
		Deny:            deny,
		SearchNamespace: sb.egressNamespace,
	}}
	switch sb.egressDial {
	case "direct", "":
	case "proxy":
		if sb.egressAPI == "" {
			return nil, errors.New("--egress-dial=proxy needs --egress-api (the grant controller's egress API, which names this namespace's egress Pod)")
		}
		grant := func() ([]byte, error) {
			// The grant fiberd runs on (a claimed spare Home's came over
			// its API before its Secret volume has it); the file before
			// the server is up.
			if srv := runningServer.Load(); srv != nil {
				if b := srv.GrantRaw(); b != nil {
					return b, nil
				}
			}
			b, err := os.ReadFile(sb.grantFile)
			if err != nil {
				return nil, fmt.Errorf("reading the signed grant for the egress proxy: %w", err)
			}
			return bytes.TrimSpace(b), nil
		}
		d := &proxy.Dialer{Endpoints: &proxy.Endpoints{API: sb.egressAPI, Grant: grant}, Grant: grant}
		eg.Dial = d.Dial
	default:
		return nil, fmt.Errorf("--egress-dial %q: want \"proxy\" or \"direct\"", sb.egressDial)
	}
	return eg, nil
}

// runningServer is the fiberd server once made (the egress proxy's grant).
var runningServer atomic.Pointer[server.Server]

type uint32Flag uint32

func (u *uint32Flag) String() string { return strconv.FormatUint(uint64(*u), 10) }
func (u *uint32Flag) Set(v string) error {
	n, err := strconv.ParseUint(v, 0, 32)
	*u = uint32Flag(n)
	return err
}

func run(ctx context.Context, listen, grantFile, grantKeyFile, routerKeysFile, tlsKeyFile, helper, stateDir, cgroupParent string, warm int, warmIdle time.Duration, kernelSplice bool, mirrors []string, sb sandboxFlags) error {
	if warmIdle < 0 {
		return fmt.Errorf("--warm-idle %s: want 0 (never) or a positive duration", warmIdle)
	}
	pubPEM, err := os.ReadFile(grantKeyFile)
	if err != nil {
		return fmt.Errorf("--grant-key-file: %w", err)
	}
	grantKey, err := signedgrant.ParsePublicKey(pubPEM)
	if err != nil {
		return fmt.Errorf("--grant-key-file %s: %w", grantKeyFile, err)
	}
	m, err := artifact.ParseMirrors(mirrors)
	if err != nil {
		return err
	}
	if cgroupParent == "" {
		own, err := ownCgroupDir("memory")
		if err != nil {
			return err
		}
		cgroupParent = filepath.Join(own, "fibers")
	}
	// Fibers need a task bound and a CPU share: without the pids or cpu
	// controller fiberd refuses to run any (the error says which).
	pidsOwn, err := ownCgroupDir("pids")
	if err != nil {
		return fmt.Errorf("fibers need a pids cgroup (a bound on their tasks): %w", err)
	}
	cpuOwn, err := ownCgroupDir("cpu")
	if err != nil {
		return fmt.Errorf("fibers need a cpu cgroup (a CPU share and bound): %w", err)
	}
	eg, err := sb.egressConfig()
	if err != nil {
		return err
	}
	if eg != nil {
		log.Printf("fiber egress: resolving %v (not %v), connecting within %v (not %v), dialling %s", eg.Policy.Domains, eg.Policy.DenyNames, eg.Policy.Allow, eg.Policy.Deny, sb.egressDial)
	}
	var be interface {
		backend.Backend
		Close() error
	}
	switch sb.backend {
	case "", lampyrconfig.BackendProcess:
		be, err = process.New(process.Config{
			Egress:       eg,
			HelperPath:   helper,
			StateDir:     filepath.Join(stateDir, "f"),
			CgroupParent: cgroupParent,
			PidsParent:   filepath.Join(pidsOwn, "fibers"),
			HomePidsMax:  sb.homePidsMax,
			CPUParent:    filepath.Join(cpuOwn, "fibers"),
			CPUMillis:    sb.fiberCPUMillis,
			IDBase:       uint32(sb.idBase),
			IDRanges:     sb.idRanges,
			IDLockDir:    sb.idLockDir,
			Shells:       sb.shells,
		})
	case lampyrconfig.BackendGVisor:
		be, err = gvisor.New(gvisor.Config{
			Runsc:     sb.runsc,
			StateDir:  filepath.Join(stateDir, "g"),
			Platform:  sb.gvisorPlatform,
			CPUMillis: int64(sb.fiberCPUMillis),
			Egress:    eg,
			Preinit:   sb.gvisorPreinit,
			IDBase:    uint32(sb.idBase),
			IDRanges:  sb.idRanges,
			IDLockDir: sb.idLockDir,
		})
	default:
		return fmt.Errorf("--backend %q: want \"process\" or \"gvisor\"", sb.backend)
	}
	if err != nil {
		return err
	}
	log.Printf("fiberd: fibers run on the %s backend", be.Name())
	srv, err := server.New(server.Config{
		RouterKeyFile:   routerKeysFile,
		TLSKeyFile:      tlsKeyFile,
		GrantFile:       grantFile,
		GrantKey:        grantKey,
		StateDir:        filepath.Join(stateDir, "s"),
		Backend:         be,
		WarmFibers:      warm,
		WarmIdle:        warmIdle,
		RegistryOptions: m.RemoteOptions(),
		KernelSplice:    kernelSplice,
		ArtifactLimits:  sb.limits,
		OnGrant: func(c signedgrant.Claims) {
			// A spare Home (no --egress-namespace) learns its namespace
			// from its first grant, before any fiber starts; a Home
			// never takes a grant of another Revision (server.putGrant).
			if eg != nil && eg.Policy.SearchNamespace == "" {
				eg.Policy.SearchNamespace = c.Namespace
			}
		},
	})
	if err != nil {
		return err
	}
	runningServer.Store(srv)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log.Printf("fiberd: serving on %s (fibers in %s)", ln.Addr(), cgroupParent)
	go func() {
		<-ctx.Done()
		// SIGTERM: the Home Pod is being deleted, evicted or drained. It
		// serves on while its replacement starts (Handover), then drains.
		// Its grace period is the handover's bound plus the grant's
		// timeoutSeconds plus 5 s, so the requests under way may run to
		// their own limit first.
		log.Printf("fiberd: SIGTERM: serving on while the replacement Home starts (at most %s, until no fiber is asked for %s)", server.HandoverMax, server.HandoverQuiet)
		h := srv.Handover(context.Background(), server.HandoverMax, server.HandoverQuiet)
		log.Printf("fiberd: handover ended after %s", h.Round(time.Millisecond))
		d := srv.DrainTimeout()
		log.Printf("fiberd: shutting down: no new fibers; waiting up to %s for %d requests and tunnels under way", d, srv.Active())
		dctx, cancel := context.WithTimeout(context.Background(), d)
		left := srv.Drain(dctx)
		cancel()
		log.Printf("fiberd: drained (%d left, ended now)", left)
		srv.Close()
	}()
	err = srv.Serve(ln)
	srv.Close()
	be.Close()
	return err
}

// ownCgroupDir finds this process's directory in a cgroup v1 controller's
// mount. Inside a container the mount may be the container's own cgroup
// (its path in /proc/self/cgroup then does not exist below the mount), in
// which case the mount itself is ours.
func ownCgroupDir(controller string) (string, error) {
	root := filepath.Join("/sys/fs/cgroup", controller)
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		return "", fmt.Errorf("no cgroup v1 %s controller at %s; pass --cgroup-parent", controller, root)
	}
	own, err := ownCgroup(controller)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, own, "cgroup.procs")); err == nil {
		return filepath.Join(root, own), nil
	}
	return root, nil
}

// ownCgroup finds this process's path in a cgroup v1 controller's hierarchy.
func ownCgroup(controller string) (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) == 3 {
			for _, c := range strings.Split(parts[1], ",") {
				if c == controller {
					return parts[2], nil
				}
			}
		}
	}
	return "", fmt.Errorf("no cgroup v1 %s controller in /proc/self/cgroup; pass --cgroup-parent", controller)
}
