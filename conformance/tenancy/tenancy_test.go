// Package tenancy is the hostile-tenant suite (docs/security.md, "Tested"):
// two tenants, each a user holding only the namespace `edit` role in a
// namespace that enforces Pod Security "restricted", deploy a Service and
// then try, through impersonating clients as a real user would, every
// attack of docs/security.md's table against the other tenant and the
// platform. Each attack runs on Lampyr (where it must be refused; a success
// fails the suite) and, where it applies, on stock Knative as a reference
// (a success there is reported, "reached: no defence in stock Knative", and
// never fails the suite). The table of attack / expected / observed goes to
// GinkgoWriter and _artifacts/tenancy/report.md.
//
// Managed mode only, on the harness (clusters/harness): it brings up the
// "lampyr" (Lampyr) and "stock" (stock Knative) Kind clusters as `just
// cluster-up` does, and deletes what it created unless LAMPYR_KEEP=1.
// LAMPYR_TENANCY_CLUSTERS names other clusters, each with its profile
// stated ("lampyr=lampyr-x,stock=stock-x"); a list without a stock cluster
// runs Lampyr alone and the stock column says so.
package tenancy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/impl/trust/seal"
)

// clustersVar names other clusters than the pair, each with its profile:
// "lampyr=NAME[,stock=NAME]"; without a stock cluster Lampyr runs alone
// and the stock column says so.
const clustersVar = "LAMPYR_TENANCY_CLUSTERS"

var suite = harness.New(harness.Config{
	Name:     "tenancy",
	Recipe:   "just test-tenancy",
	Clusters: harness.Paired(),
	Knobs:    []string{clustersVar, tarpitVar},
	Choose: func(o harness.Options) ([]harness.Cluster, error) {
		return chooseClusters(o.Knobs[clustersVar])
	},
	SetupTimeout:  90 * time.Minute,
	FinishTimeout: 15 * time.Minute,
})

func TestTenancy(t *testing.T) { suite.Run(t) }

var (
	_ = suite.Setup("sides from the clusters", func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		r, err := newRun(ctx)
		return harness.With(ctx, r), err
	})
	_ = suite.Setup("tenants, images, sealers, victims, the forged Home and the evil Services", setupTenancy)
	_ = suite.Finish("writing the report, restoring config-lampyr, deleting the tenants", finishTenancy)
)

const (
	nsA, nsB     = "tenancy-a", "tenancy-b"
	userA, userB = "tenant-a", "tenant-b"
	// victim is each tenant's Service; victimRev its first Revision.
	victim       = "victim"
	victimRev    = "victim-00001"
	fieldManager = "tenancy"
	handlerPkg   = "lampyr.dev/serving/fixtures/cmd/handler"
	attackerPkg  = "lampyr.dev/serving/fixtures/cmd/attacker"
	// roleLabel marks the Pods the suite itself runs in tenant namespaces
	// (attacker probes, the forged Home), so "no platform Pod runs in a
	// tenant namespace" can tell them apart.
	roleLabel = "tenancy.lampyr.dev/role"
	// helloBody is the fixture handler's answer to / without TARGET (Lampyr
	// runs it with the runtime contract's environment only).
	helloBody = "Hello World!\n"
)

// tenancyRun is the suite's state, made by setupTenancy and read by the
// specs through the suite's context.
type tenancyRun struct {
	lampyr, stock *side
	sides         []*side
	// stockOff: the run names no stock cluster.
	stockOff bool
	// The fixture handler as a Lampyr project and its snapshot build.
	project *ly.Project
	built   *ly.Built
	// rowSealer is authorized for the guard-rail rows that deploy a sealed
	// project (G6).
	rowSealer *seal.SealerKey
}

// the is the suite's state.
func the() *tenancyRun { return harness.State[*tenancyRun](suite) }

// side is one platform of the pair, as the administrator and the two
// tenants reach it.
type side struct {
	name     string // the cluster's name
	admin    *e2eutil.Clients
	gateway  string
	registry string
	a, b     *tenant
	// attacker is the attacker fixture's image.
	attacker string
	// forgedHome, forgedHomeIP: tenant-a's `attacker listen` Pod. It is the
	// forged Home of attack 8 and, everywhere, the control of the network
	// probes: a probe Pod that reaches it proves that a timeout elsewhere is
	// a defence, not a broken Pod network.
	forgedHome, forgedHomeIP string
	// podSecurity is the Pod Security level each tenant namespace enforces
	// (and, on stock, why it is not restricted when it is not).
	podSecurity map[string]string
	// err: the side could not be set up (stock only; Lampyr fails the
	// suite); its column says "not run".
	err error

	// Lampyr only, looked up by the administrator as a scanning attacker
	// would find them.
	routerIPs []string
	homeB     corev1.Pod
	// backend is config-lampyr's fiber-backend (process or gvisor).
	backend string
	// Stock only: a Pod of B's victim (min-scale 1 keeps one).
	victimPodB corev1.Pod

	// The guard-rail rows' handler image (guardrails_test.go, rowRepo),
	// or why it is missing (stock only: Lampyr fails the setup), and on
	// Lampyr its snapshot, mapped in config-lampyr.
	rowImage    string
	rowImageErr error
	rowSnapshot name.Digest
}

