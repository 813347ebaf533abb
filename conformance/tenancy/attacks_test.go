package tenancy

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/seal"
)

// platforms an attack applies to.
type platforms int

const (
	onLampyr platforms = 1 << iota
	onStock
	onBoth = onLampyr | onStock
)

// attack is one row of the table: what tenant-a tries, what Lampyr must
// answer, and how to try it on one side. run returns what it observed and
// whether the attempt was refused (for a control: whether the path it
// proves open was not). It may abortf when it could not be carried out.
type attack struct {
	name      string
	appliesTo platforms
	expected  string
	// control rows prove a path works (so the refusals around them mean
	// something): on Lampyr they fail when refused.
	control bool
	// timeout bounds the It (default 8 minutes).
	timeout time.Duration
	run     func(ctx context.Context, s *side) (observed string, refused bool)

	// Guard-rail rows (guardrails_test.go) also say:
	// parity: stock must come to the same verdict as Lampyr; a difference
	// fails the row instead of being reported. runParity replaces run
	// where the verdict is more than refused or not (which Services were
	// Ready).
	parity    bool
	runParity func(ctx context.Context, s *side) (observed, verdict string, refused bool)
	// tags are extra Ginkgo labels (guardrails, tarpit, quota ...).
	tags []string
	// onGVisor, where set, replaces expected and run on a Lampyr whose
	// fibers run on the gvisor backend (gvisor_test.go): the handler's
	// calls are served by gVisor's kernel, so the row judges what reaches
	// the host.
	onGVisor *variant
	// withoutDefence says how the row fails when its defence is removed
	// (printed with the row and under the report's table).
	withoutDefence string
}

// labels select an attack by its row (attack-7c), by what it tries (a
// fiber's own attempts, controls) and by where it runs (stock-reference:
// it also runs on stock).
func (a attack) labels(fiber bool) Labels {
	ls := Labels{"attack-" + strings.Fields(a.name)[0]}
	if fiber {
		ls = append(ls, "fiber")
	}
	if a.control {
		ls = append(ls, "control")
	}
	if a.appliesTo&onStock != 0 {
		ls = append(ls, "stock-reference")
	}
	if a.parity {
		ls = append(ls, "parity")
	}
	return append(ls, a.tags...)
}

// B's selection headers: how fiber-router and Knative's activator pick a
// Revision.
var selectB = []string{"Knative-Serving-Namespace: " + nsB, "Knative-Serving-Revision: " + victimRev}

