package tenancy

// G3-G6: no tenant takes another's share of the installation's capacity,
// of the grant controller's time, of fiber-router's table or of a Home's
// processes (issue 31 design §3, §4). Lampyr only: stock has none of these
// shared parts (its equivalents are the node's and the API server's).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	. "github.com/onsi/ginkgo/v2"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/ly"
)

// ---- G3 capacity hog ----

// namespaceShareKey is config-lampyr's per-namespace share of the
// installation's fiber memory (issue 31 design §3).
const namespaceShareKey = "namespace-fiber-memory-share"

// hogShare is the share the row sets for its run: B's hog (2Gi x 2) fits
// in it, so only "booked after the template verifies" keeps it from
// holding capacity; B's greedy Service (2Gi x 3) does not.
const hogShare = "4Gi"

// conditionsOf reads a Revision's Ready, ContainerHealthy and
// ResourcesAvailable as c sees them.
func conditionsOf(ctx context.Context, c *e2eutil.Clients, ns, rev string) []cond {
	u, err := c.Dynamic.Resource(e2eutil.Revisions).Namespace(ns).Get(ctx, rev, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return []cond{revisionCond(u, "Ready"), revisionCond(u, "ContainerHealthy"), revisionCond(u, "ResourcesAvailable")}
}

// reserved is what an admitted grant books: memoryPerFiber x maxFibers
// (maxFibers 0: the installation's default), 0 when not admitted.
func reserved(g *unstructured.Unstructured, defaultMaxFibers int64) (int64, bool) {
	if st, _, _ := e2eutil.Condition(g, "Admitted"); st != "True" {
		return 0, false
	}
	mem, _, _ := unstructured.NestedString(g.Object, "spec", "memoryPerFiber")
	q, err := resource.ParseQuantity(mem)
	if err != nil {
		return 0, true
	}
	n, _, _ := unstructured.NestedInt64(g.Object, "spec", "maxFibers")
	if n == 0 {
		n = defaultMaxFibers
	}
	return q.Value() * n, true
}

// installationLeaks says what in a refusal message a tenant must not
// learn: the installation's capacity, how much of it is free, other
// tenants' namespaces.
func installationLeaks(msg string, capacity resource.Quantity, others []string) []string {
	var out []string
	if c := capacity.String(); regexp.MustCompile(`(^|[^0-9.])` + regexp.QuoteMeta(c) + `\b`).MatchString(msg) {
		out = append(out, "names the installation's capacity "+c)
	}
	if regexp.MustCompile(`(?i)(installation[^.;]*\bfree\b|\bfree\b[^.;]*installation|\b(is|are) free\b)`).MatchString(msg) {
		out = append(out, "says how much of the installation is free")
	}
	for _, ns := range others {
		if strings.Contains(msg, ns) {
			out = append(out, "names namespace "+ns)
		}
	}
	return out
}

func capacityHog(ctx context.Context, s *side) (string, bool) {
	a, b := rowTenant(ctx, s, nsHogA), rowTenant(ctx, s, nsHogB)
	restore := setConfigKeys(ctx, s, map[string]string{namespaceShareKey: hogShare})
	defer restore()
	cfg, _ := installationConfig(ctx, s)
	share := resource.MustParse(hogShare)

	// B's hog: template and snapshot digests nothing was pushed under.
	inst, err := readInstallation(ctx, b.c)
	must(err, "tenant B reading the installation")
	snap := s.registry + "/" + nsHogB + "/handler-snapshot@" + randomDigest()
	tmpl := inst.templateRepo + "@" + randomDigest()
	p := *the().project
	p.Name, p.Memory = "hog", "2Gi"
	two := int32(2)
	p.MaxScale = &two
	applyAs(ctx, b, ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: nsHogB, Image: snap, Snapshot: snap, Template: tmpl, Public: true}))
	hog, err := waitRevision(ctx, b.c, nsHogB, "hog-00001", "to be refused (ContainerHealthy or ResourcesAvailable False)", 4*time.Minute, func(u *unstructured.Unstructured) (cond, bool) {
		for _, typ := range []string{"ContainerHealthy", "ResourcesAvailable"} {
			if c := revisionCond(u, typ); c.status == "False" {
				return c, true
			}
		}
		return revisionCond(u, "Ready"), false
	})
	if err != nil {
		// Not refused yet (a registry it keeps retrying) is no reason to
		// stop: what counts is whether it holds capacity.
		fmt.Fprintf(GinkgoWriter, "%s: B's hog: %v\n", s.name, err)
	}
	grants := s.admin.Dynamic.Resource(contract.CapacityGrants)
	hogHeld := int64(0)
	hogAdmitted := false
	if g, err := grants.Namespace(nsHogB).Get(ctx, "hog-00001", metav1.GetOptions{}); err == nil {
		hogHeld, hogAdmitted = reserved(g, int64(cfg.DefaultMaxFibers))
	}

	// B's greedy: a real snapshot, more than B's share.
	applyAs(ctx, b, handlerService(s, nsHogB, "greedy", "2Gi", 3))
	greedy := settle(ctx, b, "greedy", 4*time.Minute)

	// A's next: as much as fits in A's share and in what the installation
	// would have free without B's hog.
	all, err := grants.List(ctx, metav1.ListOptions{})
	must(err, "listing every CapacityGrant")
	used := int64(0)
	for i := range all.Items {
		n, _ := reserved(&all.Items[i], int64(cfg.DefaultMaxFibers))
		used += n
	}
	free := cfg.FiberMemoryCapacity.Value() - (used - hogHeld)
	ask := min(share.Value(), free) - 512<<20
	perFiber := min(ask/2, cfg.MaxMemoryPerFiber.Value()) >> 20 // MiB
	if perFiber < 64 {
		abortf("the installation has %s free without B's hog: no room for A's next Service (2 fibers of at least 64Mi), so the row proves nothing", bytesText(free))
	}
	applyAs(ctx, a, handlerService(s, nsHogA, "next", fmt.Sprintf("%dMi", perFiber), 2))
	next := settle(ctx, a, "next", 5*time.Minute)
	answered := 0
	if next.ready.status == "True" {
		if waitAnswering(ctx, s, "next", nsHogA, 2*time.Minute) == nil {
			answered, _ = gatewayTally(ctx, s, "next", nsHogA, 3, helloBody)
		}
	}

	// What B was told, on its Revisions and (if edit may read them) its
	// grants.
	var told []string
	for _, rev := range []string{"hog-00001", "greedy-00001"} {
		for _, c := range conditionsOf(ctx, b.c, nsHogB, rev) {
			if c.message != "" {
				told = append(told, c.message)
			}
		}
		if g, err := b.c.Dynamic.Resource(contract.CapacityGrants).Namespace(nsHogB).Get(ctx, rev, metav1.GetOptions{}); err == nil {
			conds, _, _ := unstructured.NestedSlice(g.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m != nil {
					if msg, _ := m["message"].(string); msg != "" {
						told = append(told, msg)
					}
				}
			}
		}
	}
	var leaks []string
	for _, m := range told {
		for _, l := range installationLeaks(m, cfg.FiberMemoryCapacity, []string{nsHogA, nsA, nsB}) {
			leaks = append(leaks, fmt.Sprintf("%s: %q", l, short(m, 120)))
		}
	}
	leakText := "B's refusals name no installation-wide figure"
	if len(leaks) > 0 {
		leakText = "B was told: " + strings.Join(slices.Compact(leaks), "; ")
	}
	obs := fmt.Sprintf("B's hog (2Gi x 2, digests that do not exist): %v %q, grant admitted=%t (holds %s); B's greedy (2Gi x 3, share %s): %s; A's next (2 x %dMi; %s free without the hog): %s, %d/3 answered; %s",
		hog, short(hog.message, 90), hogAdmitted, bytesText(hogHeld), hogShare, greedy, perFiber, bytesText(free), next, answered, leakText)
	ok := !hogAdmitted && greedy.ready.status == "False" && next.ready.status == "True" && answered == 3 && len(leaks) == 0
	if ok {
		defer dropRow(s, nsHogA, nsHogB)
	}
	return obs, ok
}

