package tenancy

// G2, G7, G8: a Lampyr Service's connections meet the NetworkPolicies a Pod
// of its namespace would meet (issue 31 design §2: they leave through the
// namespace's egress Pod), no tenant captures a Home's or fiber-router's
// address with spec.externalIPs, and denied names hold along ExternalName
// targets.

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"lampyr.dev/serving/clusters/e2eutil"
)

// ---- G2 NetworkPolicy ----

// npRows is the three NetworkPolicy rows' shared setup per side: A's db
// behind "ingress only from Pods of this namespace", A's open Service (no
// policy: G2c's target, so that only A's own egress policy can stop the
// call), B's own echo (B's control), and each tenant's caller Service. Made by the first of the rows
// to run (on any order, or alone) and dropped by G2c when it passes.
var npRows = struct {
	sync.Mutex
	by map[string]*npSetup
}{by: map[string]*npSetup{}}

type npSetup struct{ a, b *tenant }

// dbURL is A's db as any Pod of the cluster names it.
var dbURL = "http://db." + nsNPA + ".svc.cluster.local/"

// openURL is A's open Service (a listener no policy selects).
var openURL = "http://open." + nsNPA + ".svc.cluster.local/"

// caller is each row's Knative Service that makes the calls (the fixture
// handler's /call).
const caller = "caller"

func ensureNP(ctx context.Context, s *side) *npSetup {
	npRows.Lock()
	st := npRows.by[s.name]
	npRows.Unlock()
	if st != nil {
		_, errA := st.a.c.Dynamic.Resource(e2eutil.KServices).Namespace(nsNPA).Get(ctx, caller, metav1.GetOptions{})
		_, errP := s.admin.Kube.NetworkingV1().NetworkPolicies(nsNPA).Get(ctx, "db-same-namespace", metav1.GetOptions{})
		if errA == nil && errP == nil {
			return st
		}
	}
	a, b := rowTenant(ctx, s, nsNPA), rowTenant(ctx, s, nsNPB)
	db := corev1.Container{Name: "db", Image: s.rowImage, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}
	_, err := a.c.Kube.AppsV1().Deployments(nsNPA).Create(ctx, restrictedDeployment(nsNPA, "db", "db", db), metav1.CreateOptions{})
	must(err, "tenant A creating Deployment db")
	_, err = a.c.Kube.CoreV1().Services(nsNPA).Create(ctx, serviceFor(nsNPA, "db", "db", 80), metav1.CreateOptions{})
	must(err, "tenant A creating Service db")
	// The policy the issue names: ingress to db only from Pods of this
	// namespace.
	policy := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "db-same-namespace", Namespace: nsNPA},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{roleLabel: "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}},
		},
	}
	_, err = a.c.Kube.NetworkingV1().NetworkPolicies(nsNPA).Create(ctx, policy, metav1.CreateOptions{})
	must(err, "tenant A creating NetworkPolicy db-same-namespace")
	startListener(ctx, s, a, "open")
	_, err = a.c.Kube.CoreV1().Services(nsNPA).Create(ctx, serviceFor(nsNPA, "open", "open", 80), metav1.CreateOptions{})
	must(err, "tenant A creating Service open")
	startListener(ctx, s, b, "echo")
	_, err = b.c.Kube.CoreV1().Services(nsNPB).Create(ctx, serviceFor(nsNPB, "echo", "echo", 80), metav1.CreateOptions{})
	must(err, "tenant B creating Service echo")
	applyAs(ctx, a, handlerService(s, nsNPA, caller, "64Mi", 1))
	applyAs(ctx, b, handlerService(s, nsNPB, caller, "64Mi", 1))
	must(waitDeployment(ctx, s, nsNPA, "db", 3*time.Minute), "A's db")
	for _, t := range []*tenant{a, b} {
		must(readyAndAnswering(ctx, s, t, caller, 5*time.Minute), t.ns+"'s caller")
	}
	st = &npSetup{a: a, b: b}
	npRows.Lock()
	npRows.by[s.name] = st
	npRows.Unlock()
	return st
}

// answered200: the handler's greeting came back.
func answered200(r callResult) bool { return r.Status == 200 && r.Body == helloBody }

func npOwnDB(ctx context.Context, s *side) (string, string, bool) {
	ensureNP(ctx, s)
	r, tries, err := callUntil(ctx, s, caller, nsNPA, dbURL, 2*time.Minute, answered200)
	must(err, "A's caller")
	// A control: refused means the path did not work.
	return fmt.Sprintf("A → %s: %s (%d calls)", dbURL, r, tries), r.verdict(), !answered200(r)
}