var attacks = []attack{
	{
		name:      "0 tenant namespaces enforce Pod Security restricted and every victim Service runs",
		appliesTo: onBoth, control: true,
		expected: "restricted in both; victims Ready; no platform Pod in them (Lampyr: only gated quota Pods and egress Pods, holding no Secret or token)",
		run:      checkTenantNamespaces,
	},
	{
		name:      "1a A reads every Secret and ConfigMap in its own namespace",
		appliesTo: onBoth,
		expected:  "no Lampyr key or token",
		run:       readOwnNamespace,
	},
	{
		name:      "1b administrator: no Secret outside lampyr-system and lampyr-homes holds a Lampyr key or token",
		appliesTo: onLampyr,
		expected:  "none found",
		run:       sweepSecrets,
	},
	{
		name:      "2 A reads Secrets and ConfigMaps in lampyr-system and lampyr-homes",
		appliesTo: onLampyr,
		expected:  "Forbidden (but lampyr-fleet-key, config-lampyr ConfigMaps)",
		run:       readPlatformNamespaces,
	},
	{
		name:      "3a A creates a CapacityGrant, or writes its own grant's status",
		appliesTo: onLampyr,
		expected:  "Forbidden",
		run:       forgeGrant,
	},
	{
		name:      "3b A creates a KIngress claiming B's host",
		appliesTo: onBoth,
		expected:  "Forbidden",
		run:       forgeKIngress,
	},
	{
		name:      "3c A creates a Pod in lampyr-homes",
		appliesTo: onLampyr,
		expected:  "Forbidden",
		run:       podInHomes,
	},
	{
		name:      "3d A labels its namespace as a gateway namespace (lampyr.dev/gateway=true)",
		appliesTo: onLampyr,
		expected:  "Forbidden",
		run:       labelGatewayNamespace,
	},
	{
		name:      "4 A runs a privileged Pod in its namespace",
		appliesTo: onBoth,
		expected:  "Forbidden by Pod Security",
		run:       privilegedPod,
	},
	{
		name:      "5a from a Pod, A calls fiber-router (stock: the activator) with B's selection headers",
		appliesTo: onBoth,
		expected:  "no answer (timeout or refused)",
		run:       callRouterAsB,
	},
	{
		name:      "5b A smuggles selection headers through the gateway in a request to its own Service",
		appliesTo: onBoth,
		expected:  "5/5 answered by A's own handler (the gateway sets the headers)",
		run:       smuggleSelection,
	},
	{
		name:      "6a from a Pod, A calls B's Home API on 9090 (stock: B's Pod)",
		appliesTo: onBoth,
		expected:  "no answer (timeout or refused)",
		run:       callHome,
	},
	{
		name:      "6b from a Pod, A calls fiber-router's admin port 9091 (stock: the activator's metrics)",
		appliesTo: onBoth,
		expected:  "no answer (timeout or refused)",
		run:       callRouterAdmin,
	},
	{
		name:      "7a B's Home, port-forwarded: no credential",
		appliesTo: onLampyr,
		expected:  "401 missing bearer credential",
		run: func(ctx context.Context, s *side) (string, bool) {
			return homeVerdict(homeCall(ctx, s, ""))
		},
	},
	{
		name:      "7b B's Home, port-forwarded: tenant-a's service-account token",
		appliesTo: onLampyr,
		expected:  "401 credential refused: not a router credential",
		run: func(ctx context.Context, s *side) (string, bool) {
			return homeVerdict(homeCall(ctx, s, serviceAccountToken(ctx, s)))
		},
	},
	{
		name:      "7c B's Home, port-forwarded: a real router credential minted for A's Home",
		appliesTo: onLampyr,
		expected:  "401 credential refused: … for another Home",
		run: func(ctx context.Context, s *side) (string, bool) {
			return homeVerdict(homeCall(ctx, s, mint(routerKey(ctx, s), s.a.home)))
		},
	},
	{
		name:      "7d control: B's Home, port-forwarded: a router credential minted for B's Home",
		appliesTo: onLampyr, control: true,
		expected: "200",
		run: func(ctx context.Context, s *side) (string, bool) {
			code, msg := homeCall(ctx, s, mint(routerKey(ctx, s), s.b.home))
			return fmt.Sprintf("%d %s", code, short(msg, 60)), code != 200
		},
	},
	{
		name:      "7e B's Home, port-forwarded: a credential for B's Home signed with a key A generated",
		appliesTo: onLampyr,
		expected:  "401 credential refused: signature does not verify",
		run: func(ctx context.Context, s *side) (string, bool) {
			_, own, err := ed25519.GenerateKey(rand.Reader)
			must(err, "generating A's key")
			return homeVerdict(homeCall(ctx, s, mint(own, s.b.home)))
		},
	},
	{
		// How a spare Home gets its grant (docs/security.md §1 "Spare
		// Homes"). A's own grant, valid and signed, as if it had leaked
		// (the administrator reads it from A's Home Secret): fiberd takes
		// only a grant naming its own key, and never a second Revision.
		name:      "7f B's Home, port-forwarded: A's own signed grant pushed to it (PUT /v1/grant, as a spare Home is given its grant)",
		appliesTo: onLampyr,
		expected:  "403 grant refused: the grant names home key … but fiberd serves with …",
		run: func(ctx context.Context, s *side) (string, bool) {
			code, msg := homeRequest(ctx, s, http.MethodPut, "/v1/grant", "", grantOf(ctx, s, s.a))
			return fmt.Sprintf("%d %s", code, short(msg, 100)), code == http.StatusForbidden || code == http.StatusConflict
		},
	},
	{
		name:      "8 A writes router metadata in its namespace pointing A's and B's Revisions at its forged Home",
		appliesTo: onLampyr,
		expected:  "40/40 answered by the handlers; forged Home sees 0",
		run:       forgeRouterMetadata,
	},
	{
		name:      "9 A replays B's template and snapshot annotations in its own Service",
		appliesTo: onLampyr, timeout: 10 * time.Minute,
		expected: "ContainerHealthy=False TemplateMismatch (namespace); never served",
		run:      replayB,
	},
	{
		name:      "10a A seals a template for B's snapshot with a key it generated",
		appliesTo: onLampyr, timeout: 10 * time.Minute,
		expected: "ContainerHealthy=False TemplateUnauthenticated",
		run:      sealWithOwnKey,
	},
	{
		name:      "10b A seals, with its authorized key, a template claiming namespace tenancy-b",
		appliesTo: onLampyr, timeout: 10 * time.Minute,
		expected: "ContainerHealthy=False TemplateNotAuthorized (or TemplateMismatch)",
		run:      sealForB,
	},
	{
		name:      "11 A copies B's mapped image into its repository and deploys it without Lampyr annotations",
		appliesTo: onLampyr, timeout: 15 * time.Minute,
		expected: "Ready=False MissingSnapshotArtifact (B's own mapped image runs)",
		run:      copyMappedImage,
	},
	{
		name:      "12 A maps a domain the platform granted it to an ExternalName Service of its own pointing at kube-dns's metrics port (DomainMapping ref: a core Service), so the gateway would dial it",
		appliesTo: onBoth,
		expected:  "the same DomainMapping path to A's own Pod answers 200 (control); the ExternalName one never answers 200",
		run:       domainMappingExternalName,
		withoutDefence: "Traefik's Gateway API provider, as built here, follows an ExternalName backend only to the " +
			"local gateway's own Service (impl/build/stubs.TraefikGatewayExternalName, which serves Routes' " +
			"placeholders behind DomainMappings) and refuses every other one; a gateway that dials any ExternalName " +
			"(traefik#13050's option, docs/networking.md declines it) answers 200 with kube-dns's coredns_ metrics " +
			"through A's domain",
	},
}

var _ = Describe("hostile tenant", Label("cluster", "tenancy"), Ordered, ContinueOnFailure, func() {
	for i, a := range append(append([]attack{}, attacks...), fiberAttacks...) {
		It(a.name, a.labels(i >= len(attacks)), func(ctx SpecContext) { runRow(ctx, a) }, NodeTimeout(a.nodeTimeout()))
	}

	AfterAll(func() {
		fmt.Fprint(GinkgoWriter, "\n"+renderReport(reportHeader(), snapshotResults()))
	})
})

func (a attack) nodeTimeout() time.Duration {
	if a.timeout == 0 {
		return 8 * time.Minute
	}
	return a.timeout
}

// runRow tries a on each side it applies to, adds it to the report, and
// judges Lampyr: refused (a control: not refused), and for a parity row
// the same verdict as stock.
func runRow(ctx SpecContext, a attack) {
	a = a.on(the().lampyr.backend)
	r := &result{attack: a}
	addResult(r)
	var wg sync.WaitGroup
	lampyr, stock := the().lampyr, the().stock
	if a.appliesTo&onLampyr != 0 {
		wg.Go(func() { r.lampyr = attempt(ctx, a, lampyr) })
	}
	if a.appliesTo&onStock != 0 {
		if stock.err != nil {
			r.stock = outcome{ran: true, err: "stock not set up: " + stock.err.Error()}
		} else {
			wg.Go(func() { r.stock = attempt(ctx, a, stock) })
		}
	}
	wg.Wait()
	fmt.Fprintf(GinkgoWriter, "%s\n  expected: %s\n  lampyr:   %s\n  stock:    %s\n", a.name, a.expected, r.lampyrCell(), r.stockCell())
	if a.withoutDefence != "" {
		fmt.Fprintf(GinkgoWriter, "  without its defence: %s\n", a.withoutDefence)
	}
	if err := writeReport(); err != nil {
		fmt.Fprintf(GinkgoWriter, "writing the report: %v\n", err)
	}
	if a.appliesTo&onLampyr == 0 {
		return
	}
	Expect(r.lampyr.err).To(BeEmpty(), "%s: could not be carried out on Lampyr, so it proves nothing", a.name)
	if a.control {
		Expect(r.lampyr.refused).To(BeFalse(), "control %q failed on Lampyr (%s): the refusals it backs prove nothing", a.name, r.lampyr.observed)
	} else {
		Expect(r.lampyr.refused).To(BeTrue(), "attack %q succeeded on Lampyr: %s (expected %s)", a.name, r.lampyr.observed, a.expected)
	}
	if differs, why := r.parityDiffers(); differs {
		Fail(fmt.Sprintf("parity row %q: %s", a.name, why))
	}
}

