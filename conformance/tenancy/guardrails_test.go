package tenancy

// Guard-rail rows (issue 31, item 8): a tenant's own Kubernetes guard rails
// (ResourceQuota, LimitRange, NetworkPolicy) must mean for its Lampyr
// Revisions what they mean for its Pods on stock Knative, and no tenant may
// take another's share of capacity, of the grant controller's time, of
// fiber-router's table or of a Home's processes. Each row runs in
// namespaces of its own (tenancy-<row>-a/-b, made fresh, so a row can run
// alone and again), as users holding only `edit` there under Pod Security
// restricted, and says how it fails when its defence is removed.
//
// Parity rows (quota, LimitRange, NetworkPolicy) run the same image-only
// Service on both clusters and require stock's verdict; the others are
// Lampyr's own (stock has no grant controller, router table or Home) or
// report stock as a reference.
//
// Every row deploys the fixture handler as an image-only Service: on stock
// its runnable image, on Lampyr the same image mapped to its snapshot in
// config-lampyr image-snapshots (setupGuardRails; the controller seals for
// mapped images), so the manifests are the same but for the security
// context stock's Pods need under restricted (Lampyr refuses one).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	. "github.com/onsi/ginkgo/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/impl/trust/seal"
)

// The rows' namespaces (each row makes its own, fresh).
const (
	nsQuota  = "tenancy-quota"
	nsLimits = "tenancy-limits"
	nsNPA    = "tenancy-np-a"
	nsNPB    = "tenancy-np-b"
	nsHogA   = "tenancy-hog-a"
	nsHogB   = "tenancy-hog-b"
	nsTarA   = "tenancy-tarpit-a"
	nsTarB   = "tenancy-tarpit-b"
	nsRTA    = "tenancy-rt-a"
	nsRTB    = "tenancy-rt-b"
	nsPidsA  = "tenancy-pids-a"
	nsPidsB  = "tenancy-pids-b"
	nsXIP    = "tenancy-xip"
	nsXName  = "tenancy-xname"
)

// rowRepo is the repository (under each cluster's registry) of the rows'
// handler image and, on Lampyr, its snapshot. One image for every row: the
// mapping is by repository@digest, and a repository of its own keeps it
// apart from attack 11's (which maps tenancy-b/handler and must find
// tenancy-a/handler unmapped).
const rowRepo = "tenancy-guardrails"

// rowSealerName is the sealer identity the administrator authorizes for the
// rows that deploy a sealed project (the malicious handler of G6).
const rowSealerName = "tenancy-guardrails-deployer"

// tarpitVar is the registry-tarpit row's duration (Go duration, default
// 15m: issue 31 asks for at least 15 minutes).
const tarpitVar = "LAMPYR_TENANCY_TARPIT_DURATION"

const defaultTarpitDuration = 15 * time.Minute