// tenant is one hostile (or victim) user of one side.
type tenant struct {
	ns, user string
	// c impersonates the user: every attack goes through it.
	c *e2eutil.Clients
	// runnable is the handler as a runnable image under <registry>/<ns>/handler.
	runnable string

	// Lampyr only.
	sealer   *seal.SealerKey // authorized for ns by the administrator
	snapshot name.Digest     // the handler's snapshot under <registry>/<ns>/handler-snapshot
	template name.Digest     // the victim's sealed template
	home     string          // status.home of the victim's CapacityGrant
	homeKey  string          // its status.homeKeySHA256: the key fiberd serves TLS with
}

func sealerName(ns string) string { return ns + "-deployer" }

// chooseClusters reads LAMPYR_TENANCY_CLUSTERS ("lampyr=NAME[,stock=NAME]",
// each cluster with its profile stated); empty, the pair.
func chooseClusters(v string) ([]harness.Cluster, error) {
	if v == "" {
		return harness.Paired(), nil
	}
	var st, la *harness.Cluster
	for _, kv := range strings.Split(v, ",") {
		profile, name, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%s: %q is not PROFILE=NAME (want lampyr=NAME[,stock=NAME])", clustersVar, kv)
		}
		switch profile {
		case clusters.ProfileStock:
			st = &harness.Cluster{Name: name, Profile: profile}
		case clusters.ProfileLampyr:
			la = &harness.Cluster{Name: name, Profile: profile}
		default:
			return nil, fmt.Errorf("%s: profile %q of %s: want stock or lampyr", clustersVar, profile, name)
		}
	}
	if la == nil {
		return nil, fmt.Errorf("%s names no lampyr cluster (want lampyr=NAME[,stock=NAME])", clustersVar)
	}
	if st == nil {
		return []harness.Cluster{*la}, nil
	}
	return []harness.Cluster{*st, *la}, nil
}

// newRun builds the sides from the harness's targets.
func newRun(ctx context.Context) (*tenancyRun, error) {
	r := &tenancyRun{lampyr: &side{}, stock: &side{}}
	for _, t := range harness.Targets(ctx) {
		s := r.stock
		if t.Profile == clusters.ProfileLampyr {
			s = r.lampyr
		}
		s.name, s.admin, s.gateway, s.registry = t.Name, t.Clients, t.Gateway, t.Registry
		s.podSecurity = map[string]string{}
	}
	if r.lampyr.admin == nil {
		return nil, errors.New("no lampyr-profile target")
	}
	r.sides = []*side{r.stock, r.lampyr}
	if r.stock.admin == nil {
		r.stockOff = true
		r.sides = []*side{r.lampyr}
		r.stock.err = fmt.Errorf("not requested (%s names no stock cluster)", clustersVar)
	}
	return r, nil
}

