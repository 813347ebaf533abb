package operations

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/progress"
)

// opsUpgradeFrom names the earlier Lampyr the upgrade scenario installs
// first (a git ref of this repository); default: the parent of the newest
// commit that changed impl/ other than its tests and documents, so the two
// differ in the product (a commit that changed only a test builds the same
// images, and the "upgrade" would change nothing). The scenario fails if
// the two install the same images.
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
		last := git("rev-list", "-n", "1", "HEAD", "--", "impl", ":(exclude,glob)impl/**/*_test.go", ":(exclude,glob)impl/**/*.md", ":(exclude,glob)impl/**/testdata/**")
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

// installLampyr runs `ly cluster install` (its own checkout's images and
// manifests) against the Lampyr cluster and returns how long it took.
func installLampyr(ctx context.Context, what, ly string) time.Duration {
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

// lampyrImages is every image the Lampyr installation runs: its system
// Deployments' containers and the Home image.
func lampyrImages(ctx context.Context) map[string]string {
	s := the().lampyr
	out := map[string]string{}
	l, err := s.Clients.Kube.AppsV1().Deployments(contract.SystemNamespace).List(ctx, metav1.ListOptions{})
	Expect(err).NotTo(HaveOccurred())
	for _, d := range l.Items {
		for _, c := range d.Spec.Template.Spec.Containers {
			out[d.Name+"/"+c.Name] = c.Image
		}
	}
	img, err := homeImage(ctx)
	Expect(err).NotTo(HaveOccurred())
	out["home"] = img
	return out
}

// changedImages lists what differs between two lampyrImages.
func changedImages(before, after map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if before[k] != after[k] {
			out = append(out, k)
		}
	}
	return out
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
func homesSettled(ctx context.Context, namespace, rev string) time.Duration {
	s := the().lampyr
	start := time.Now()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		want, err := homeImage(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		l, err := e2eutil.HomePods(ctx, s.Clients, namespace, rev)
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
			if ready && p.DeletionTimestamp == nil && p.Spec.Containers[0].Image == want && p.Name == resources.HomeNameFor(namespace, rev) {
				settled++
			}
		}
		last = strings.Join(states, "; ")
		// A replaced Home may still drain a stream under way.
		return settled == 1 && live == 1 && want != "", nil
	})
	Expect(err).NotTo(HaveOccurred(), "the Home of %s/%s did not settle on the installed image: %s", namespace, rev, last)
	return time.Since(start)
}

// installStock installs stock Knative Serving at version on the stock
// cluster (knative.PreviousServingVersion or the pinned one), with the
// networking provider it runs, and returns how long it took.
func installStock(ctx context.Context, what, version string) time.Duration {
	s := the().stock
	env, err := harness.Env(suite.Context())
	Expect(err).NotTo(HaveOccurred())
	log, err := os.Create(filepath.Join(suite.Artifacts(), "upgrade-stock-"+what+".log"))
	Expect(err).NotTo(HaveOccurred())
	defer log.Close()
	inst := *env.Installer()
	inst.Log, inst.StockServingVersion = progress.New(log), version
	start := time.Now()
	err = inst.Install(ctx, install.Cluster{Name: s.Name, Kubeconfig: s.Kubeconfig, NodePort: s.Info.Gateway().NodePort}, install.ProfileStock, s.Provider)
	Expect(err).NotTo(HaveOccurred(), "%s: installing stock Knative Serving %s failed; its output: %s", what, version, log.Name())
	for _, dep := range []string{"controller", "activator", "autoscaler", "webhook"} {
		waitRolledOut(ctx, s, knative.Namespace, dep)
	}
	return time.Since(start)
}

// tenantB is the second tenant's namespace in the upgrade scenario: issue
// 33 asks for Services of two tenants serving through it.
const tenantB = "operations-b"

