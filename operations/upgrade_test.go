package operations

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
)

// opsUpgradeFrom names the earlier Lampyr the upgrade scenario installs
// first (a git ref of this repository); default: the parent of the newest
// commit that changed impl/, so the two differ in the product.
const opsUpgradeFrom = "LAMPYR_OPS_UPGRADE_FROM"

// git runs git in the repository and returns its trimmed output.
func git(args ...string) string {
	cmd := exec.Command("git", append([]string{"-C", e2eutil.RepoRoot()}, args...)...)
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "git %s: %s", strings.Join(args, " "), out)
	return strings.TrimSpace(string(out))
}

// upgradeFrom resolves the earlier ref to a commit.
func upgradeFrom() (ref, commit string) {
	ref = suite.Knob(opsUpgradeFrom)
	if ref == "" {
		last := git("rev-list", "-n", "1", "HEAD", "--", "impl")
		ref = last + "^"
	}
	return ref, git("rev-parse", "--verify", ref+"^{commit}")
}

// lyFrom builds the ly of checkout dir into bin.
func lyFrom(ctx context.Context, dir, bin string) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./impl/cmd/ly")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "building ly in %s: %s", dir, out)
}

// install runs `ly cluster install` (its own checkout's images and
// manifests) against the Lampyr cluster and returns how long it took.
func install(ctx context.Context, what, ly string) time.Duration {
	s := the().lampyr
	start := time.Now()
	cmd := exec.CommandContext(ctx, ly, "cluster", "install", "--kubeconfig", s.Kubeconfig)
	cmd.Env = os.Environ()
	log, err := os.Create(filepath.Join(suite.Artifacts(), "upgrade-"+what+".log"))
	Expect(err).NotTo(HaveOccurred())
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Run()
	Expect(err).NotTo(HaveOccurred(), "%s: ly cluster install failed; its output: %s", what, log.Name())
	for _, dep := range []string{"lampyr-controller", "lampyr-grant-controller", "fiber-router"} {
		waitRolledOut(ctx, s, contract.SystemNamespace, dep)
	}
	return time.Since(start)
}

// homeImage is the Home image the installation runs: config-lampyr's
// home-image, else the grant controller's LAMPYR_GRANT_IMAGE.
func homeImage(ctx context.Context) (string, error) {
	s := the().lampyr
	cm, err := s.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if img := cm.Data[lampyrconfig.KeyHomeImage]; img != "" {
		return img, nil
	}
	d, err := s.Clients.Kube.AppsV1().Deployments(contract.SystemNamespace).Get(ctx, "lampyr-grant-controller", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == "LAMPYR_GRANT_IMAGE" {
				return e.Value, nil
			}
		}
	}
	return "", fmt.Errorf("neither config-lampyr's %s nor the grant controller's LAMPYR_GRANT_IMAGE names the Home image", lampyrconfig.KeyHomeImage)
}

// homesSettled waits until Revision rev has exactly one live Home Pod, Ready,
// running the Home image the installation configures and under the Home's
// own name (a replacement moves back to it, so an earlier grant controller
// finds it after a downgrade); others may still be draining. It returns how
// long that took.
func homesSettled(ctx context.Context, rev string) time.Duration {
	s := the().lampyr
	start := time.Now()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		want, err := homeImage(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		l, err := e2eutil.HomePods(ctx, s.Clients, ns, rev)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		var states []string
		settled, live := 0, 0
		for _, p := range l.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				if c.Type == "Ready" && c.Status == "True" {
					ready = true
				}
			}
			states = append(states, fmt.Sprintf("%s ready=%v terminating=%v current=%v", p.Name, ready, p.DeletionTimestamp != nil, p.Spec.Containers[0].Image == want))
			if p.DeletionTimestamp == nil {
				live++
			}
			if ready && p.DeletionTimestamp == nil && p.Spec.Containers[0].Image == want && p.Name == resources.HomeNameFor(ns, rev) {
				settled++
			}
		}
		last = strings.Join(states, "; ")
		// A replaced Home may still drain a stream under way.
		return settled == 1 && live == 1 && want != "", nil
	})
	Expect(err).NotTo(HaveOccurred(), "the Home of %s did not settle on the installed image: %s", rev, last)
	return time.Since(start)
}

var _ = Describe("upgrades", Label("cluster", "operations", "upgrade"), Ordered, func() {
	It("installs an earlier Lampyr, serves a Service, upgrades to this checkout and downgrades again without a failed request", func(ctx SpecContext) {
		ref, commit := upgradeFrom()
		dir := filepath.Join(GinkgoT().TempDir(), "from")
		git("worktree", "add", "--detach", dir, commit)
		DeferCleanup(func() { git("worktree", "remove", "--force", dir) })
		bins := GinkgoT().TempDir()
		oldLy, newLy := filepath.Join(bins, "ly-from"), filepath.Join(bins, "ly-this")
		lyFrom(ctx, dir, oldLy)
		lyFrom(ctx, e2eutil.RepoRoot(), newLy)
		fmt.Fprintf(GinkgoWriter, "upgrade from %s (%s: %s) to this checkout (%s)\n", ref, commit[:12], git("log", "-1", "--format=%s", commit), git("rev-parse", "--short=12", "HEAD"))
		// Whatever happens, the cluster ends on this checkout's Lampyr for
		// the suites after this one.
		DeferCleanup(func(ctx SpecContext) { install(ctx, "restore", newLy) })

		took := map[string]time.Duration{}
		took["install earlier"] = install(ctx, "earlier", oldLy)
		// A Service of its own, deployed under the earlier version (stock
		// gets it too: the prober runs both sides; stock is not upgraded).
		deployBoth(ctx, "upgraded")
		took["earlier Home settled"] = homesSettled(ctx, "upgraded-00001")
		p := probe(ctx, "upgraded")
		steady(ctx)
		p.Phase("upgrading")
		took["upgrade"] = install(ctx, "upgrade", newLy)
		took["Home after upgrade"] = homesSettled(ctx, "upgraded-00001")
		p.Phase("upgraded")
		steady(ctx)
		p.Phase("downgrading")
		took["downgrade"] = install(ctx, "downgrade", oldLy)
		took["Home after downgrade"] = homesSettled(ctx, "upgraded-00001")
		p.Phase("downgraded")
		steady(ctx)
		r := finish(p, "upgrade-downgrade")
		var lines []string
		for _, k := range []string{"install earlier", "earlier Home settled", "upgrade", "Home after upgrade", "downgrade", "Home after downgrade"} {
			lines = append(lines, fmt.Sprintf("%s %s", k, took[k].Round(time.Second)))
		}
		fmt.Fprintf(GinkgoWriter, "timings: %s\n", strings.Join(lines, ", "))
		judge(r, fmt.Sprintf("upgrading from %s and downgrading again", ref))
	})
})