// attempt runs a on s, turning an abortf (or any panic: this runs on its
// own goroutine) into a "not run" outcome.
func attempt(ctx context.Context, a attack, s *side) (o outcome) {
	o.ran = true
	defer func() {
		if p := recover(); p != nil {
			if ie, ok := p.(inconclusive); ok {
				o.err = ie.msg
				return
			}
			o.err = fmt.Sprintf("panic: %v", p)
			fmt.Fprintf(GinkgoWriter, "%s on %s panicked: %v\n%s", a.name, s.name, p, debug.Stack())
		}
	}()
	if a.runParity != nil {
		o.observed, o.verdict, o.refused = a.runParity(ctx, s)
		return o
	}
	o.observed, o.refused = a.run(ctx, s)
	return o
}

// ---- 0 ----

// notAllowedInTenantNS says why Pod p, not one of the suite's own, may not
// be in a tenant namespace on Lampyr ("" when it may). Two platform Pods
// live there by design (docs/security.md): a Revision's quota Pod, which
// its namespace's ResourceQuota and LimitRange count and the scheduler
// never places, and the namespace's egress Pod, from which its fibers'
// connections leave. Neither may hold a Secret, a projected volume or a
// service-account token: no key sits in a tenant namespace.
func notAllowedInTenantNS(p *corev1.Pod) string {
	for _, v := range p.Spec.Volumes {
		if v.Secret != nil || v.Projected != nil {
			return "mounts volume " + v.Name + " (a Secret or projected token)"
		}
	}
	if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
		return "may mount a service-account token (automountServiceAccountToken not false)"
	}
	switch p.Labels[contract.ComponentLabel] {
	case contract.QuotaPodComponent:
		gated := slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == contract.QuotaPodGate })
		if !gated || p.Spec.NodeName != "" {
			return fmt.Sprintf("a quota Pod that can run (gate %s: %v, node %q)", contract.QuotaPodGate, gated, p.Spec.NodeName)
		}
		return ""
	case contract.EgressComponent:
		if p.Labels[contract.ManagedByLabel] != contract.GrantControllerName {
			return "an egress Pod not made by the grant controller"
		}
		return ""
	}
	return fmt.Sprintf("neither a quota Pod nor an egress Pod (labels %v)", p.Labels)
}

func checkTenantNamespaces(ctx context.Context, s *side) (string, bool) {
	var levels, problems []string
	platformPods := 0
	for _, t := range s.tenants() {
		ns, err := s.admin.Kube.CoreV1().Namespaces().Get(ctx, t.ns, metav1.GetOptions{})
		must(err, "reading namespace "+t.ns)
		enforced := ns.Labels["pod-security.kubernetes.io/enforce"]
		levels = append(levels, t.ns+": "+enforced)
		if s == the().lampyr && enforced != "restricted" {
			problems = append(problems, t.ns+" enforces "+enforced)
		}
		u, err := t.c.Dynamic.Resource(e2eutil.KServices).Namespace(t.ns).Get(ctx, victim, metav1.GetOptions{})
		if err != nil || !e2eutil.IsReady(u) {
			problems = append(problems, t.ns+"/"+victim+" not Ready")
		}
		pods, err := s.admin.Kube.CoreV1().Pods(t.ns).List(ctx, metav1.ListOptions{LabelSelector: "!" + roleLabel})
		must(err, "listing Pods in "+t.ns)
		platformPods += len(pods.Items)
		if s == the().lampyr {
			for _, p := range pods.Items {
				if why := notAllowedInTenantNS(&p); why != "" {
					problems = append(problems, "platform Pod "+t.ns+"/"+p.Name+": "+why)
				}
			}
		}
	}
	obs := strings.Join(levels, ", ")
	if s == the().stock {
		for _, t := range s.tenants() {
			if v := s.podSecurity[t.ns]; v != "restricted" {
				obs += "; " + t.ns + " " + v
			}
		}
		obs += fmt.Sprintf("; victims Ready; %d Knative Pods in them", platformPods)
	} else {
		obs += "; victims Ready; no platform Pod in them but quota Pods (gated, unscheduled) and egress Pods, none with a Secret or token"
	}
	if len(problems) > 0 {
		return strings.Join(problems, "; "), true
	}
	return obs, false
}

// ---- 1 ----

func readOwnNamespace(ctx context.Context, s *side) (string, bool) {
	t := s.a
	secrets, err := t.c.Kube.CoreV1().Secrets(t.ns).List(ctx, metav1.ListOptions{})
	must(err, "tenant-a listing its Secrets")
	cms, err := t.c.Kube.CoreV1().ConfigMaps(t.ns).List(ctx, metav1.ListOptions{})
	must(err, "tenant-a listing its ConfigMaps")
	var found []string
	for _, sec := range secrets.Items {
		for k, v := range sec.Data {
			if why := lampyrMaterial(k, v, true, nil); why != "" {
				found = append(found, "Secret "+sec.Name+"/"+k+": "+why)
			}
		}
	}
	for _, cm := range cms.Items {
		for k, v := range cm.Data {
			if why := lampyrMaterial(k, []byte(v), true, nil); why != "" {
				found = append(found, "ConfigMap "+cm.Name+"/"+k+": "+why)
			}
		}
		for k, v := range cm.BinaryData {
			if why := lampyrMaterial(k, v, true, nil); why != "" {
				found = append(found, "ConfigMap "+cm.Name+"/"+k+": "+why)
			}
		}
	}
	if len(found) > 0 {
		return "found " + strings.Join(found, "; "), false
	}
	return fmt.Sprintf("%d Secrets, %d ConfigMaps: no Lampyr key or token", len(secrets.Items), len(cms.Items)), true
}