// parseTarpitDuration reads tarpitVar's value ("" is the default).
func parseTarpitDuration(v string) (time.Duration, error) {
	if strings.TrimSpace(v) == "" {
		return defaultTarpitDuration, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d < time.Minute {
		return 0, fmt.Errorf("%s=%q: want a Go duration of at least 1m, e.g. 15m", tarpitVar, v)
	}
	return d, nil
}

// tarpitDuration is the run's tarpit duration; an unreadable value keeps
// the default here (the row itself refuses it, naming the variable).
func tarpitDuration() time.Duration {
	d, err := parseTarpitDuration(suite.Options().Knobs[tarpitVar])
	if err != nil {
		return defaultTarpitDuration
	}
	return d
}

var guardRails = []attack{
	{
		name:      "G1a quota: ResourceQuota pods 2 and six image-only Services (max-scale 1, 64Mi) applied one after another",
		appliesTo: onBoth, parity: true, tags: []string{"guardrails", "quota"}, timeout: 25 * time.Minute,
		expected:       "the same two Ready as on stock; the other four ResourcesAvailable=False FailedCreate \"exceeded quota\"; status.used pods=2, Lampyr's quota Pods",
		withoutDefence: "Homes outside the tenant's quota (no quota Pod): all six Revisions are Ready and status.used shows pods=0, so the Ready set differs from stock's and the row fails.",
		runParity:      quotaSix,
	},
	{
		name:      "G1b LimitRange: max memory 512Mi per container; a Service asking 768Mi beside one asking 64Mi",
		appliesTo: onBoth, parity: true, tags: []string{"guardrails", "quota"}, timeout: 15 * time.Minute,
		expected:       "64Mi Ready, 768Mi refused on both (Lampyr: ResourcesAvailable=False FailedCreate \"maximum memory usage\")",
		withoutDefence: "without a quota Pod the LimitRange never sees what a Lampyr Revision takes: the 768Mi Service becomes Ready where stock refuses it, and the row fails.",
		runParity:      limitRangeRow,
	},
	{
		name:      "G2a NetworkPolicy: A's Service calls its own db, which admits only Pods of A's namespace",
		appliesTo: onBoth, parity: true, control: true, tags: []string{"guardrails", "networkpolicy"}, timeout: 20 * time.Minute,
		expected:       "200 from db on both",
		withoutDefence: "fibers' connections leave from Homes in lampyr-homes, which db's policy does not admit: the call gets no answer (connect) and the row fails.",
		runParity:      npOwnDB,
	},
	{
		name:      "G2b NetworkPolicy: B's Service calls A's db",
		appliesTo: onBoth, parity: true, tags: []string{"guardrails", "networkpolicy"}, timeout: 20 * time.Minute,
		expected:       "no answer on both (B's call to its own namespace answers)",
		withoutDefence: "one egress Pod for every namespace (the first to ask, A), reached by every Home and serving any namespace's grant: B's call leaves from A's namespace, db's policy admits it, B gets 200 and the row fails (egress from the Home, the old path, is refused here too: this row guards the per-namespace egress Pod).",
		runParity:      npOtherDB,
	},
	{
		name:      "G2c NetworkPolicy: A's own default-deny egress (DNS only) stops A's call to its own open Service",
		appliesTo: onBoth, parity: true, tags: []string{"guardrails", "networkpolicy"}, timeout: 20 * time.Minute,
		expected:       "200 before, no answer with the policy, on both",
		withoutDefence: "A's egress policies do not apply where its fibers' connections leave from (a Home): the call still answers 200 and the row fails.",
		runParity:      npOwnEgress,
	},
	{
		name:      "G3 capacity hog: B's Service names template and snapshot digests that do not exist (2Gi x max-scale 2), another asks more than B's share; A's next Service",
		appliesTo: onLampyr, tags: []string{"guardrails", "capacity"}, timeout: 20 * time.Minute,
		expected:       "B holds nothing; A's next Service Ready and answering; B's refusals name no installation-wide figure",
		withoutDefence: "capacity booked before the template verifies: B's hog is admitted and holds 4Gi, A's next Service (sized to fit only without it) is refused InsufficientMemory, and the row fails (a refusal naming what the installation has free would fail it too).",
		run:            capacityHog,
	},
	{
		name:      "G4 registry tarpit: B points 30 Revisions' template and snapshot at a registry that accepts TCP and never answers; A's Service and grant meanwhile",
		appliesTo: onLampyr, tags: []string{"guardrails", "tarpit"}, timeout: tarpitDuration() + 20*time.Minute,
		expected:       fmt.Sprintf("for %s (%s): A answers every request, A's grant expiresAt moves and is never past", tarpitDuration(), tarpitVar),
		withoutDefence: "one grant-controller worker fetching templates inline: B's fetches hold it and A's renewal waits behind them: an expiresAt that does not move every grant-renew-interval (5m) fails the row from 15 min on; at grant-ttl 10m (before 2026-12-04) A's grant also expired and A answered 503 (run: expiresAt never moved, A answered 295/450, every request 503 from the grant's expiry in minute 10); at today's 1h A's Home outlives the stall, but its renewals (new keys, new terms) do not arrive.",
		run:            registryTarpit,
	},
	{
		name:      "G5 router table: B creates Revisions past its per-namespace bound; A's new Revision",
		appliesTo: onLampyr, tags: []string{"guardrails", "router-table"}, timeout: 35 * time.Minute,
		expected:       "A's new Revision answers (no 404); B's beyond its bound run and answer 404; no Ready Service of B answers 404 to any of 6 requests (both fiber-router replicas hold the same Revisions)",
		withoutDefence: "a global table only (no --max-revisions-per-namespace, detected by fiber-router refusing the flag): B's Revisions fill --max-revisions, A's new Revision runs but answers 404 (its Service may not even become Ready), failing the row. Replicas admitting first come, first served (before the oldest-first rule): a Ready Service of B answered 404 from one replica (6 of 7 Ready, 4 answering 404), failing the row.",
		run:            routerTable,
	},
	{
		name:      "G6 Home processes: A fork-bombs every fiber of one Home at once; B's Service meanwhile",
		appliesTo: onLampyr, tags: []string{"guardrails", "home-pids"}, timeout: 15 * time.Minute,
		expected:       "the fibers together hold less than their per-fiber bounds add up to (and at most the Home's bound); B answers 10/10",
		withoutDefence: "no pids bound over the Home: K fibers hold about K x what one holds alone (each ~510 under RLIMIT_NPROC 512), so the sum is not below the per-fiber total and the row fails.",
		run:            homeProcesses,
	},
	{
		name:      "G7 externalIPs: A's Service claims B's Home IP and fiber-router's Pod IP (stock: B's Pod and the activator)",
		appliesTo: onBoth, tags: []string{"guardrails", "externalips"}, timeout: 12 * time.Minute,
		expected:       "Forbidden by the API server (DenyServiceExternalIPs); B's victim answers 10/10; A's capturing Pod sees nothing",
		withoutDefence: "a cluster without DenyServiceExternalIPs admits both Services and the row fails on that alone; kube-proxy then sends part of fiber-router's dials to B's Home to A's Pod, so B's requests fail (5 of 10 answered 503 when checked), while the Home key fiber-router pins keeps it from sending A a request or a credential (old Lampyr: A recorded them with the router's credential).",
		run:            externalIPs,
	},
	{
		name:      "G8 ExternalName: A's fiber calls kube-dns (53, 9153) and webhook.knative-serving through ExternalName Services A made",
		appliesTo: onBoth, tags: []string{"guardrails", "externalname"}, timeout: 15 * time.Minute,
		expected:       "refused (NXDOMAIN or reset); an ExternalName to A's own Service answers",
		withoutDefence: "a resolver that checks only the name asked (kdns.<ns>), not the CNAME chain: kube-dns is reached (9153 answers 200) and the row fails.",
		run:            externalNameRow,
	},
}

var _ = Describe("tenant guard rails", Label("cluster", "tenancy", "guardrails"), Ordered, ContinueOnFailure, func() {
	for _, a := range guardRails {
		It(a.name, a.labels(false), func(ctx SpecContext) { runRow(ctx, a) }, NodeTimeout(a.nodeTimeout()))
	}

	AfterAll(func() {
		fmt.Fprint(GinkgoWriter, "\n"+renderReport(reportHeader(), snapshotResults()))
	})
})

// ---- setup and finish ----

// rowState is what the guard-rail rows leave for the finish step.
var rowState = struct {
	sync.Mutex
	namespaces map[string]map[string]bool // side name -> namespaces made
	sealer     bool                       // rowSealerName authorized
	restore    []func(context.Context) error
}{namespaces: map[string]map[string]bool{}}

// setupGuardRails puts the rows' handler image under rowRepo on each side,
// and on Lampyr its snapshot, mapped in config-lampyr (before any row runs,
// so the controller has loaded the mapping when a row applies a Service),
// and authorizes the rows' sealer for nsPidsA.
func setupGuardRails(ctx context.Context, r *tenancyRun) error {
	for _, s := range r.sides {
		img, err := copyImage(ctx, s.a.runnable, s.registry+"/"+rowRepo+"/handler:rows")
		if err != nil {
			if s == r.lampyr {
				return fmt.Errorf("putting the handler image under %s/%s: %w", s.registry, rowRepo, err)
			}
			s.rowImageErr = err
			continue
		}
		s.rowImage = img
	}
	lampyr := r.lampyr
	tag, err := ly.ParseImageTag(lampyr.registry + "/" + rowRepo + "/handler-snapshot:rows")
	if err != nil {
		return err
	}
	pushed, err := ly.Push(ctx, r.built, tag)
	if err != nil {
		return fmt.Errorf("pushing the handler's snapshot under %s: %w", rowRepo, err)
	}
	lampyr.rowSnapshot = pushed.Ref
	if err := mapImageSnapshot(ctx, lampyr.admin, lampyr.rowImage, pushed.Ref.String()); err != nil {
		return fmt.Errorf("mapping %s in config-lampyr: %w", lampyr.rowImage, err)
	}
	r.rowSealer, err = seal.GenerateSealerKey()
	if err != nil {
		return err
	}
	entry, err := seal.FormatSealer(seal.TrustedSealer{Name: rowSealerName, Key: r.rowSealer.Public(), Namespaces: []string{nsPidsA}})
	if err != nil {
		return err
	}
	rowState.Lock()
	rowState.sealer = true
	rowState.Unlock()
	return editConfigMap(ctx, lampyr.admin, contract.SystemNamespace, sealersConfigMap, true, func(d map[string]string) { d[rowSealerName] = entry })
}

// finishGuardRails deletes the rows' namespaces (unless kept), removes the
// rows' sealer, and puts back anything a row changed and could not put back
// itself.
func finishGuardRails(ctx context.Context, r *tenancyRun) {
	rowState.Lock()
	restore := rowState.restore
	rowState.restore = nil
	nss := rowState.namespaces
	sealer := rowState.sealer
	rowState.Unlock()
	for i := len(restore) - 1; i >= 0; i-- {
		if err := restore[i](ctx); err != nil {
			fmt.Fprintf(GinkgoWriter, "guard rails: putting back what a row changed: %v\n", err)
		}
	}
	// Kept clusters keep the rows' namespaces and sealer, as the victims'
	// (but not a row's change to fiber-router or config-lampyr, put back
	// above: a kept cluster must serve as installed).
	if suite.Options().Keep {
		return
	}
	if r.lampyr.admin != nil && sealer {
		if err := editConfigMap(ctx, r.lampyr.admin, contract.SystemNamespace, sealersConfigMap, false, func(d map[string]string) { delete(d, rowSealerName) }); err != nil {
			fmt.Fprintf(GinkgoWriter, "removing sealer entry %s: %v\n", rowSealerName, err)
		}
	}
	for _, s := range r.sides {
		for ns := range nss[s.name] {
			if err := s.admin.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				fmt.Fprintf(GinkgoWriter, "%s: deleting namespace %s: %v\n", s.name, ns, err)
			}
		}
	}
}