func bytesText(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

// ---- G4 registry tarpit ----

// tarpitRevisions is how many Revisions B points at its tarpit.
const tarpitRevisions = 30

// tarpitMinute is one minute of the tarpit row's record.
type tarpitMinute struct {
	ok, failed int
	errs       map[string]int
	expiresAt  string
	accepted   int
}

// tarpitStats is the tarpit's GET /stats (fixtures/cmd/attacker TarpitStats).
type tarpitStats struct {
	Accepted int `json:"accepted"`
	Open     int `json:"open"`
}

func registryTarpit(ctx context.Context, s *side) (string, bool) {
	d, err := parseTarpitDuration(suite.Options().Knobs[tarpitVar])
	if err != nil {
		abortf("%v", err)
	}
	a, b := rowTenant(ctx, s, nsTarA), rowTenant(ctx, s, nsTarB)
	applyAs(ctx, a, handlerService(s, nsTarA, "steady", "64Mi", 1))
	must(readyAndAnswering(ctx, s, a, "steady", 5*time.Minute), "A's steady Service")
	cfg, _ := installationConfig(ctx, s)

	// B's registry that never answers, in B's own namespace.
	ctr := corev1.Container{
		Name: "tarpit", Image: s.attacker, Args: []string{"tarpit", "--addr", ":5000", "--stats", ":8080"},
		Ports:          []corev1.ContainerPort{{Name: "registry", ContainerPort: 5000}, {Name: "stats", ContainerPort: 8080}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/stats", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 2},
	}
	tarpit, ip := startPod(ctx, s, b, "tarpit", ctr)
	registry := net.JoinHostPort(ip, "5000")
	stats := func() (tarpitStats, error) {
		var st tarpitStats
		raw, err := s.admin.Kube.CoreV1().Pods(nsTarB).ProxyGet("http", tarpit, "8080", "/stats", nil).DoRaw(ctx)
		if err == nil {
			err = json.Unmarshal(raw, &st)
		}
		return st, err
	}
	p := *the().project
	p.Memory = "64Mi"
	one := int32(1)
	p.MaxScale = &one
	for i := range tarpitRevisions {
		p.Name = fmt.Sprintf("tarpit-%02d", i+1)
		snap := registry + "/tarpit/handler-snapshot@" + randomDigest()
		tmpl := registry + "/tarpit/template@" + randomDigest()
		applyAs(ctx, b, ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: nsTarB, Image: snap, Snapshot: snap, Template: tmpl, Public: true}))
	}

	// A meanwhile: a request every 2 s, its grant every 15 s, the
	// tarpit's count every minute.
	grant := s.admin.Dynamic.Resource(contract.CapacityGrants).Namespace(nsTarA)
	var minutes []*tarpitMinute
	var expiries []string
	past, requests, failures := 0, 0, 0
	var lastGrantErr error
	start := time.Now()
	nextGrant, nextStats := start, start
	for time.Since(start) < d {
		if ctx.Err() != nil {
			abortf("interrupted after %s of %s", time.Since(start).Round(time.Second), d)
		}
		t0 := time.Now()
		m := int(t0.Sub(start) / time.Minute)
		for len(minutes) <= m {
			minutes = append(minutes, &tarpitMinute{errs: map[string]int{}})
		}
		cur := minutes[m]
		code, body, err := gatewayGet(ctx, s, host("steady", nsTarA), "/", nil)
		requests++
		switch {
		case err != nil:
			cur.failed++
			cur.errs["error "+classify(err.Error())]++
		case code == http.StatusOK && body == helloBody:
			cur.ok++
		default:
			cur.failed++
			cur.errs[fmt.Sprintf("%d %q", code, short(firstLine(body), 30))]++
		}
		if !t0.Before(nextGrant) {
			nextGrant = nextGrant.Add(15 * time.Second)
			g, err := grant.Get(ctx, "steady-00001", metav1.GetOptions{})
			if err != nil {
				lastGrantErr = err
			} else {
				exp, _, _ := unstructured.NestedString(g.Object, "status", "expiresAt")
				cur.expiresAt = exp
				if len(expiries) == 0 || expiries[len(expiries)-1] != exp {
					expiries = append(expiries, exp)
				}
				if at, err := time.Parse(time.RFC3339, exp); err != nil || !at.After(time.Now()) {
					past++
				}
			}
		}
		if !t0.Before(nextStats) {
			nextStats = nextStats.Add(time.Minute)
			if st, err := stats(); err == nil {
				cur.accepted = st.Accepted
			}
		}
		time.Sleep(time.Until(t0.Add(2 * time.Second)))
	}
	for _, mi := range minutes {
		failures += mi.failed
	}
	st, err := stats()
	must(err, "reading the tarpit's count")
	if st.Accepted == 0 {
		abortf("the tarpit at %s was never dialled in %s: B's Revisions did not reach the grant controller's fetch, so A's record proves nothing", registry, d)
	}
	// B's Revisions, as B sees them.
	bStates := map[string]int{}
	for i := range tarpitRevisions {
		c := conditionsOf(ctx, b.c, nsTarB, fmt.Sprintf("tarpit-%02d-00001", i+1))
		if len(c) == 0 {
			bStates["not found"]++
			continue
		}
		k := c[0].String()
		if c[1].status == "False" {
			k = c[1].String()
		}
		bStates[k]++
	}
	// A grant renewed every grant-renew-interval (at most half its TTL)
	// moves at least this often.
	moves := len(expiries) - 1
	every := cfg.GrantTTL - cfg.RenewBefore()
	wantMoves := max(int(d/every)-1, 0)
	table := tarpitTable(minutes)
	writeTarpitRecord(s, d, minutes)
	grantText := fmt.Sprintf("A's grant expiresAt moved %d times (want >= %d, renewed every %s): %s; seen in the past %d times", moves, wantMoves, every, strings.Join(expiries, " → "), past)
	if lastGrantErr != nil && len(expiries) == 0 {
		grantText = "A's grant never read: " + lastGrantErr.Error()
	}
	obs := fmt.Sprintf("for %s: A answered %d/%d (%d errors); per minute answered/failed: %s; %s; the tarpit accepted %d connections (%d held at the end); B's %d Revisions: %s",
		d.Round(time.Second), requests-failures, requests, failures, table, grantText, st.Accepted, st.Open, tarpitRevisions, tallyText(bStates))
	ok := failures == 0 && past == 0 && moves >= wantMoves && len(expiries) > 0
	if ok {
		defer dropRow(s, nsTarA, nsTarB)
	}
	return obs, ok
}