func setupTenancy(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	r := the()
	lampyr, stock, sides := r.lampyr, r.stock, r.sides
	env, err := harness.Env(ctx)
	if err != nil {
		return ctx, err
	}

	By("building the attacker and the handler as runnable images, per tenant repository")
	images := map[string]string{} // registry/repo -> pushed reference
	push := func(pkg, registry, repo string) string {
		k := registry + "/" + repo
		if ref, ok := images[k]; ok {
			return ref
		}
		ref, err := e2eutil.BuildAndPush(ctx, env.Cache, pkg, registry, repo, "tenancy")
		Expect(err).NotTo(HaveOccurred(), "building %s into %s", pkg, k)
		images[k] = ref
		return ref
	}
	for _, s := range sides {
		s.attacker = push(attackerPkg, s.registry, "tenancy/attacker")
		s.a = &tenant{ns: nsA, user: userA, runnable: push(handlerPkg, s.registry, nsA+"/handler")}
		s.b = &tenant{ns: nsB, user: userB, runnable: push(handlerPkg, s.registry, nsB+"/handler")}
	}
	fmt.Fprintf(GinkgoWriter, "attacker image %s; B's runnable handler %s\n", lampyr.attacker, lampyr.b.runnable)

	By("creating the tenant namespaces (Pod Security restricted) and binding each tenant user to `edit` in its own")
	for _, s := range sides {
		for _, t := range s.tenants() {
			Expect(s.admin.FreshNamespace(ctx, t.ns, 3*time.Minute)).To(Succeed())
			Expect(setPodSecurity(ctx, s.admin, t.ns, "restricted")).To(Succeed())
			s.podSecurity[t.ns] = "restricted"
			Expect(bindEdit(ctx, s.admin, t.ns, t.user)).To(Succeed())
			t.c, err = impersonate(s.admin, t.user)
			Expect(err).NotTo(HaveOccurred())
			// The RoleBinding reaches the authorizer's cache within moments.
			Eventually(func() error {
				_, err := t.c.Dynamic.Resource(e2eutil.KServices).Namespace(t.ns).List(ctx, metav1.ListOptions{})
				return err
			}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "%s listing Services in %s (its edit RoleBinding)", t.user, t.ns)
		}
	}

	// Stock is a reference: set it up alongside Lampyr, and if it fails,
	// its column says why instead of failing the suite.
	stockDone := make(chan error, 1)
	if r.stockOff {
		stockDone <- stock.err
	} else {
		go func() { stockDone <- setUpStock(ctx, stock) }()
	}

	By("building the handler's snapshot artifact (ly build) and pushing it under each tenant's repository")
	dir := filepath.Join(e2eutil.RepoRoot(), "fixtures/cmd/handler")
	project, err := ly.LoadProject(dir)
	Expect(err).NotTo(HaveOccurred())
	// Small grants: the suite keeps up to seven Services, each reserving
	// max-scale x memory of the installation's fiber capacity.
	two := int32(2)
	project.MaxScale = &two
	r.project = project
	built, err := ly.Build(ctx, dir, project, ly.BuildOptions{ArtifactDir: filepath.Join(GinkgoT().TempDir(), "artifact")})
	Expect(err).NotTo(HaveOccurred())
	r.built = built
	for _, t := range lampyr.tenants() {
		tag, err := ly.ParseImageTag(lampyr.registry + "/" + t.ns + "/handler-snapshot:victim")
		Expect(err).NotTo(HaveOccurred())
		pushed, err := ly.Push(ctx, built, tag)
		Expect(err).NotTo(HaveOccurred())
		t.snapshot = pushed.Ref
	}

	By("authorizing one sealer identity per tenant (the administrator, docs/security.md §2)")
	entries := map[string]string{}
	for _, t := range lampyr.tenants() {
		// The tenant generates its identity and hands over the public half.
		t.sealer, err = seal.GenerateSealerKey()
		Expect(err).NotTo(HaveOccurred())
		v, err := seal.FormatSealer(seal.TrustedSealer{Name: sealerName(t.ns), Key: t.sealer.Public(), Namespaces: []string{t.ns}})
		Expect(err).NotTo(HaveOccurred())
		entries[sealerName(t.ns)] = v
	}
	Expect(editConfigMap(ctx, lampyr.admin, contract.SystemNamespace, sealersConfigMap, true, func(d map[string]string) {
		for k, v := range entries {
			d[k] = v
		}
	})).To(Succeed())

	By("guard-rail rows: the handler image under " + rowRepo + " on each cluster, mapped to its snapshot in config-lampyr; their sealer authorized")
	Expect(setupGuardRails(ctx, r)).To(Succeed())

	By(fmt.Sprintf("setting the suite's CPU operating point in config-lampyr (home-cpu-limit %s, fiber-cpu-limit %s; put back after)", suiteHomeCPULimit, suiteFiberCPULimit))
	Expect(setSuiteCPULimits(ctx, lampyr.admin)).To(Succeed())

	By("each tenant deploys its victim Service as itself: seal the template, push it, apply the Service")
	for _, t := range lampyr.tenants() {
		inst, err := readInstallation(ctx, t.c)
		Expect(err).NotTo(HaveOccurred(), "%s reading the public fleet key and config-lampyr", t.user)
		t.template, err = sealAndPush(ctx, inst, t.sealer, t.ns, victimRev, t.snapshot)
		Expect(err).NotTo(HaveOccurred())
		u := lampyrService(victim, t.ns, t.snapshot.String(), t.snapshot.String(), t.template.String())
		Expect(t.c.Apply(ctx, e2eutil.KServices, u, fieldManager)).To(Succeed(), "%s applying its Service", t.user)
	}
	waitVictims(ctx, lampyr, 5*time.Minute)

	By("looking up, as the administrator, what a scanning attacker would find: Home names, B's Home Pod, fiber-router Pods")
	for _, t := range lampyr.tenants() {
		g, err := lampyr.admin.Dynamic.Resource(contract.CapacityGrants).Namespace(t.ns).Get(ctx, victimRev, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		t.home, _, _ = unstructured.NestedString(g.Object, "status", "home")
		Expect(t.home).NotTo(BeEmpty(), "CapacityGrant %s/%s has no status.home", t.ns, victimRev)
		t.homeKey, _, _ = unstructured.NestedString(g.Object, "status", "homeKeySHA256")
		Expect(t.homeKey).NotTo(BeEmpty(), "CapacityGrant %s/%s has no status.homeKeySHA256 (the Home's TLS key)", t.ns, victimRev)
	}
	homes, err := e2eutil.HomePods(ctx, lampyr.admin, nsB, victimRev)
	Expect(err).NotTo(HaveOccurred())
	for _, p := range homes.Items {
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			lampyr.homeB = p
		}
	}
	Expect(lampyr.homeB.Name).NotTo(BeEmpty(), "no running Home Pod of %s/%s (selector %s)", nsB, victimRev, e2eutil.HomeSelector(nsB, victimRev))
	routers, err := lampyr.admin.Kube.CoreV1().Pods(contract.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=fiber-router"})
	Expect(err).NotTo(HaveOccurred())
	for _, p := range routers.Items {
		if p.Status.PodIP != "" {
			lampyr.routerIPs = append(lampyr.routerIPs, p.Status.PodIP)
		}
	}
	Expect(lampyr.routerIPs).NotTo(BeEmpty(), "no fiber-router Pod with an IP")
	fmt.Fprintf(GinkgoWriter, "Homes: A %s, B %s (Pod %s, %s); fiber-router Pods %v\n", lampyr.a.home, lampyr.b.home, lampyr.homeB.Name, lampyr.homeB.Status.PodIP, lampyr.routerIPs)

	lampyr.backend = fiberBackend(ctx, lampyr)
	fmt.Fprintf(GinkgoWriter, "fibers run on the %s backend\n", lampyr.backend)

	By("tenant-a starts its forged Home (attacker listen) in its own namespace")
	Expect(startForgedHome(ctx, lampyr)).To(Succeed())

	By("each tenant deploys the malicious handler (fixtures/cmd/evil) as its Service " + evilSvc)
	Expect(deployEvil(ctx, lampyr)).To(Succeed())

	if err := <-stockDone; err != nil {
		stock.err = err
		fmt.Fprintf(GinkgoWriter, "stock reference not available, its column will say so: %v\n", err)
	}
	return ctx, nil
}

// setUpStock deploys the stock side's victims as the tenants and starts the
// forged Home. Errors, not assertions: the stock side is a reference.
func setUpStock(ctx context.Context, stock *side) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("setting up stock: %v", p)
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, t := range stock.tenants() {
		wg.Go(func() { errs[i] = deployStockVictim(ctx, stock, t) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	pods, err := stock.admin.Kube.CoreV1().Pods(nsB).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=" + victim})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			stock.victimPodB = p
		}
	}
	if stock.victimPodB.Name == "" {
		return fmt.Errorf("no running Pod of %s/%s despite min-scale 1", nsB, victim)
	}
	return startForgedHome(ctx, stock)
}

func finishTenancy(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	r, ok := harness.Value[*tenancyRun](ctx)
	if !ok {
		return ctx, nil
	}
	lampyr := r.lampyr
	finishGuardRails(ctx, r)
	if len(snapshotResults()) > 0 {
		if err := writeReport(); err != nil {
			fmt.Fprintf(GinkgoWriter, "writing the report: %v\n", err)
		}
	}
	if lampyr.admin != nil {
		// Attack 11 restores it itself; this is the net under it.
		if err := restoreImageSnapshots(ctx, lampyr.admin); err != nil {
			fmt.Fprintf(GinkgoWriter, "restoring config-lampyr image-snapshots: %v\n", err)
		}
	}
	if suite.Options().Keep {
		fmt.Fprintf(GinkgoWriter, "%s=1: namespaces %s, %s, the sealer entries and config-lampyr's CPU limits (%s, %s) left in place\n", suite.Options().KeepVar, nsA, nsB, suiteHomeCPULimit, suiteFiberCPULimit)
		return ctx, nil
	}
	for _, s := range r.sides {
		if s.admin == nil {
			continue
		}
		for _, ns := range []string{nsA, nsB} {
			if err := s.admin.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				fmt.Fprintf(GinkgoWriter, "%s: deleting namespace %s: %v\n", s.name, ns, err)
			}
		}
	}
	if lampyr.admin != nil {
		err := editConfigMap(ctx, lampyr.admin, contract.SystemNamespace, sealersConfigMap, false, func(d map[string]string) {
			delete(d, sealerName(nsA))
			delete(d, sealerName(nsB))
		})
		if err != nil {
			fmt.Fprintf(GinkgoWriter, "removing the tenants' sealer entries: %v\n", err)
		}
		if err := restoreCPULimits(ctx, lampyr.admin); err != nil {
			fmt.Fprintf(GinkgoWriter, "restoring config-lampyr's CPU limits: %v\n", err)
		}
	}
	return ctx, nil
}