// onFinish registers what the finish step must put back if the row that
// changed it could not (it was interrupted); the row's own deferred
// restore removes nothing from here, restoring twice is harmless.
func onFinish(f func(context.Context) error) {
	rowState.Lock()
	defer rowState.Unlock()
	rowState.restore = append(rowState.restore, f)
}

// copyImage copies the image src (repository@digest) to the tag dst and
// returns dst's repository@digest: the same bytes under another name.
func copyImage(ctx context.Context, src, dst string) (string, error) {
	from, err := name.NewDigest(src)
	if err != nil {
		return "", err
	}
	img, err := remote.Image(from, remote.WithContext(ctx))
	if err != nil {
		return "", err
	}
	to, err := name.NewTag(dst)
	if err != nil {
		return "", err
	}
	if err := remote.Write(to, img, remote.WithContext(ctx)); err != nil {
		return "", err
	}
	return to.Context().Name() + "@" + from.DigestStr(), nil
}

// ---- a row's tenants ----

// rowTenant makes namespace ns afresh on s (deleting what a former run
// left), under Pod Security restricted (on stock, the level its victims
// needed), with a user holding only `edit` there, and returns the tenant
// acting as that user.
func rowTenant(ctx context.Context, s *side, ns string) *tenant {
	if s.rowImage == "" {
		abortf("%s: the rows' handler image is not there: %v", s.name, s.rowImageErr)
	}
	level := "restricted"
	if s == the().stock && s.podSecurity[nsA] != "restricted" {
		level = "baseline"
	}
	rowState.Lock()
	if rowState.namespaces[s.name] == nil {
		rowState.namespaces[s.name] = map[string]bool{}
	}
	rowState.namespaces[s.name][ns] = true
	rowState.Unlock()
	must(s.admin.FreshNamespace(ctx, ns, 3*time.Minute), "making namespace "+ns)
	must(setPodSecurity(ctx, s.admin, ns, level), "labelling "+ns)
	user := "user-" + ns
	must(bindEdit(ctx, s.admin, ns, user), "binding "+user)
	c, err := impersonate(s.admin, user)
	must(err, "impersonating "+user)
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	must(err, user+" listing Services in "+ns+" (its edit RoleBinding)")
	return &tenant{ns: ns, user: user, c: c, runnable: s.rowImage}
}