// tarpitTable is the per-minute record, compact: "ok/failed" per minute,
// failures' kinds in brackets.
func tarpitTable(minutes []*tarpitMinute) string {
	var parts []string
	for _, m := range minutes {
		p := fmt.Sprintf("%d/%d", m.ok, m.failed)
		if len(m.errs) > 0 {
			p += " [" + tallyText(m.errs) + "]"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// writeTarpitRecord keeps the row's minute-by-minute record beside the
// report (_artifacts/tenancy/tarpit-<cluster>.md).
func writeTarpitRecord(s *side, d time.Duration, minutes []*tarpitMinute) {
	dir := suite.Artifacts()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Registry tarpit on %s, %s\n\nTenant B's %d Revisions name a registry that never answers; tenant A's Service meanwhile.\n\n", s.name, d, tarpitRevisions)
	b.WriteString("| minute | A answered | A failed | failures | A's grant expiresAt (last read) | tarpit connections accepted (so far) |\n|---|---|---|---|---|---|\n")
	for i, m := range minutes {
		acc := "-"
		if m.accepted > 0 {
			acc = fmt.Sprint(m.accepted)
		}
		fmt.Fprintf(&b, "| %d | %d | %d | %s | %s | %s |\n", i+1, m.ok, m.failed, cell(tallyText(m.errs)), m.expiresAt, acc)
	}
	_ = os.WriteFile(filepath.Join(dir, "tarpit-"+s.name+".md"), []byte(b.String()), 0o644)
}

// ---- G5 router table ----

// routerNSBound is the per-namespace bound the row gives fiber-router;
// routerSlack covers a Revision the table drops or gains meanwhile.
const (
	routerNSBound = 3
	routerSlack   = 1
)

// errRouterFlag: fiber-router did not start with the flag given (an
// fiber-router without a per-namespace bound refuses the unknown flag).
var errRouterFlag = errors.New("fiber-router did not start with --max-revisions-per-namespace")

// withRouterBounds replaces args' table bounds with max (and perNS, when
// positive).
func withRouterBounds(args []string, max, perNS int) []string {
	var out []string
	for _, a := range args {
		if strings.HasPrefix(a, "--max-revisions=") || strings.HasPrefix(a, "--max-revisions-per-namespace=") {
			continue
		}
		out = append(out, a)
	}
	out = append(out, fmt.Sprintf("--max-revisions=%d", max))
	if perNS > 0 {
		out = append(out, fmt.Sprintf("--max-revisions-per-namespace=%d", perNS))
	}
	return out
}

// setRouterArgs rolls fiber-router out with args and waits for it. A Pod
// with these args that exits (an unknown flag) ends the wait with
// errRouterFlag.
func setRouterArgs(ctx context.Context, s *side, args []string) error {
	deps := s.admin.Kube.AppsV1().Deployments(contract.SystemNamespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := deps.Get(ctx, "fiber-router", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range d.Spec.Template.Spec.Containers {
			if d.Spec.Template.Spec.Containers[i].Name == "fiber-router" {
				d.Spec.Template.Spec.Containers[i].Args = args
			}
		}
		_, err = deps.Update(ctx, d, metav1.UpdateOptions{FieldManager: fieldManager})
		return err
	})
	if err != nil {
		return fmt.Errorf("updating Deployment %s/fiber-router: %w", contract.SystemNamespace, err)
	}
	// A Pod of the new template whose router exited or restarted.
	crashed := func(ctx context.Context) bool {
		pods, err := s.admin.Kube.CoreV1().Pods(contract.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=fiber-router"})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if !slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "fiber-router" && slices.Equal(c.Args, args) }) {
				continue
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "fiber-router" && (cs.RestartCount > 0 || cs.State.Terminated != nil) {
					return true
				}
			}
		}
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- waitDeployment(rctx, s, contract.SystemNamespace, "fiber-router", 5*time.Minute) }()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--max-revisions-per-namespace=") }) && crashed(ctx) {
				cancel()
				<-done
				return errRouterFlag
			}
		}
	}
}