func (s *side) tenants() []*tenant { return []*tenant{s.a, s.b} }

// impersonate returns clients that act as user, a member of
// system:authenticated only, as a real user's kubeconfig would.
func impersonate(admin *e2eutil.Clients, user string) (*e2eutil.Clients, error) {
	cfg := rest.CopyConfig(admin.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	return e2eutil.ClientsFor(cfg)
}

// bindEdit gives user the built-in `edit` ClusterRole in ns, and nothing
// else: docs/security.md's tenant.
func bindEdit(ctx context.Context, admin *e2eutil.Clients, ns, user string) error {
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-edit", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	_, err := admin.Kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("binding %s to edit in %s: %w", user, ns, err)
	}
	return nil
}

// installation is what a tenant reads of the Lampyr installation to seal
// templates: the two ConfigMaps every authenticated user may get.
type installation struct {
	fleet        *seal.PublicKey
	templateRepo string
}

func readInstallation(ctx context.Context, c *e2eutil.Clients) (*installation, error) {
	cms := c.Kube.CoreV1().ConfigMaps(contract.SystemNamespace)
	key, err := cms.Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	fleet, err := seal.ParsePublicKeyPEM([]byte(key.Data[contract.FleetPublicKeyKey]))
	if err != nil {
		return nil, err
	}
	cfg, err := cms.Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	repo := strings.TrimSpace(cfg.Data[lampyrconfig.KeyTemplateRepository])
	if repo == "" {
		return nil, fmt.Errorf("config-lampyr has no %s", lampyrconfig.KeyTemplateRepository)
	}
	return &installation{fleet: fleet, templateRepo: repo}, nil
}

