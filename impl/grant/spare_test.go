package grant

import (
	"context"
	"crypto/ed25519"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgotesting "k8s.io/client-go/testing"
	"knative.dev/pkg/controller"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// fakePusher records the grants pushed to claimed spares.
type fakePusher struct {
	pushed []string // pod name
	grants [][]byte
	ready  bool
}

func (f *fakePusher) Push(_ context.Context, pod *corev1.Pod, _ string, g []byte) (bool, error) {
	f.pushed = append(f.pushed, pod.Name)
	f.grants = append(f.grants, g)
	return f.ready, nil
}

// runningSpare is a spare made by cfg, running with fiberd started.
func runningSpare(name string, cfg *lampyrconfig.Config) *corev1.Pod {
	p := resources.MakeSparePod(cfg, homesNS, name)
	p.ResourceVersion = "1"
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = "10.244.0.9"
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: resources.FiberdContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	return p
}

func spareSecret(t *testing.T, name string) (*corev1.Secret, resources.HomeKey) {
	k, err := resources.NewHomeKey()
	if err != nil {
		t.Fatal(err)
	}
	s := resources.MakeSpareSecret(homesNS, name, testKeys.SigningPubPEM, testKeys.RouterPubPEM, k)
	s.ResourceVersion = "1"
	return s, k
}

func withSpares(n int) func(*lampyrconfig.Config) {
	return func(c *lampyrconfig.Config) { c.HomeSpares = n }
}

func (h *harness) configured(mut func(*lampyrconfig.Config)) {
	h.r.config = func(context.Context) (*lampyrconfig.Config, error) {
		c := testConfig()
		mut(c)
		return c, nil
	}
}

func sparesKey() string { return homesNS + "/" + SparesKeyName }

// TestSparesAreKept: the spares' key (no CapacityGrant has it) keeps
// home-spares spares of the current configuration: a spare of another
// image and one that ended are deleted with their Secrets, the missing
// ones are started, each with a Secret of its own (its own Home key, no
// grant).
func TestSparesAreKept(t *testing.T) {
	cfg := testConfig()
	old := runningSpare("home-spare-old", cfg)
	old.Spec.Containers[0].Image = "kind.local/fiberd@sha256:" + strings.Repeat("1", 64)
	ended := runningSpare("home-spare-ended", cfg)
	ended.Status.Phase = corev1.PodFailed
	keep := runningSpare("home-spare-keep", cfg)
	oldSecret, _ := spareSecret(t, "home-spare-old")
	h := newHarness(t, []runtime.Object{old, ended, keep, oldSecret})
	h.configured(withSpares(3))
	if err := h.reconcile(sparesKey()); err != nil {
		t.Fatal(err)
	}
	var created, deleted []string
	for _, a := range h.actions() {
		verb, rest, _ := strings.Cut(a, " ")
		switch verb {
		case "create":
			created = append(created, rest)
		case "delete":
			deleted = append(deleted, rest)
		}
	}
	slices.Sort(deleted)
	if want := []string{"pods home-spare-ended", "pods home-spare-old", "secrets home-spare-ended", "secrets home-spare-old"}; !slices.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}
	if len(created) != 4 {
		t.Fatalf("created %v, want two spares (Secret and Pod each)", created)
	}
	for _, a := range h.kube.Actions() {
		if a.GetVerb() != "create" {
			continue
		}
		switch o := a.(clientgotesting.CreateAction).GetObject().(type) {
		case *corev1.Secret:
			if _, ok := o.Data[resources.SecretKeyGrant]; ok || len(o.Data[resources.SecretKeyHomeKey]) == 0 || !resources.IsSpare(o) {
				t.Errorf("spare Secret %s: keys %v labels %v, want a Home key and no grant", o.Name, keysOf(o.Data), o.Labels)
			}
		case *corev1.Pod:
			if !resources.IsSpare(o) || !strings.HasPrefix(o.Name, resources.SparePrefix) {
				t.Errorf("spare Pod %s labels %v", o.Name, o.Labels)
			}
			if m := o.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; m.Cmp(resources.SpareMemory) != 0 {
				t.Errorf("a spare holds %s, want %s (fiberd's own)", m.String(), resources.SpareMemory.String())
			}
		}
	}
}