// dropRow deletes the rows' namespaces on s, unless the run keeps them: a
// row calls it when it passed, so what a failed row leaves is there for
// the failure dump (the finish step deletes it).
func dropRow(s *side, nss ...string) {
	if suite.Options().Keep {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ns := range nss {
		_ = s.admin.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	}
}

// handlerService is the fixture handler as an image-only Service: what
// `ly deploy` writes for a mapped image (concurrency 1, a memory request,
// max-scale), on stock with the security context Pod Security restricted
// asks of its container (Lampyr's subset refuses one).
func handlerService(s *side, ns, svc, memory string, maxScale int) *unstructured.Unstructured {
	container := map[string]any{
		"image":     s.rowImage,
		"ports":     []any{map[string]any{"containerPort": int64(8080)}},
		"resources": map[string]any{"requests": map[string]any{"memory": memory}},
	}
	if s == the().stock {
		container["securityContext"] = map[string]any{
			"runAsNonRoot":             true,
			"allowPrivilegeEscalation": false,
			"capabilities":             map[string]any{"drop": []any{"ALL"}},
			"seccompProfile":           map[string]any{"type": "RuntimeDefault"},
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "serving.knative.dev/v1", "kind": "Service",
		"metadata": map[string]any{"name": svc, "namespace": ns},
		"spec": map[string]any{"template": map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{ly.AnnotationMaxScale: fmt.Sprint(maxScale)}},
			"spec": map[string]any{
				"containerConcurrency": int64(1),
				"containers":           []any{container},
			},
		}},
	}}
}