// sealAndPush seals, with sealer, a template claiming namespace claimNS and
// Revision rev for snapshot, and pushes it to the template repository as
// `ly deploy` would. The tag carries the claimed namespace; a Revision names
// the digest, so the tag decides nothing.
func sealAndPush(ctx context.Context, in *installation, sealer *seal.SealerKey, claimNS, rev string, snapshot name.Digest) (name.Digest, error) {
	sealed, err := seal.Seal(in.fleet, sealer, seal.NewTemplate(claimNS, rev, snapshot.DigestStr(), the().project.Policy(), the().built.Config))
	if err != nil {
		return name.Digest{}, err
	}
	return artifact.PushTemplate(ctx, sealed, in.templateRepo, claimNS, rev, in.fleet.KeyID())
}

// lampyrService is the Service `ly deploy` would apply (public: reachable
// through the gateway by its host name).
func lampyrService(svc, ns, image, snapshot, template string) *unstructured.Unstructured {
	p := *the().project
	p.Name = svc
	return ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: image, Snapshot: snapshot, Template: template, Public: true})
}

// waitVictims waits for both tenants' Lampyr victim Services to be Ready
// and to answer through the gateway.
func waitVictims(ctx context.Context, s *side, timeout time.Duration) {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, t := range s.tenants() {
		wg.Go(func() { _, errs[i] = t.c.WaitReady(ctx, e2eutil.KServices, t.ns, victim, timeout) })
	}
	wg.Wait()
	Expect(errors.Join(errs...)).NotTo(HaveOccurred(), "%s: the tenants' victim Services", s.name)
	for _, t := range s.tenants() {
		Eventually(func() (string, error) {
			code, body, _, err := e2eutil.Get(ctx, s.gateway, host(victim, t.ns), "/")
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d: %s", code, body)
			}
			return body, err
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(helloBody), "%s: %s/%s through the gateway", s.name, t.ns, victim)
	}
}

func host(svc, ns string) string { return svc + "." + ns + "." + clusters.Domain }