// lampyrSecretNames are the Secrets that hold Lampyr's keys (docs/security.md
// "Where things live"), plus the shared token of old: a Secret of one of
// these names anywhere else is a copy.
var lampyrSecretNames = []string{"fiber-router-key", "lampyr-fleet-key", "lampyr-grant-signing-key", "lampyr-controller-sealer", "router-token", "fiber-router-token"}

func sweepSecrets(ctx context.Context, s *side) (string, bool) {
	needles, err := needlesOf(ctx, s.admin, contract.SystemNamespace)
	must(err, "administrator reading lampyr-system's Secrets")
	if len(needles) == 0 {
		abortf("lampyr-system holds no Secret value to look for: is the grant controller running?")
	}
	all, err := s.admin.Kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	must(err, "administrator listing every Secret")
	var found []string
	checked, nss := 0, map[string]bool{}
	for _, sec := range all.Items {
		if sec.Namespace == contract.SystemNamespace || sec.Namespace == contract.HomesNamespace {
			continue
		}
		checked++
		nss[sec.Namespace] = true
		if slices.Contains(lampyrSecretNames, sec.Name) {
			found = append(found, sec.Namespace+"/"+sec.Name+": a Lampyr key Secret's name")
		}
		for k, v := range sec.Data {
			if why := lampyrMaterial(k, v, false, needles); why != "" {
				found = append(found, sec.Namespace+"/"+sec.Name+"/"+k+": "+why)
			}
		}
	}
	if len(found) > 0 {
		return "found " + strings.Join(found, "; "), false
	}
	return fmt.Sprintf("%d Secrets in %d other namespaces: none (compared with %d lampyr-system values)", checked, len(nss), len(needles)), true
}

// ---- 2 ----

func readPlatformNamespaces(ctx context.Context, s *side) (string, bool) {
	core := s.a.c.Kube.CoreV1()
	sys, homes := contract.SystemNamespace, contract.HomesNamespace
	lo, gets := metav1.ListOptions{}, metav1.GetOptions{}
	calls := []struct {
		what string
		do   func() error
	}{
		{"list Secrets " + sys, func() error { _, err := core.Secrets(sys).List(ctx, lo); return err }},
		{"list Secrets " + homes, func() error { _, err := core.Secrets(homes).List(ctx, lo); return err }},
		{"list ConfigMaps " + sys, func() error { _, err := core.ConfigMaps(sys).List(ctx, lo); return err }},
		{"list ConfigMaps " + homes, func() error { _, err := core.ConfigMaps(homes).List(ctx, lo); return err }},
		{"watch Secrets " + sys, func() error {
			w, err := core.Secrets(sys).Watch(ctx, lo)
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"get Secret " + sys + "/fiber-router-key", func() error { _, err := core.Secrets(sys).Get(ctx, "fiber-router-key", gets); return err }},
		{"get Secret " + sys + "/lampyr-fleet-key", func() error { _, err := core.Secrets(sys).Get(ctx, "lampyr-fleet-key", gets); return err }},
		{"get Secret " + sys + "/lampyr-grant-signing-key", func() error {
			_, err := core.Secrets(sys).Get(ctx, "lampyr-grant-signing-key", gets)
			return err
		}},
		{"get Secret " + sys + "/lampyr-controller-sealer", func() error {
			_, err := core.Secrets(sys).Get(ctx, "lampyr-controller-sealer", gets)
			return err
		}},
		{"get B's Home Secret " + homes + "/" + s.b.home, func() error { _, err := core.Secrets(homes).Get(ctx, s.b.home, gets); return err }},
		{"get ConfigMap " + sys + "/" + sealersConfigMap, func() error { _, err := core.ConfigMaps(sys).Get(ctx, sealersConfigMap, gets); return err }},
		{"get B's router metadata", func() error {
			_, err := core.ConfigMaps(sys).Get(ctx, e2eutil.RouterMetadataName(nsB, victimRev), gets)
			return err
		}},
	}
	var allowed []string
	for _, c := range calls {
		if err := c.do(); !apierrors.IsForbidden(err) {
			allowed = append(allowed, fmt.Sprintf("%s: %s", c.what, errText(err)))
		}
	}
	// The two public ConfigMaps are readable on purpose (ly seals with
	// them); recorded, not judged.
	var public []string
	for _, n := range []string{contract.FleetKeyName, contract.ConfigMapName} {
		_, err := core.ConfigMaps(sys).Get(ctx, n, gets)
		public = append(public, n+" "+errText(err))
	}
	if len(allowed) > 0 {
		return "not Forbidden: " + strings.Join(allowed, "; "), false
	}
	return fmt.Sprintf("Forbidden (%d/%d calls); public %s", len(calls), len(calls), strings.Join(public, ", ")), true
}

// errText is "ok" or the API error's reason.
func errText(err error) string {
	if err == nil {
		return "ok"
	}
	if r := apierrors.ReasonForError(err); r != metav1.StatusReasonUnknown {
		return string(r)
	}
	return short(err.Error(), 60)
}

// ---- 3 ----

// dryRun: a create the defence would let through must not leave anything
// behind. Authorization and admission run for dry-run requests as for real
// ones.
var dryRun = []string{metav1.DryRunAll}

func forgeGrant(ctx context.Context, s *side) (string, bool) {
	// A plausible grant: A's own, copied by the administrator (tenants
	// cannot read grants), renamed, asking for more capacity.
	g, err := s.admin.Dynamic.Resource(contract.CapacityGrants).Namespace(nsA).Get(ctx, victimRev, metav1.GetOptions{})
	must(err, "reading A's CapacityGrant")
	spec, _, _ := unstructured.NestedMap(g.Object, "spec")
	if spec == nil {
		abortf("A's CapacityGrant has no spec")
	}
	spec["maxFibers"] = int64(100)
	forged := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": g.GetAPIVersion(), "kind": g.GetKind(),
		"metadata": map[string]any{"name": "forged-grant", "namespace": nsA},
		"spec":     spec,
	}}
	grants := s.a.c.Dynamic.Resource(contract.CapacityGrants).Namespace(nsA)
	_, createErr := grants.Create(ctx, forged, metav1.CreateOptions{DryRun: dryRun})
	patch := []byte(`{"status":{"homeEndpoint":"` + net.JoinHostPort(s.forgedHomeIP, "8080") + `","home":"forged-home"}}`)
	_, statusErr := grants.Patch(ctx, victimRev, types.MergePatchType, patch, metav1.PatchOptions{DryRun: dryRun}, "status")
	obs := fmt.Sprintf("create: %s; patch status: %s", errText(createErr), errText(statusErr))
	return obs, apierrors.IsForbidden(createErr) && apierrors.IsForbidden(statusErr)
}