// TestAGrantClaimsASpare: an admitted grant with no Home claims a running
// spare instead of starting a Pod: the spare's Pod and Secret take the
// grant's labels, its memory grows to the grant's Home's (in-place
// resize), the grant is issued to the spare's own Home key and pushed to
// its fiberd, and fiberd's "ready" makes the Home ready at the Pod's own
// address at once.
func TestAGrantClaimsASpare(t *testing.T) {
	cfg := testConfig()
	g := grant("hello-00001", admitted)
	spare := runningSpare("home-spare-aaaa", cfg)
	secret, key := spareSecret(t, spare.Name)
	pusher := &fakePusher{ready: true}
	h := newHarness(t, []runtime.Object{g, spare, secret})
	h.r.pusher = pusher
	err := h.reconcile("default/hello-00001")
	if ok, _ := controller.IsRequeueKey(err); err != nil && !ok {
		t.Fatal(err)
	}
	for _, a := range h.actions() {
		if strings.HasPrefix(a, "create pods") || strings.HasPrefix(a, "create secrets") {
			t.Errorf("%s: a grant with a spare to claim made a Home of its own", a)
		}
	}
	var claimed *corev1.Pod
	var resized bool
	var written *corev1.Secret
	for _, a := range h.kube.Actions() {
		u, ok := a.(clientgotesting.UpdateAction)
		if !ok {
			continue
		}
		switch o := u.GetObject().(type) {
		case *corev1.Pod:
			if a.GetSubresource() == "resize" {
				resized = true
				want := resources.HomeResources(g, cfg)
				if got := o.Spec.Containers[0].Resources; !equalResources(got, want) {
					t.Errorf("resized to %v, want the grant's Home's %v", got, want)
				}
			} else {
				claimed = o
			}
		case *corev1.Secret:
			written = o
		}
	}
	if claimed == nil || !resources.IsHomeOf(claimed, g) || !resources.IsClaimedSpare(claimed) || resources.IsSpare(claimed) {
		t.Fatalf("the spare's Pod was not relabelled as the grant's Home: %+v", claimed)
	}
	if !resized {
		t.Error("the claimed spare's memory was not grown to the grant's")
	}
	if written == nil || written.Name != spare.Name || !resources.IsHomeOf(written, g) {
		t.Fatalf("the spare's Secret was not made the grant's: %+v", written)
	}
	c, err := signedgrant.Verify(testKeys.Signing.Public().(ed25519.PublicKey), written.Data[resources.SecretKeyGrant], now)
	if err != nil || c.HomeKeySHA256 != key.SHA256 || c.Home != resources.HomeName(g) || c.Revision != g.Spec.RevisionName {
		t.Fatalf("grant in the spare's Secret: %+v %v, want one for the spare's key %s", c, err, key.SHA256[:12])
	}
	if !slices.Equal(pusher.pushed, []string{spare.Name}) || string(pusher.grants[0]) != string(written.Data[resources.SecretKeyGrant]) {
		t.Errorf("pushed %v, want the written grant pushed once to %s", pusher.pushed, spare.Name)
	}
	st := h.status()
	if st == nil || !st.Status.GetCondition(v1alpha1.GrantConditionHomeReady).IsTrue() || st.Status.HomeEndpoint != "10.244.0.9:9090" || st.Status.HomeKeySHA256 != key.SHA256 {
		t.Fatalf("status after the claim: %+v", st)
	}
	// A reconcile of the spares right after the claim starts no
	// replacement yet (its Pod's start would fall on the claiming
	// Revision's own): it looks again when spareRefillDelay has passed.
	h.r.config = func(context.Context) (*lampyrconfig.Config, error) { return testConfig(), nil }
	var asked []time.Duration
	h.r.enqueueSparesAfter = func(d time.Duration) { asked = append(asked, d) }
	if err := h.reconcile(sparesKey()); err != nil {
		t.Fatal(err)
	}
	for _, a := range h.actions() {
		if strings.HasPrefix(a, "create pods "+resources.SparePrefix) {
			t.Errorf("%s: a replacement started at the claim", a)
		}
	}
	if !slices.Contains(asked, spareRefillDelay) {
		t.Errorf("the spares asked to be looked at again after %v, want %v among them", asked, spareRefillDelay)
	}
	// Then, on a cache that still shows the spare unclaimed, it is left
	// alone and its replacement starts.
	h.r.now = func() time.Time { return now.Add(spareRefillDelay) }
	if err := h.reconcile(sparesKey()); err != nil {
		t.Fatal(err)
	}
	var created int
	for _, a := range h.actions() {
		if strings.HasPrefix(a, "delete") && strings.Contains(a, spare.Name) {
			t.Errorf("%s: the claimed spare was taken for an unclaimed one", a)
		}
		if strings.HasPrefix(a, "create pods "+resources.SparePrefix) {
			created++
		}
	}
	if created != 1 {
		t.Errorf("started %d spares after the claim, want 1", created)
	}
	// Again, before the cache shows the new spare: no second one.
	if err := h.reconcile(sparesKey()); err != nil {
		t.Fatal(err)
	}
	created = 0
	for _, a := range h.actions() {
		if strings.HasPrefix(a, "create pods "+resources.SparePrefix) {
			created++
		}
	}
	if created != 1 {
		t.Errorf("started %d spares in all, want 1: a stale cache made a second", created)
	}
}

