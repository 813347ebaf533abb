// Command fiberd runs in each Home: it holds the grant the grant controller
// issued (with the template the grant controller opened), pulls and verifies
// the snapshot artifact and serves fibers to fiber-router, which proves
// itself with a credential minted for this Home (docs/contracts.md §4, §5;
// docs/security.md §3).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"lampyr.dev/serving/impl/fiberd"
	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/server"
	"lampyr.dev/serving/impl/fiberd/signedgrant"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	var (
		listen       = flag.String("listen", ":9090", "address of the fiberd API")
		grantFile    = flag.String("grant-file", "/var/run/lampyr/home/grant", "signed grant (the Home Secret, mounted)")
		grantKeyFile = flag.String("grant-key-file", "/var/run/lampyr/home/grant-key.pub", "grant controller's public key (PEM)")
		routerKeys   = flag.String("router-keys-file", "/var/run/lampyr/home/router-keys.pub", "fiber-router's public key(s) (PEM), re-read with the grant: credentials must verify with one of them")
		helper       = flag.String("helper", "/lampyr-helper", "lampyr-helper binary")
		stateDir     = flag.String("state-dir", "/var/lib/fiberd", "unpacked snapshots and per-fiber state")
		warm         = flag.Int("warm-fibers", 2, "warm pool size (capped by the grant's maxFibers)")
		kernelSplice = flag.Bool("kernel-splice", true, "join each reuse-mode tunnel's sockets in the kernel (BPF sockmap; needs CAP_BPF and CAP_NET_ADMIN) so tunneled bytes never pass through fiberd; falls back to copying, with a log line, where refused")
		cgroupParent = flag.String("cgroup-parent", "", "cgroup v1 memory directory for fibers (default: a child of fiberd's own memory cgroup, so the Home's limit covers its fibers)")
		mirrors      multi
	)
	flag.Var(&mirrors, "registry-mirror", "from=to: reach registry host `from` at `to` (repeatable), e.g. localhost:5002=kind-registry:5000")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *listen, *grantFile, *grantKeyFile, *routerKeys, *helper, *stateDir, *cgroupParent, *warm, *kernelSplice, mirrors); err != nil {
		log.Fatalf("fiberd: %v", err)
	}
}

func run(ctx context.Context, listen, grantFile, grantKeyFile, routerKeysFile, helper, stateDir, cgroupParent string, warm int, kernelSplice bool, mirrors []string) error {
	pubPEM, err := os.ReadFile(grantKeyFile)
	if err != nil {
		return fmt.Errorf("--grant-key-file: %w", err)
	}
	grantKey, err := signedgrant.ParsePublicKey(pubPEM)
	if err != nil {
		return fmt.Errorf("--grant-key-file %s: %w", grantKeyFile, err)
	}
	m, err := fiberd.ParseMirrors(mirrors)
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
	// The pids limit is best effort: hosts without the v1 pids controller
	// still get memory-limited fibers.
	pidsParent := ""
	if own, err := ownCgroupDir("pids"); err == nil {
		pidsParent = filepath.Join(own, "fibers")
	}
	be, err := process.New(process.Config{
		HelperPath:   helper,
		StateDir:     filepath.Join(stateDir, "f"),
		CgroupParent: cgroupParent,
		PidsParent:   pidsParent,
	})
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{
		RouterKeyFile:   routerKeysFile,
		GrantFile:       grantFile,
		GrantKey:        grantKey,
		StateDir:        filepath.Join(stateDir, "s"),
		Backend:         be,
		WarmFibers:      warm,
		RegistryOptions: m.RemoteOptions(),
		KernelSplice:    kernelSplice,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log.Printf("fiberd: serving on %s (fibers in %s)", ln.Addr(), cgroupParent)
	go func() {
		<-ctx.Done()
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