func routerTable(ctx context.Context, s *side) (string, bool) {
	a, b := rowTenant(ctx, s, nsRTA), rowTenant(ctx, s, nsRTB)
	dep, err := s.admin.Kube.AppsV1().Deployments(contract.SystemNamespace).Get(ctx, "fiber-router", metav1.GetOptions{})
	must(err, "reading Deployment fiber-router")
	var orig []string
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == "fiber-router" {
			orig = append([]string(nil), c.Args...)
		}
	}
	var once sync.Once
	restore := func(ctx context.Context) error {
		var err error
		once.Do(func() { err = setRouterArgs(ctx, s, orig) })
		return err
	}
	onFinish(restore)
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		if err := restore(rctx); err != nil {
			fmt.Fprintf(GinkgoWriter, "putting fiber-router's arguments back: %v\n", err)
		}
	}()
	held, err := s.admin.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: contract.RouterMetadataLabel + "=true"})
	must(err, "counting router metadata")
	// Room for what the table holds now, B's bound, A's new Revision and
	// the slack, and not one more: without a per-namespace bound, B's
	// Revisions take the rest.
	total := len(held.Items) + routerNSBound + 1 + routerSlack
	perNS := true
	err = setRouterArgs(ctx, s, withRouterBounds(orig, total, routerNSBound))
	if errors.Is(err, errRouterFlag) {
		perNS = false
		must(setRouterArgs(ctx, s, withRouterBounds(orig, total, 0)), "rolling fiber-router out with --max-revisions alone")
	} else {
		must(err, "rolling fiber-router out with small table bounds")
	}

	// More than the room left without a per-namespace bound, with a margin
	// for metadata the table holds fewer of than there are ConfigMaps.
	nB := routerNSBound + 2 + 2*routerSlack
	for i := range nB {
		applyAs(ctx, b, handlerService(s, nsRTB, fmt.Sprintf("fill-%d", i+1), "64Mi", 1))
	}
	// Every one of B's Revisions runs (its Home is up and its router
	// metadata published), but a Service whose Revision the router refused
	// does not become Ready: the router answers a KIngress probe naming
	// it 503 ("not yet"), so its Route stays "Waiting for load balancer".
	// Wait for the Revisions, then for as many Services as the bound lets
	// in.
	bRevs := 0
	for i := range nB {
		if st := settle(ctx, b, fmt.Sprintf("fill-%d", i+1), 6*time.Minute); st.ready.status == "True" {
			bRevs++
		}
	}
	bReady := 0
	_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		bReady = 0
		for i := range nB {
			if u, err := b.c.Dynamic.Resource(e2eutil.KServices).Namespace(nsRTB).Get(ctx, fmt.Sprintf("fill-%d", i+1), metav1.GetOptions{}); err == nil && e2eutil.IsReady(u) {
				bReady++
			}
		}
		return bReady >= min(routerNSBound, bRevs), nil
	})
	// Ready means published; give the routers' informers a moment.
	time.Sleep(5 * time.Second)
	// Each Service is asked six times, so both fiber-router replicas
	// answer: a Ready Service one of them refuses (404) is the defect of
	// replicas holding different Revisions at the bound (each used to
	// take them first come, first served, in its own informer's order).
	bAnswered, b404 := 0, 0
	var readyRefused []string
	for i := range nB {
		name := fmt.Sprintf("fill-%d", i+1)
		u, err := b.c.Dynamic.Resource(e2eutil.KServices).Namespace(nsRTB).Get(ctx, name, metav1.GetOptions{})
		ready := err == nil && e2eutil.IsReady(u)
		codes := map[int]int{}
		for range 6 {
			code, _, _ := gatewayGet(ctx, s, host(name, nsRTB), "/", nil)
			codes[code]++
		}
		switch {
		case codes[http.StatusOK] == 6:
			bAnswered++
		case codes[http.StatusNotFound] == 6:
			b404++
		}
		// 404 is the router not holding the Revision; anything else
		// (a fiber that failed to start) is in the tally, not this defect.
		if ready && codes[http.StatusNotFound] > 0 {
			readyRefused = append(readyRefused, fmt.Sprintf("%s %v", name, codes))
		}
	}
	applyAs(ctx, a, handlerService(s, nsRTA, "late", "64Mi", 1))
	late := settle(ctx, a, "late", 5*time.Minute)
	// Without a per-namespace bound A's Revision runs but the full table
	// refuses it: its Service never becomes Ready and it answers 404.
	// That is the attack's success, so it is observed, not aborted on.
	aService := "Ready"
	if _, err := a.c.WaitReady(ctx, e2eutil.KServices, nsRTA, "late", 3*time.Minute); err != nil {
		aService = "not Ready (" + short(err.Error(), 160) + ")"
	} else {
		_ = waitAnswering(ctx, s, "late", nsRTA, time.Minute)
	}
	handled, tally := gatewayTally(ctx, s, "late", nsRTA, 5, helloBody)
	bound := fmt.Sprintf("--max-revisions=%d (%d held before), --max-revisions-per-namespace=%d", total, len(held.Items), routerNSBound)
	if !perNS {
		bound = fmt.Sprintf("fiber-router refused --max-revisions-per-namespace (no per-namespace bound); --max-revisions=%d alone (%d held before)", total, len(held.Items))
	}
	obs := fmt.Sprintf("%s; B's %d Revisions: %d Ready, %d Services Ready, %d answer 6/6, %d 404 6/6; A's new Revision %s, its Service %s, %d/5 answered (%s)",
		bound, nB, bRevs, bReady, bAnswered, b404, late, aService, handled, tally)
	if len(readyRefused) > 0 {
		obs += "; Ready Services answering 404: " + strings.Join(readyRefused, ", ")
	}
	ok := perNS && handled == 5 && len(readyRefused) == 0
	if ok {
		defer dropRow(s, nsRTA, nsRTB)
	}
	return obs, ok
}