func npOtherDB(ctx context.Context, s *side) (string, string, bool) {
	ensureNP(ctx, s)
	echo := "http://echo." + nsNPB + ".svc.cluster.local/_seen"
	ctl, tries, err := callUntil(ctx, s, caller, nsNPB, echo, 2*time.Minute, func(r callResult) bool { return r.Status == 200 })
	must(err, "B's caller")
	if ctl.Status != 200 {
		abortf("control failed: B's caller does not reach its own echo (%s after %d calls), so a refusal to A's db proves nothing", ctl, tries)
	}
	var rs []string
	refused := true
	verdict := ""
	for range 2 {
		r, err := handlerCall(ctx, s, caller, nsNPB, dbURL)
		must(err, "B's caller")
		rs = append(rs, r.String())
		refused = refused && r.Status == 0
		if verdict == "" || r.Status != 0 {
			verdict = r.verdict()
		}
	}
	return fmt.Sprintf("B → its own echo: %d (%d calls); B → A's db: %s", ctl.Status, tries, strings.Join(rs, ", ")), verdict, refused
}

func npOwnEgress(ctx context.Context, s *side) (string, string, bool) {
	st := ensureNP(ctx, s)
	// A's open Service: no ingress policy selects it, so only A's own
	// egress policy can stop the call, wherever the call leaves from.
	answered := func(r callResult) bool { return r.Status == 200 }
	before, tries, err := callUntil(ctx, s, caller, nsNPA, openURL, 2*time.Minute, answered)
	must(err, "A's caller before the policy")
	if !answered(before) {
		abortf("A's call to its open Service got no answer before the egress policy (%s after %d calls): nothing for the policy to stop", before, tries)
	}
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-deny-egress", Namespace: nsNPA},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{
				{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))},
				{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(53))},
			}}},
		},
	}
	policies := st.a.c.Kube.NetworkingV1().NetworkPolicies(nsNPA)
	_, err = policies.Create(ctx, deny, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = nil
	}
	must(err, "tenant A creating NetworkPolicy default-deny-egress")
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.admin.Kube.NetworkingV1().NetworkPolicies(nsNPA).Delete(dctx, deny.Name, metav1.DeleteOptions{})
	}()
	t0 := time.Now()
	// The enforcer applies a new policy within seconds.
	after, n, err := callUntil(ctx, s, caller, nsNPA, openURL, 90*time.Second, func(r callResult) bool { return r.Status == 0 })
	must(err, "A's caller with the policy")
	took := time.Since(t0).Round(time.Second)
	again, err := handlerCall(ctx, s, caller, nsNPA, openURL)
	must(err, "A's caller with the policy")
	obs := fmt.Sprintf("before: %s; with A's default-deny egress: %s (%d calls, %s), then %s", before, after, n, took, again)
	verdict := before.verdict() + " then " + after.verdict()
	refused := after.Status == 0 && again.Status == 0
	if refused {
		npRows.Lock()
		delete(npRows.by, s.name)
		npRows.Unlock()
		defer dropRow(s, nsNPA, nsNPB)
	}
	return obs, verdict, refused
}

// ---- G7 externalIPs ----

// captureTarget is an address a tenant's Service claims with externalIPs.
type captureTarget struct {
	what string
	ip   string
	port int32
}