// applyAs applies u as t, aborting the row if it cannot.
func applyAs(ctx context.Context, t *tenant, u *unstructured.Unstructured) {
	must(t.c.Apply(ctx, e2eutil.KServices, u, fieldManager), t.user+" applying Service "+u.GetName())
}

// waitAnswering waits until svc.ns answers / with the handler's greeting
// through the gateway.
func waitAnswering(ctx context.Context, s *side, svc, ns string, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		code, body, err := gatewayGet(ctx, s, host(svc, ns), "/", nil)
		last = fmt.Sprintf("%d %q %v", code, short(body, 60), err)
		return err == nil && code == http.StatusOK && body == helloBody, nil
	})
	if err != nil {
		return fmt.Errorf("waiting %s for %s.%s to answer through the gateway (last: %s): %w", timeout, svc, ns, last, err)
	}
	return nil
}

// readyAndAnswering waits for Service ns/svc to be Ready and to answer.
func readyAndAnswering(ctx context.Context, s *side, t *tenant, svc string, timeout time.Duration) error {
	if _, err := t.c.WaitReady(ctx, e2eutil.KServices, t.ns, svc, timeout); err != nil {
		return err
	}
	return waitAnswering(ctx, s, svc, t.ns, 2*time.Minute)
}

// ---- /call ----

// callResult is the handler's /call answer (fixtures/cmd/handler CallResult).
type callResult struct {
	URL    string `json:"url"`
	Status int    `json:"status"`
	Body   string `json:"body"`
	Error  string `json:"error"`
}

func (c callResult) String() string {
	if c.Status != 0 {
		return fmt.Sprintf("%d %q", c.Status, short(firstLine(c.Body), 40))
	}
	return "no answer (" + c.Error + ")"
}

// verdict is what parity compares: answered or not, never the body.
func (c callResult) verdict() string {
	if c.Status != 0 {
		return fmt.Sprint(c.Status)
	}
	return "no answer"
}

// refusedByName: the fiber's resolver said the name does not exist, or
// the connection was refused or reset before any byte: the refusals
// docs/networking.md promises, not a timeout (which may also be a
// connection that was made but never answered).
func (c callResult) refusedByName() bool {
	return c.Status == 0 && (c.Error == "dns" || c.Error == "dns-failure" || c.Error == "connect")
}