// ---- G6 Home processes ----

// homeBoundArg matches a Home argument that bounds its tasks as a whole
// (a per-fiber one names "fiber").
var homeBoundArg = regexp.MustCompile(`^--([a-z0-9-]*(pids|tasks|procs|processes)[a-z0-9-]*)=([0-9]+)$`)

// homeBoundFrom finds the Home-wide task bound in a Home Pod's arguments
// or config-lampyr's keys: 0 when there is none.
func homeBoundFrom(args []string, config map[string]string) (int, string) {
	for _, a := range args {
		if m := homeBoundArg.FindStringSubmatch(a); m != nil && !strings.Contains(m[1], "fiber") {
			n, _ := strconv.Atoi(m[3])
			return n, "Home argument " + a
		}
	}
	keys := make([]string, 0, len(config))
	for k := range config {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if strings.Contains(k, "home") && regexp.MustCompile(`pids|tasks|procs|processes`).MatchString(k) {
			if n, err := strconv.Atoi(strings.TrimSpace(config[k])); err == nil && n > 0 {
				return n, "config-lampyr " + k
			}
		}
	}
	return 0, ""
}

// homeBoundLog is fiberd's line when it bounds its Home's fibers together
// (impl/fiberd/backend/process BoundHomeTasks): the bound sized from the
// grant (maxFibers x the per-fiber bound, capped) or --home-pids-max.
var homeBoundLog = regexp.MustCompile(`the fibers of this Home may hold ([0-9]+|max) tasks together`)