func forgeKIngress(ctx context.Context, s *side) (string, bool) {
	ing := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.internal.knative.dev/v1alpha1", "kind": "Ingress",
		"metadata": map[string]any{"name": "forged-ingress", "namespace": nsA},
		"spec": map[string]any{"rules": []any{map[string]any{
			"hosts":      []any{host(victim, nsB)},
			"visibility": "ExternalIP",
			"http": map[string]any{"paths": []any{map[string]any{"splits": []any{map[string]any{
				"serviceName": victimRev, "serviceNamespace": nsA, "servicePort": int64(80), "percent": int64(100),
			}}}}},
		}}},
	}}
	_, err := s.a.c.Dynamic.Resource(e2eutil.Ingresses).Namespace(nsA).Create(ctx, ing, metav1.CreateOptions{DryRun: dryRun})
	return errText(err), apierrors.IsForbidden(err)
}

func podInHomes(ctx context.Context, s *side) (string, bool) {
	p := restrictedPod(contract.HomesNamespace, "forged-home-", "forged-home", corev1.Container{Name: "home", Image: s.attacker, Args: []string{"listen"}})
	_, err := s.a.c.Kube.CoreV1().Pods(contract.HomesNamespace).Create(ctx, p, metav1.CreateOptions{DryRun: dryRun})
	return errText(err), apierrors.IsForbidden(err)
}

// gatewayLabel is the namespace label fiber-router's NetworkPolicy admits
// (impl/config/networkpolicy/100-lampyr-system.yaml): a tenant who could set
// it on its namespace would reach fiber-router from its Pods.
const gatewayLabel = "lampyr.dev/gateway"

func labelGatewayNamespace(ctx context.Context, s *side) (string, bool) {
	patch := []byte(`{"metadata":{"labels":{"` + gatewayLabel + `":"true"}}}`)
	_, err := s.a.c.Kube.CoreV1().Namespaces().Patch(ctx, nsA, types.MergePatchType, patch, metav1.PatchOptions{DryRun: dryRun})
	return errText(err), apierrors.IsForbidden(err)
}

// ---- 4 ----

func privilegedPod(ctx context.Context, s *side) (string, bool) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "privileged-", Namespace: nsA, Labels: map[string]string{roleLabel: "privileged"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "root", Image: s.attacker, Args: []string{"listen"},
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			}},
		},
	}
	// For real, as an attacker would (not a dry run): if it is admitted,
	// it is deleted at once.
	created, err := s.a.c.Kube.CoreV1().Pods(nsA).Create(ctx, p, metav1.CreateOptions{})
	if err == nil {
		_ = s.admin.Kube.CoreV1().Pods(nsA).Delete(ctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		return "admitted: privileged Pod " + created.Name + " created", false
	}
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, "violates PodSecurity "); ok {
		return "Forbidden: violates PodSecurity " + short(after, 90), apierrors.IsForbidden(err)
	}
	return errText(err) + ": " + short(msg, 90), false
}

// ---- 5, 6 ----

const routerService = "fiber-router.lampyr-system.svc.cluster.local"
const activatorService = "activator-service.knative-serving.svc.cluster.local"

func callRouterAsB(ctx context.Context, s *side) (string, bool) {
	var ps []probe
	if s == the().stock {
		ps = []probe{{target: "activator-service", url: "http://" + activatorService + "/", headers: selectB}}
	} else {
		ps = []probe{{target: "fiber-router Service", url: "http://" + routerService + "/", headers: selectB}}
		for _, ip := range s.routerIPs {
			for _, port := range []string{"80", "81"} {
				hp := net.JoinHostPort(ip, port)
				ps = append(ps, probe{target: hp, url: "http://" + hp + "/", headers: selectB})
			}
		}
	}
	return summarize(runProbes(ctx, s, "router", ps))
}

// smuggleSelection sends, through the gateway to A's own host, selection
// headers naming a Revision of B that does not exist. If the gateway's own
// headers did not replace them (or fiber-router preferred the client's),
// the router would look for that Revision and A's handler could not answer;
// with B's real Revision named, B's handler would.
func smuggleSelection(ctx context.Context, s *side) (string, bool) {
	want := helloBody
	if s == the().stock {
		want = stockBody(nsA)
	}
	smuggled := map[string]string{"Knative-Serving-Namespace": nsB, "Knative-Serving-Revision": "absent-00001"}
	counts := map[string]int{}
	handled := 0
	for range 5 {
		code, body, err := gatewayGet(ctx, s, host(victim, nsA), "/", smuggled)
		switch {
		case err != nil:
			counts["error "+classify(err.Error())]++
		case code == 200 && body == want:
			handled++
			counts[fmt.Sprintf("%d %q", code, firstLine(body))]++
		default:
			counts[fmt.Sprintf("%d %q", code, short(firstLine(body), 40))]++
		}
	}
	return fmt.Sprintf("%d/5 answered by A's handler (%s)", handled, tallyText(counts)), handled == 5
}