// handlerCall has svc.ns's handler GET target (its /call) and returns what
// it got. An error is the gateway's or the handler's, not the call's.
func handlerCall(ctx context.Context, s *side, svc, ns, target string) (callResult, error) {
	code, body, err := gatewayGet(ctx, s, host(svc, ns), "/call?url="+url.QueryEscape(target), nil)
	if err != nil {
		return callResult{}, err
	}
	if code != http.StatusOK {
		return callResult{}, fmt.Errorf("%s.%s/call answered %d %q", svc, ns, code, short(body, 120))
	}
	var r callResult
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return callResult{}, fmt.Errorf("%s.%s/call answered %q: %w", svc, ns, short(body, 120), err)
	}
	return r, nil
}

// callUntil repeats a call until done says so or timeout passes, and
// returns the last result and how many calls it took. A first outbound
// call may wait for what carries it (Lampyr: the namespace's egress Pod,
// created on first use) longer than the handler's 10 s.
//
// A call the timeout cuts short is not counted: the last answer stands
// (a caller whose calls each take the handler's whole 10 s, as a dropped
// connection does, would otherwise end on the cut one and report no
// answer at all).
func callUntil(ctx context.Context, s *side, svc, ns, target string, timeout time.Duration, done func(callResult) bool) (callResult, int, error) {
	var last callResult
	var lastErr error
	answered := false
	tries := 0
	err := wait.PollUntilContextTimeout(ctx, 3*time.Second, timeout, true, func(pctx context.Context) (bool, error) {
		tries++
		r, err := handlerCall(pctx, s, svc, ns, target)
		if err != nil {
			if pctx.Err() == nil || !answered {
				lastErr = err
			}
			return false, nil
		}
		last, lastErr, answered = r, nil, true
		return done(r), nil
	})
	if err != nil && lastErr != nil {
		return last, tries, lastErr
	}
	return last, tries, nil
}

// ---- Pods a row runs ----

// startListener has t run `attacker listen` (a recorder answering
// everything) in its namespace, labelled role, and waits until it is
// Ready; it returns the Pod's name and IP.
func startListener(ctx context.Context, s *side, t *tenant, role string) (string, string) {
	ctr := corev1.Container{
		Name: "listen", Image: s.attacker, Args: []string{"listen", "--addr", ":8080"},
		Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/_seen", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 2},
	}
	return startPod(ctx, s, t, role, ctr)
}

// startPod has t run a restricted Pod of one container, labelled role, and
// waits until it is Ready.
func startPod(ctx context.Context, s *side, t *tenant, role string, ctr corev1.Container) (string, string) {
	p := restrictedPod(t.ns, role+"-", role, ctr)
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	created, err := t.c.Kube.CoreV1().Pods(t.ns).Create(ctx, p, metav1.CreateOptions{})
	must(err, t.user+" creating its "+role+" Pod")
	var last *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		last, err = s.admin.Kube.CoreV1().Pods(t.ns).Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range last.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return last.Status.PodIP != "", nil
			}
		}
		return false, nil
	})
	must(err, fmt.Sprintf("waiting 3m for %s Pod %s/%s to be Ready (phase %s)", role, t.ns, created.Name, phase(last)))
	return last.Name, last.Status.PodIP
}