// homeBoundFromLog is the last bound homeBoundLog finds in a Home's log:
// 0 when there is none, or when it says "max" (no bound).
func homeBoundFromLog(log string) (int, string) {
	m := homeBoundLog.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return 0, ""
	}
	last := m[len(m)-1]
	n, err := strconv.Atoi(last[1])
	if err != nil {
		return 0, ""
	}
	return n, "the Home's log: " + last[0]
}

// homePidsBound reads the Home-wide bound of Revision ns/rev's running
// Home: an argument or config-lampyr key that sets it, else what fiberd
// logged when it sized it from the grant.
func homePidsBound(ctx context.Context, s *side, ns, rev string) (int, string) {
	_, data := installationConfig(ctx, s)
	pods, err := e2eutil.HomePods(ctx, s.admin, ns, rev)
	must(err, "listing the Home of "+ns+"/"+rev)
	var args []string
	for _, p := range pods.Items {
		for _, c := range p.Spec.Containers {
			args = append(args, c.Args...)
		}
	}
	if n, where := homeBoundFrom(args, data); n > 0 {
		return n, where
	}
	for _, p := range pods.Items {
		raw, err := s.admin.Kube.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "fiberd"}).DoRaw(ctx)
		if err != nil {
			continue
		}
		if n, where := homeBoundFromLog(string(raw)); n > 0 {
			return n, where
		}
	}
	return 0, ""
}