// TestASpareThatDoesNotFitIsNotClaimed: a grant whose timeoutSeconds is
// beyond what a spare's grace covers, or that needs less memory than a
// spare holds, gets a Home Pod of its own; the spare stays unclaimed.
func TestASpareThatDoesNotFitIsNotClaimed(t *testing.T) {
	for name, mut := range map[string]grantOpt{
		"longer timeout": func(g *v1alpha1.CapacityGrant) { g.Spec.MaxRequestSeconds = 3600 },
		"less memory":    func(g *v1alpha1.CapacityGrant) {},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			g := grant("hello-00001", admitted, mut)
			spare := runningSpare("home-spare-aaaa", cfg)
			if name == "less memory" {
				big := resources.HomeResources(g, cfg).Limits[corev1.ResourceMemory]
				big.Add(big)
				spare.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = big
			}
			secret, _ := spareSecret(t, spare.Name)
			h := newHarness(t, []runtime.Object{g, spare, secret})
			h.r.pusher = &fakePusher{ready: true}
			err := h.reconcile("default/hello-00001")
			if ok, _ := controller.IsRequeueKey(err); err != nil && !ok {
				t.Fatal(err)
			}
			acts := h.actions()
			if !slices.Contains(acts, "create pods "+resources.HomeName(g)) {
				t.Errorf("actions %v, want the grant's own Home Pod", acts)
			}
			for _, a := range acts {
				if strings.Contains(a, spare.Name) {
					t.Errorf("%s: the spare was touched", a)
				}
			}
		})
	}
}

func equalResources(a, b corev1.ResourceRequirements) bool {
	for _, n := range []corev1.ResourceName{corev1.ResourceMemory, corev1.ResourceCPU} {
		x, y := a.Limits[n], b.Limits[n]
		p, q := a.Requests[n], b.Requests[n]
		if x.Cmp(y) != 0 || p.Cmp(q) != 0 {
			return false
		}
	}
	return true
}

// TestAClaimedSpareIsReplacedWithItsSecret: a claimed spare that is gone
// (deleted, evicted) is replaced by an ordinary Home Pod that mounts the
// spare's Secret, which keeps the spare's name: the same Home key, so the
// grant stays valid and no Secret is made under the Home's own name (a
// Pod mounting that would never start).
func TestAClaimedSpareIsReplacedWithItsSecret(t *testing.T) {
	g := grant("hello-00001", admitted)
	s := homeSecret(g, now)
	s.Name = "home-spare-aaaa"
	h := newHarness(t, []runtime.Object{g, s, homeService(g)})
	h.r.pusher = &fakePusher{ready: true}
	err := h.reconcile("default/hello-00001")
	if ok, _ := controller.IsRequeueKey(err); err != nil && !ok {
		t.Fatal(err)
	}
	var made *corev1.Pod
	for _, a := range h.kube.Actions() {
		if a.GetVerb() != "create" {
			continue
		}
		switch o := a.(clientgotesting.CreateAction).GetObject().(type) {
		case *corev1.Pod:
			made = o
		case *corev1.Secret:
			t.Errorf("created Secret %s; the claimed spare's Secret is the Home's", o.Name)
		}
	}
	if made == nil || made.Name != resources.HomeName(g) {
		t.Fatalf("replacement Pod: %+v", made)
	}
	for _, v := range made.Spec.Volumes {
		if v.Name == "home" && v.Secret.SecretName != s.Name {
			t.Errorf("the replacement mounts Secret %s, want the claimed spare's %s", v.Secret.SecretName, s.Name)
		}
	}
}