// podSeen is the request count of a `attacker listen` Pod.
func podSeen(ctx context.Context, s *side, ns, pod string) (int, error) {
	b, err := s.admin.Kube.CoreV1().Pods(ns).ProxyGet("http", pod, "8080", "/_seen", nil).DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading /_seen of %s/%s: %w", ns, pod, err)
	}
	var r struct {
		Count int `json:"count"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, fmt.Errorf("/_seen of %s/%s answered %q: %w", ns, pod, b, err)
	}
	return r.Count, nil
}

// serviceFor is a ClusterIP Service port -> 8080 in front of the Pods
// labelled role.
func serviceFor(ns, svc, role string, port int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{roleLabel: role},
			Ports:    []corev1.ServicePort{{Name: "http", Port: port, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// restrictedDeployment runs replicas of one restricted container, labelled
// role.
func restrictedDeployment(ns, dep, role string, ctr corev1.Container) *appsv1.Deployment {
	p := restrictedPod(ns, "", role, ctr)
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	labels := map[string]string{roleLabel: role}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: dep, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: p.Spec},
		},
	}
}

// waitDeployment waits until ns/dep runs its replicas, all updated.
func waitDeployment(ctx context.Context, s *side, ns, dep string, timeout time.Duration) error {
	var last *appsv1.Deployment
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		d, err := s.admin.Kube.AppsV1().Deployments(ns).Get(ctx, dep, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = d
		want := ptr.Deref(d.Spec.Replicas, 1)
		st := d.Status
		return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == want && st.ReadyReplicas == want && st.AvailableReplicas == want && st.Replicas == want, nil
	})
	if err != nil {
		seen := "never seen"
		if last != nil {
			seen = fmt.Sprintf("%+v", last.Status)
		}
		return fmt.Errorf("waiting %s for Deployment %s/%s to roll out (status %s): %w", timeout, ns, dep, seen, err)
	}
	return nil
}

// ---- configuration the rows read ----

// installationConfig reads config-lampyr as the grant controller would
// (the keys the rows need; absent ones keep their defaults).
func installationConfig(ctx context.Context, s *side) (*lampyrconfig.Config, map[string]string) {
	cm, err := s.admin.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
	must(err, "reading config-lampyr")
	cfg, err := lampyrconfig.Parse(cm.Data, []string{lampyrconfig.KeyFiberMemoryCapacity, lampyrconfig.KeyMaxMemoryPerFiber, lampyrconfig.KeyDefaultMaxFibers, lampyrconfig.KeyGrantTTL})
	must(err, "parsing config-lampyr")
	return cfg, cm.Data
}

// setConfigKeys sets config-lampyr keys for a row and returns the func
// that puts back what was there (also registered for the finish step).
func setConfigKeys(ctx context.Context, s *side, set map[string]string) func() {
	before := map[string]*string{}
	err := editConfigMap(ctx, s.admin, contract.SystemNamespace, contract.ConfigMapName, false, func(d map[string]string) {
		for k, v := range set {
			if _, recorded := before[k]; !recorded {
				if old, ok := d[k]; ok {
					before[k] = &old
				} else {
					before[k] = nil
				}
			}
			d[k] = v
		}
	})
	must(err, "setting config-lampyr "+fmt.Sprint(set))
	var once sync.Once
	restore := func(ctx context.Context) error {
		var err error
		once.Do(func() {
			err = editConfigMap(ctx, s.admin, contract.SystemNamespace, contract.ConfigMapName, false, func(d map[string]string) {
				for k, v := range before {
					if v == nil {
						delete(d, k)
					} else {
						d[k] = *v
					}
				}
			})
		})
		return err
	}
	onFinish(restore)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := restore(ctx); err != nil {
			fmt.Fprintf(GinkgoWriter, "putting config-lampyr back: %v\n", err)
		}
	}
}

// randomDigest is a sha256 digest nothing was ever pushed under.
func randomDigest() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "sha256:" + hex.EncodeToString(b)
}

// revisionState is a Revision's verdict as a row reports it.
type revisionState struct {
	svc                string
	ready              cond
	resourcesAvailable cond
}

func (r revisionState) String() string {
	s := r.svc + ": " + r.ready.String()
	if r.ready.status != "True" && r.resourcesAvailable.status == "False" {
		s += "; " + r.resourcesAvailable.String() + " " + fmt.Sprintf("%q", short(r.resourcesAvailable.message, 110))
	} else if r.ready.status != "True" && r.ready.message != "" {
		s += " " + fmt.Sprintf("%q", short(r.ready.message, 110))
	}
	return s
}

// settle waits until Revision <svc>-00001 is Ready True or False and
// returns its state.
func settle(ctx context.Context, t *tenant, svc string, timeout time.Duration) revisionState {
	rev := svc + "-00001"
	var st revisionState
	_, err := waitRevision(ctx, t.c, t.ns, rev, "to settle (Ready True or False)", timeout, func(u *unstructured.Unstructured) (cond, bool) {
		st = revisionState{svc: svc, ready: revisionCond(u, "Ready"), resourcesAvailable: revisionCond(u, "ResourcesAvailable")}
		return st.ready, st.ready.status == "True" || st.ready.status == "False"
	})
	must(err, "the verdict on "+t.ns+"/"+rev)
	return st
}

// readyNames are the Services of states whose Revision is Ready, sorted.
func readyNames(states []revisionState) []string {
	var out []string
	for _, s := range states {
		if s.ready.status == "True" {
			out = append(out, s.svc)
		}
	}
	sort.Strings(out)
	return out
}