// bomberMaxScale is the bomber's max-scale: enough fibers that their
// per-fiber bounds (RLIMIT_NPROC 512 each) add up past a Home-wide bound
// of up to 4096 (fiberd's default cap).
const bomberMaxScale = 12

// holdOpen is one fiber holding every process it could start.
type holdOpen struct {
	held int
	stop func()
}

// openHold has one fiber of svc.ns start processes until refused and hold
// them (the malicious handler's /hold?what=procs): it returns how many
// once the fiber says so. No abort: it runs on goroutines of its own.
func openHold(ctx context.Context, s *side, svc, ns string) (holdOpen, error) {
	rctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, s.gateway+"/hold?what=procs&ms=120000", nil)
	if err != nil {
		cancel()
		return holdOpen{}, err
	}
	req.Host = host(svc, ns)
	timer := time.AfterFunc(90*time.Second, cancel)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		timer.Stop()
		cancel()
		return holdOpen{}, fmt.Errorf("/hold: %w", err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	timer.Stop()
	stop := func() { cancel(); resp.Body.Close() }
	if err != nil || resp.StatusCode != http.StatusOK {
		stop()
		return holdOpen{}, fmt.Errorf("/hold: %d %q %v", resp.StatusCode, short(line, 120), err)
	}
	var p evilProbe
	if err := json.Unmarshal([]byte(line), &p); err != nil {
		stop()
		return holdOpen{}, fmt.Errorf("/hold answered %q: %w", short(line, 120), err)
	}
	held, _ := p.Details["held"].(float64)
	return holdOpen{held: int(held), stop: stop}, nil
}