func callHome(ctx context.Context, s *side) (string, bool) {
	var ps []probe
	if s == the().stock {
		ip := s.victimPodB.Status.PodIP
		ps = []probe{
			{target: "B's Pod queue-proxy :8012", url: "http://" + net.JoinHostPort(ip, "8012") + "/"},
			{target: "B's Pod handler :8080", url: "http://" + net.JoinHostPort(ip, "8080") + "/"},
		}
	} else {
		u := "http://" + net.JoinHostPort(s.homeB.Status.PodIP, "9090") + "/v1/fibers"
		ps = []probe{
			{target: "GET " + net.JoinHostPort(s.homeB.Status.PodIP, "9090") + "/v1/fibers", url: u},
			{target: "POST …/v1/fibers", url: u, method: "POST"},
		}
	}
	return summarize(runProbes(ctx, s, "home", ps))
}

func callRouterAdmin(ctx context.Context, s *side) (string, bool) {
	var ps []probe
	if s == the().stock {
		ps = []probe{{target: "activator-service:9090/metrics", url: "http://" + activatorService + ":9090/metrics"}}
	} else {
		ps = []probe{{target: "fiber-router Service :9091", url: "http://" + routerService + ":9091/metrics"}}
		for _, ip := range s.routerIPs {
			hp := net.JoinHostPort(ip, "9091")
			ps = append(ps, probe{target: hp, url: "http://" + hp + "/metrics"})
		}
	}
	return summarize(runProbes(ctx, s, "admin", ps))
}

// ---- 7 ----

// homeVerdict: a credential not minted for this Home is refused with 401.
func homeVerdict(code int, msg string) (string, bool) {
	return fmt.Sprintf("%d %s", code, short(msg, 100)), code == 401
}

// grantOf is the signed grant t's victim Home runs on, as the
// administrator reads it from the Home's Secret (a claimed spare's keeps
// the spare's name: found by the grant's labels).
func grantOf(ctx context.Context, s *side, t *tenant) []byte {
	l, err := s.admin.Kube.CoreV1().Secrets(contract.HomesNamespace).List(ctx, metav1.ListOptions{LabelSelector: "fiberd.io/grant-namespace=" + t.ns})
	must(err, "administrator listing the Home Secrets of "+t.ns)
	for _, sec := range l.Items {
		if g := sec.Data["grant"]; len(g) > 0 {
			return g
		}
	}
	abortf("no Home Secret with a grant for namespace %s", t.ns)
	return nil
}

// routerKey is fiber-router's private key, as the administrator reads it.
func routerKey(ctx context.Context, s *side) ed25519.PrivateKey {
	sec, err := s.admin.Kube.CoreV1().Secrets(contract.SystemNamespace).Get(ctx, "fiber-router-key", metav1.GetOptions{})
	must(err, "administrator reading Secret lampyr-system/fiber-router-key")
	k, err := routercred.ParsePrivateKey(sec.Data["private.pem"])
	must(err, "parsing fiber-router-key private.pem")
	return k
}

// mint is a router credential for home, valid for a minute.
func mint(key ed25519.PrivateKey, home string) string {
	c, err := routercred.Mint(key, home, time.Now(), time.Minute)
	must(err, "minting a router credential for "+home)
	return c
}

// serviceAccountToken is a token of tenancy-a's default service account,
// requested by tenant-a (edit lets it; failing that, the administrator
// requests it: tenant-a could read the same from any Pod it runs).
func serviceAccountToken(ctx context.Context, s *side) string {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
	tr, err := s.a.c.Kube.CoreV1().ServiceAccounts(nsA).CreateToken(ctx, "default", req, metav1.CreateOptions{})
	if err != nil {
		fmt.Fprintf(GinkgoWriter, "tenant-a requesting its own token: %v; the administrator requests it instead\n", err)
		tr, err = s.admin.Kube.CoreV1().ServiceAccounts(nsA).CreateToken(ctx, "default", req, metav1.CreateOptions{})
		must(err, "requesting a token of tenancy-a/default")
	}
	return tr.Status.Token
}

// ---- 8 ----

func forgeRouterMetadata(ctx context.Context, s *side) (string, bool) {
	before, _, err := seenCount(ctx, s)
	must(err, "reading the forged Home's record")
	forged := func(ns string) routermeta.Metadata {
		return routermeta.Metadata{
			Revision: victimRev, Namespace: ns, Ready: true,
			HomeEndpoint: net.JoinHostPort(s.forgedHomeIP, "8080"), Home: "forged-home",
			MaxFibers: 2, TimeoutSeconds: 300, Mode: "fresh", Protocol: routermeta.ProtocolHTTP1, Generation: 1,
		}
	}
	// The current name for A's and for B's Revision, and the name router
	// metadata had when it lived in the Revision's own namespace.
	cms := []*corev1.ConfigMap{
		routermeta.MakeConfigMap(nsA, forged(nsA)),
		routermeta.MakeConfigMap(nsA, forged(nsB)),
	}
	old := routermeta.MakeConfigMap(nsA, forged(nsA))
	old.Name = victimRev + "-lampyr-route"
	cms = append(cms, old)
	api := s.a.c.Kube.CoreV1().ConfigMaps(nsA)
	for _, cm := range cms {
		_, err := api.Create(ctx, cm, metav1.CreateOptions{})
		must(err, "tenant-a creating ConfigMap "+cm.Name)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, cm := range cms {
			_ = api.Delete(dctx, cm.Name, metav1.DeleteOptions{})
		}
	}()
	// A reader that watched tenant namespaces would hold them within
	// moments; give it a few seconds before asking.
	time.Sleep(5 * time.Second)
	handledA, tallyA := gatewayTally(ctx, s, victim, nsA, 20, helloBody)
	handledB, tallyB := gatewayTally(ctx, s, victim, nsB, 20, helloBody)
	after, raw, err := seenCount(ctx, s)
	must(err, "reading the forged Home's record")
	seen := after - before
	if seen > 0 {
		fmt.Fprintf(GinkgoWriter, "the forged Home saw %d requests: %s\n", seen, raw)
	}
	obs := fmt.Sprintf("%d/40 answered by the handlers (A: %s; B: %s); forged Home saw %d", handledA+handledB, tallyA, tallyB, seen)
	return obs, handledA+handledB == 40 && seen == 0
}