var _ = Describe("upgrades", Label("cluster", "operations", "upgrade"), Ordered, func() {
	It("installs an earlier Lampyr (stock: the previous Knative minor), serves two tenants' Services, upgrades to this checkout and downgrades again without a failed request", func(ctx SpecContext) {
		ref, commit := upgradeFrom()
		dir := filepath.Join(GinkgoT().TempDir(), "from")
		git("worktree", "add", "--detach", dir, commit)
		DeferCleanup(func() { git("worktree", "remove", "--force", dir) })
		bins := GinkgoT().TempDir()
		oldLy, newLy := filepath.Join(bins, "ly-from"), filepath.Join(bins, "ly-this")
		lyFrom(ctx, dir, oldLy)
		lyFrom(ctx, e2eutil.RepoRoot(), newLy)
		fmt.Fprintf(GinkgoWriter, "lampyr: upgrade from %s (%s: %s) to this checkout (%s)\n", ref, commit[:12], git("log", "-1", "--format=%s", commit), git("rev-parse", "--short=12", "HEAD"))
		fmt.Fprintf(GinkgoWriter, "stock: upgrade from Knative Serving %s to %s (the reference)\n", knative.PreviousServingVersion, knative.ServingVersion)
		// Whatever happens, both clusters end on this checkout's versions
		// for the suites after this one.
		DeferCleanup(func(ctx SpecContext) {
			installLampyr(ctx, "restore", newLy)
			installStock(ctx, "restore", knative.ServingVersion)
		})
		for _, s := range the().sides {
			Expect(s.Clients.FreshNamespace(ctx, tenantB, 3*time.Minute)).To(Succeed())
		}

		took := map[string]time.Duration{}
		took["lampyr: install earlier"] = installLampyr(ctx, "earlier", oldLy)
		took["stock: install earlier"] = installStock(ctx, "earlier", knative.PreviousServingVersion)
		// Two tenants' Services, deployed under the earlier versions.
		deployBoth(ctx, "upgraded")
		deployBothIn(ctx, tenantB, "upgraded")
		settle := func(step string) {
			took[step+" ("+ns+")"] = homesSettled(ctx, ns, "upgraded-00001")
			took[step+" ("+tenantB+")"] = homesSettled(ctx, tenantB, "upgraded-00001")
		}
		settle("lampyr: earlier Homes settled")
		p := probeAll(ctx, types.NamespacedName{Namespace: ns, Name: "upgraded"}, types.NamespacedName{Namespace: tenantB, Name: "upgraded"})
		steady(ctx)
		p.Phase("upgrading")
		earlier := lampyrImages(ctx)
		took["lampyr: upgrade"] = installLampyr(ctx, "upgrade", newLy)
		changed := changedImages(earlier, lampyrImages(ctx))
		fmt.Fprintf(GinkgoWriter, "lampyr: the upgrade changed the images of %v\n", changed)
		Expect(changed).NotTo(BeEmpty(), "%s and this checkout install the same images: the upgrade changed nothing; set %s to an earlier ref", ref, opsUpgradeFrom)
		settle("lampyr: Homes after upgrade")
		took["stock: upgrade"] = installStock(ctx, "upgrade", knative.ServingVersion)
		p.Phase("upgraded")
		steady(ctx)
		p.Phase("downgrading")
		took["lampyr: downgrade"] = installLampyr(ctx, "downgrade", oldLy)
		settle("lampyr: Homes after downgrade")
		took["stock: downgrade"] = installStock(ctx, "downgrade", knative.PreviousServingVersion)
		p.Phase("downgraded")
		steady(ctx)
		r := finish(p, "upgrade-downgrade")
		var lines []string
		for _, k := range slices.Sorted(maps.Keys(took)) {
			lines = append(lines, fmt.Sprintf("%s %s", k, took[k].Round(time.Second)))
		}
		fmt.Fprintf(GinkgoWriter, "timings:\n  %s\n", strings.Join(lines, "\n  "))
		judge(r, fmt.Sprintf("upgrading from %s and downgrading again", ref))
	})
})