// bombFibers has k fibers of svc.ns hold every process they can at once,
// runs during while they hold, then lets them go.
func bombFibers(ctx context.Context, s *side, svc, ns string, k int, during func()) (held []int, failed []string) {
	opens := make([]holdOpen, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() { opens[i], errs[i] = openHold(ctx, s, svc, ns) })
	}
	wg.Wait()
	defer func() {
		for _, o := range opens {
			if o.stop != nil {
				o.stop()
			}
		}
	}()
	for i := range k {
		if errs[i] != nil {
			failed = append(failed, short(errs[i].Error(), 80))
			continue
		}
		held = append(held, opens[i].held)
	}
	during()
	return held, failed
}

func homeProcesses(ctx context.Context, s *side) (string, bool) {
	if evilProject == nil || evilBuilt == nil {
		abortf("the malicious handler was not built by the setup")
	}
	a, b := rowTenant(ctx, s, nsPidsA), rowTenant(ctx, s, nsPidsB)
	a.sealer = the().rowSealer
	tag, err := ly.ParseImageTag(s.registry + "/" + nsPidsA + "/evil-snapshot:bomber")
	must(err, "naming the bomber's snapshot")
	pushed, err := ly.Push(ctx, evilBuilt, tag)
	must(err, "pushing the bomber's snapshot")
	p := *evilProject
	maxScale := int32(bomberMaxScale)
	p.MaxScale = &maxScale
	_, err = deployProject(ctx, s, a, &p, evilBuilt.Config, "bomber", pushed.Ref)
	must(err, "tenant A deploying the bomber")
	applyAs(ctx, b, handlerService(s, nsPidsB, "steady", "64Mi", 1))
	_, err = a.c.WaitReady(ctx, e2eutil.KServices, nsPidsA, "bomber", 5*time.Minute)
	must(err, "A's bomber")
	must(readyAndAnswering(ctx, s, b, "steady", 5*time.Minute), "B's steady Service")
	// The bomber's own Home's bound (fiberd sizes it from the grant): enough
	// fibers that their per-fiber bounds add up past it; without one, a
	// few show that nothing adds them up.
	bound, where := homePidsBound(ctx, s, nsPidsA, "bomber-00001")
	k := 4
	if bound > 0 {
		k = min(max(bound/400+2, 3), bomberMaxScale)
	}

	alone, failedAlone := bombFibers(ctx, s, "bomber", nsPidsA, 1, func() {})
	if len(alone) != 1 || alone[0] < 16 {
		abortf("one fiber alone started %v processes (%v): nothing for a Home bound to stop", alone, failedAlone)
	}
	n1 := alone[0]
	bAnswered := 0
	var bTally string
	held, failed := bombFibers(ctx, s, "bomber", nsPidsA, k, func() {
		bAnswered, bTally = gatewayTally(ctx, s, "steady", nsPidsB, 10, helloBody)
	})
	sum := 0
	for _, h := range held {
		sum += h
	}
	// After: A's Home serves again once its fibers let go.
	aAfter := "no answer"
	_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		code, _, err := gatewayGet(ctx, s, host("bomber", nsPidsA), "/hello", nil)
		if err == nil {
			aAfter = fmt.Sprint(code)
		}
		return code == http.StatusOK, nil
	})
	boundText := "Home-wide bound: none found (no --*pids*/--*tasks* argument on the bomber's Home, no home-*pids* key in config-lampyr, no bound in its log)"
	if bound > 0 {
		boundText = fmt.Sprintf("Home-wide bound %d (%s)", bound, where)
	}
	perFiberTotal := k * n1
	obs := fmt.Sprintf("%s; one fiber alone held %d processes; %d fibers at once held %d together (%v; %d did not start: %v) against %d x %d = %d per-fiber; B answered %d/10 meanwhile (%s); A afterwards: %s",
		boundText, n1, k, sum, held, len(failed), failed, k, n1, perFiberTotal, bAnswered, bTally, aAfter)
	ok := bAnswered == 10 && float64(sum) < 0.9*float64(perFiberTotal) && (bound == 0 || sum <= bound)
	if ok {
		defer dropRow(s, nsPidsA, nsPidsB)
	}
	return obs, ok
}