// ---- 9, 10 ----

// deployRefused has tenant-a deploy Service svc from snapshot with
// template, waits for Lampyr's verdict on its first Revision, checks that
// nothing of it answers through the gateway, and deletes it. refused: the
// Revision is not Ready, never answered, and its ContainerHealthy reason is
// one of reasons (and the message contains mention, if set).
func deployRefused(ctx context.Context, s *side, svc string, snapshot, template string, mention string, reasons ...string) (string, bool) {
	t := s.a
	must(t.c.Apply(ctx, e2eutil.KServices, lampyrService(svc, nsA, snapshot, snapshot, template), fieldManager), "tenant-a applying Service "+svc)
	defer deleteService(t.c, nsA, svc)
	rev := svc + "-00001"
	c, err := refusedOrRan(ctx, t.c, nsA, rev)
	must(err, "Lampyr's verdict")
	handled, tally := gatewayTally(ctx, s, svc, nsA, 5, helloBody)
	obs := fmt.Sprintf("%v: %s; %d/5 answered (%s)", c, short(c.message, 140), handled, tally)
	ok := c.typ == "ContainerHealthy" && slices.Contains(reasons, c.reason) && handled == 0 && strings.Contains(c.message, mention)
	return obs, ok
}

func replayB(ctx context.Context, s *side) (string, bool) {
	// A cannot read B's objects: the administrator hands the annotations
	// over, as a leaked manifest would.
	rev, err := s.admin.Dynamic.Resource(e2eutil.Revisions).Namespace(nsB).Get(ctx, victimRev, metav1.GetOptions{})
	must(err, "reading B's Revision")
	ann := rev.GetAnnotations()
	tmpl, snap := ann[contract.FiberdTemplateAnnotation], ann[contract.SnapshotArtifactAnnotation]
	if tmpl == "" || snap == "" {
		abortf("B's Revision lacks %s or %s", contract.FiberdTemplateAnnotation, contract.SnapshotArtifactAnnotation)
	}
	return deployRefused(ctx, s, "replayed", snap, tmpl, "namespace", "TemplateMismatch")
}

func sealWithOwnKey(ctx context.Context, s *side) (string, bool) {
	own, err := seal.GenerateSealerKey()
	must(err, "generating A's own sealer key")
	inst, err := readInstallation(ctx, s.a.c)
	must(err, "tenant-a reading the installation")
	tmpl, err := sealAndPush(ctx, inst, own, nsA, "forged-key-00001", s.b.snapshot)
	must(err, "tenant-a sealing and pushing its template")
	return deployRefused(ctx, s, "forged-key", s.b.snapshot.String(), tmpl.String(), "", "TemplateUnauthenticated")
}

func sealForB(ctx context.Context, s *side) (string, bool) {
	inst, err := readInstallation(ctx, s.a.c)
	must(err, "tenant-a reading the installation")
	tmpl, err := sealAndPush(ctx, inst, s.a.sealer, nsB, "cross-ns-00001", s.a.snapshot)
	must(err, "tenant-a sealing and pushing its template")
	return deployRefused(ctx, s, "cross-ns", s.a.snapshot.String(), tmpl.String(), "", "TemplateNotAuthorized", "TemplateMismatch")
}

// ---- 11 ----

func copyMappedImage(ctx context.Context, s *side) (string, bool) {
	imageB := s.b.runnable // <registry>/tenancy-b/handler@sha256:D
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := restoreImageSnapshots(rctx, s.admin, imageB); err != nil {
			fmt.Fprintf(GinkgoWriter, "restoring config-lampyr image-snapshots: %v\n", err)
		}
	}()
	must(mapImageSnapshot(ctx, s.admin, imageB, s.b.snapshot.String()), "administrator mapping B's image in config-lampyr")

	// Control first: B's own image, mapped, runs. It also proves the
	// controller has loaded the mapping, so A's refusal below is the
	// repository rule, not a mapping not yet seen.
	u := lampyrService("mapped", nsB, imageB, "", "")
	stripLampyrAnnotations(u)
	must(s.b.c.Apply(ctx, e2eutil.KServices, u, fieldManager), "tenant-b applying Service mapped")
	defer deleteService(s.b.c, nsB, "mapped")
	if _, err := s.b.c.WaitReady(ctx, e2eutil.KServices, nsB, "mapped", 4*time.Minute); err != nil {
		abortf("control failed: B's own mapped image did not run, so A's refusal would prove nothing: %v", err)
	}
	if handled, tally := gatewayTally(ctx, s, "mapped", nsB, 3, helloBody); handled == 0 {
		abortf("control failed: B's mapped Service is Ready but does not answer through the gateway (%s)", tally)
	}

	// A copies the same bytes under its own repository.
	src, err := name.NewDigest(imageB)
	must(err, "parsing B's image")
	img, err := remote.Image(src, remote.WithContext(ctx))
	must(err, "tenant-a pulling B's image")
	dst, err := name.NewTag(s.registry + "/" + nsA + "/handler:copied")
	must(err, "naming A's copy")
	must(remote.Write(dst, img, remote.WithContext(ctx)), "tenant-a pushing its copy")
	imageA := dst.Context().Name() + "@" + src.DigestStr()

	u = lampyrService("copied", nsA, imageA, "", "")
	stripLampyrAnnotations(u)
	must(s.a.c.Apply(ctx, e2eutil.KServices, u, fieldManager), "tenant-a applying Service copied")
	defer deleteService(s.a.c, nsA, "copied")
	c, err := readySettled(ctx, s.a.c, nsA, "copied-00001", 3*time.Minute)
	must(err, "Lampyr's verdict on A's copy")
	_, gerr := s.admin.Dynamic.Resource(contract.CapacityGrants).Namespace(nsA).Get(ctx, "copied-00001", metav1.GetOptions{})
	grant := "no grant"
	if gerr == nil {
		grant = "a CapacityGrant exists"
	}
	handled, tally := gatewayTally(ctx, s, "copied", nsA, 5, helloBody)
	obs := fmt.Sprintf("%v: %s; %s; %d/5 answered (%s); B's own mapped image: Ready", c, short(c.message, 120), grant, handled, tally)
	return obs, c.status == "False" && c.reason == "MissingSnapshotArtifact" && handled == 0 && apierrors.IsNotFound(gerr)
}