func externalIPs(ctx context.Context, s *side) (string, bool) {
	t := rowTenant(ctx, s, nsXIP)
	pod, _ := startListener(ctx, s, t, "capture")
	var targets []captureTarget
	want := helloBody
	if s == the().stock {
		want = stockBody(nsB)
		acts, err := s.admin.Kube.CoreV1().Pods("knative-serving").List(ctx, metav1.ListOptions{LabelSelector: "app=activator"})
		must(err, "listing the activator's Pods")
		targets = append(targets, captureTarget{"B's Pod (queue-proxy)", s.victimPodB.Status.PodIP, 8012})
		for _, p := range acts.Items {
			if p.Status.PodIP != "" {
				targets = append(targets, captureTarget{"the activator", p.Status.PodIP, 8012})
				break
			}
		}
	} else {
		targets = []captureTarget{{"B's Home", s.homeB.Status.PodIP, 9090}, {"fiber-router", s.routerIPs[0], 80}}
	}
	before, err := podSeen(ctx, s, nsXIP, pod)
	must(err, "reading the capturing Pod's record")
	var notes, created []string
	allForbidden := true
	for i, tg := range targets {
		svc := serviceFor(nsXIP, fmt.Sprintf("capture-%d", i), "capture", tg.port)
		svc.Spec.ExternalIPs = []string{tg.ip}
		_, err := t.c.Kube.CoreV1().Services(nsXIP).Create(ctx, svc, metav1.CreateOptions{})
		hp := net.JoinHostPort(tg.ip, fmt.Sprint(tg.port))
		switch {
		case err == nil:
			created = append(created, svc.Name)
			allForbidden = false
			notes = append(notes, fmt.Sprintf("%s %s: admitted", tg.what, hp))
		case apierrors.IsForbidden(err):
			notes = append(notes, fmt.Sprintf("%s %s: Forbidden (%s)", tg.what, hp, short(err.Error(), 90)))
		default:
			allForbidden = false
			notes = append(notes, fmt.Sprintf("%s %s: %s (%s)", tg.what, hp, errText(err), short(err.Error(), 90)))
		}
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, n := range created {
			_ = s.admin.Kube.CoreV1().Services(nsXIP).Delete(dctx, n, metav1.DeleteOptions{})
		}
	}()
	if len(created) > 0 {
		// kube-proxy programs an admitted Service within moments.
		time.Sleep(5 * time.Second)
	}
	handled, tally := gatewayTally(ctx, s, victim, nsB, 10, want)
	after, err := podSeen(ctx, s, nsXIP, pod)
	must(err, "reading the capturing Pod's record")
	obs := fmt.Sprintf("%s; B's victim %d/10 answered (%s); the capturing Pod saw %d", strings.Join(notes, "; "), handled, tally, after-before)
	ok := allForbidden && handled == 10 && after == before
	if ok {
		defer dropRow(s, nsXIP)
	}
	return obs, ok
}

// ---- G8 ExternalName ----

func externalNameRow(ctx context.Context, s *side) (string, bool) {
	t := rowTenant(ctx, s, nsXName)
	startListener(ctx, s, t, "listener")
	svcs := []*corev1.Service{
		serviceFor(nsXName, "listener", "listener", 80),
		externalName("alias", "listener."+nsXName+".svc.cluster.local", 80),
		externalName("kdns", "kube-dns.kube-system.svc.cluster.local", 53, 9153),
		externalName("hook", "webhook.knative-serving.svc.cluster.local", 443),
	}
	for _, svc := range svcs {
		_, err := t.c.Kube.CoreV1().Services(nsXName).Create(ctx, svc, metav1.CreateOptions{})
		must(err, t.user+" creating Service "+svc.Name)
	}
	applyAs(ctx, t, handlerService(s, nsXName, caller, "64Mi", 1))
	must(readyAndAnswering(ctx, s, t, caller, 5*time.Minute), "the caller")
	// Control: an ExternalName to A's own Service answers, so a refusal
	// below is the name's target, not ExternalName as such.
	alias := "http://alias." + nsXName + ".svc.cluster.local/_seen"
	ctl, tries, err := callUntil(ctx, s, caller, nsXName, alias, 2*time.Minute, func(r callResult) bool { return r.Status == 200 })
	must(err, "the caller's control call")
	if ctl.Status != 200 {
		abortf("control failed: the ExternalName to A's own listener did not answer (%s after %d calls), so a refusal proves nothing", ctl, tries)
	}
	var notes []string
	refused := true
	for _, target := range []string{
		"http://kdns." + nsXName + ".svc.cluster.local:53/",
		"http://kdns." + nsXName + ".svc.cluster.local:9153/metrics",
		"http://hook." + nsXName + ".svc.cluster.local:443/",
	} {
		r, err := handlerCall(ctx, s, caller, nsXName, target)
		must(err, "the caller")
		notes = append(notes, strings.TrimPrefix(target, "http://")+" → "+r.String())
		refused = refused && r.refusedByName()
	}
	obs := fmt.Sprintf("control alias → A's listener: %d; %s", ctl.Status, strings.Join(notes, "; "))
	if refused {
		defer dropRow(s, nsXName)
	}
	return obs, refused
}

// externalName is an ExternalName Service svc.nsXName → target.
func externalName(svc, target string, ports ...int32) *corev1.Service {
	var ps []corev1.ServicePort
	for _, p := range ports {
		ps = append(ps, corev1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p})
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: nsXName},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: target, Ports: ps},
	}
}