// stripLampyrAnnotations leaves an image-only Service: no snapshot, no
// template.
func stripLampyrAnnotations(u *unstructured.Unstructured) {
	ann, _, _ := unstructured.NestedStringMap(u.Object, "spec", "template", "metadata", "annotations")
	delete(ann, contract.SnapshotArtifactAnnotation)
	delete(ann, contract.FiberdTemplateAnnotation)
	m := map[string]any{}
	for k, v := range ann {
		m[k] = v
	}
	_ = unstructured.SetNestedMap(u.Object, m, "spec", "template", "metadata", "annotations")
}

// ---- 12 ----

// domainMappingExternalName: a platform that offers custom domains grants
// tenant A a ClusterDomainClaim (cluster-scoped, so only an administrator
// makes one). A DomainMapping may name a core Service of its namespace,
// and its KIngress routes to that Service: A makes one of type
// ExternalName pointing at kube-dns's metrics port. The control maps a
// second domain to a ClusterIP Service of A's own Pod (the forged Home's
// listener) through the same path, which must answer 200, so a refusal of
// the first is the gateway's, not a broken DomainMapping.
func domainMappingExternalName(ctx context.Context, s *side) (string, bool) {
	const target = "kube-dns.kube-system.svc.cluster.local"
	cases := []struct{ svc, domain string }{
		{"dm-own", "dm-own.tenancy-a.example"},
		{"dm-kdns", "dm-kdns.tenancy-a.example"},
	}
	own := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: cases[0].svc, Namespace: nsA},
		Spec: corev1.ServiceSpec{Selector: map[string]string{roleLabel: "forged-home"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	kdns := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: cases[1].svc, Namespace: nsA},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: target,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(9153)}}},
	}
	for i, svc := range []*corev1.Service{own, kdns} {
		c := cases[i]
		cdc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "networking.internal.knative.dev/v1alpha1", "kind": "ClusterDomainClaim",
			"metadata": map[string]any{"name": c.domain},
			"spec":     map[string]any{"namespace": nsA},
		}}
		if _, err := s.admin.Dynamic.Resource(e2eutil.ClusterDomainClaims).Create(ctx, cdc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			abortf("administrator granting %s to %s: %v", c.domain, nsA, err)
		}
		defer func() {
			_ = s.admin.Dynamic.Resource(e2eutil.ClusterDomainClaims).Delete(context.Background(), c.domain, metav1.DeleteOptions{})
		}()
		if _, err := s.a.c.Kube.CoreV1().Services(nsA).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			if i == 1 && apierrors.IsForbidden(err) {
				return "creating the ExternalName Service: " + errText(err), true
			}
			abortf("tenant-a creating Service %s: %v", svc.Name, err)
		}
		defer func() {
			_ = s.a.c.Kube.CoreV1().Services(nsA).Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
		}()
		dm := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "serving.knative.dev/v1beta1", "kind": "DomainMapping",
			"metadata": map[string]any{"name": c.domain, "namespace": nsA},
			"spec":     map[string]any{"ref": map[string]any{"apiVersion": "v1", "kind": "Service", "name": svc.Name}},
		}}
		if _, err := s.a.c.Dynamic.Resource(e2eutil.DomainMappings).Namespace(nsA).Create(ctx, dm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			if i == 1 && apierrors.IsForbidden(err) {
				return "creating the DomainMapping: " + errText(err), true
			}
			abortf("tenant-a creating DomainMapping %s: %v", c.domain, err)
		}
		defer func() {
			_ = s.a.c.Dynamic.Resource(e2eutil.DomainMappings).Namespace(nsA).Delete(context.Background(), c.domain, metav1.DeleteOptions{})
		}()
	}
	// Both DomainMappings Ready (the ExternalName one becomes Ready too:
	// the KIngress is programmed; what the gateway then does is the row).
	ready := map[string]string{}
	_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		all := true
		for _, c := range cases {
			u, err := s.a.c.Dynamic.Resource(e2eutil.DomainMappings).Namespace(nsA).Get(ctx, c.domain, metav1.GetOptions{})
			if err != nil {
				ready[c.svc], all = errText(err), false
				continue
			}
			st, reason, _ := e2eutil.Condition(u, "Ready")
			ready[c.svc], all = strings.TrimSpace(st+" "+reason), all && st == "True"
		}
		return all, nil
	})
	// The control must answer 200 (a minute: the gateway programs the route
	// after Ready); then three requests through the ExternalName mapping.
	ownCode, ownErr := 0, ""
	_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		code, _, err := gatewayGet(ctx, s, cases[0].domain, "/_seen", nil)
		ownCode, ownErr = code, errText(err)
		return code == http.StatusOK, nil
	})
	if ownCode != http.StatusOK {
		abortf("control: the DomainMapping to A's own Pod (%s, Ready %s) answered %d (%s), so the ExternalName case proves nothing", cases[0].domain, ready[cases[0].svc], ownCode, ownErr)
	}
	codes := map[string]int{}
	leaked := false
	for range 3 {
		code, body, err := gatewayGet(ctx, s, cases[1].domain, "/metrics", nil)
		k := fmt.Sprint(code)
		if err != nil {
			k = errText(err)
		}
		codes[k]++
		if code == http.StatusOK || strings.Contains(body, "coredns_") {
			leaked = true
		}
	}
	return fmt.Sprintf("control %s: 200 (Ready %s); %s -> %s: Ready %s, 3 requests: %s", cases[0].domain, ready[cases[0].svc], cases[1].domain, target, ready[cases[1].svc], tallyText(codes)), !leaked
}
