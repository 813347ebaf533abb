package revision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/routermeta"
)

const (
	system = "lampyr-system"
	homes  = "lampyr-homes"
)

func meta(ns, rev string) routermeta.Metadata {
	return routermeta.Metadata{
		Revision: rev, Namespace: ns, Ready: true, HomeEndpoint: rev + "-home." + homes + ".svc:9090", Home: rev + "-home",
		MaxFibers: 3, TimeoutSeconds: 60, Mode: "fresh", Protocol: routermeta.ProtocolHTTP1, Generation: 1,
	}
}

type recorder struct {
	mu      sync.Mutex
	changes []string
}

func (r *recorder) Changed(old, cur *routermeta.Metadata) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case old == nil:
		r.changes = append(r.changes, "add "+cur.Namespace+"/"+cur.Revision)
	case cur == nil:
		r.changes = append(r.changes, "delete "+old.Namespace+"/"+old.Revision)
	default:
		r.changes = append(r.changes, "update "+cur.Namespace+"/"+cur.Revision)
	}
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.changes...)
}

func TestTableTellsListenerOnlyAboutChanges(t *testing.T) {
	rec := &recorder{}
	tbl := NewTable(rec)
	m := meta("demo", "a-00001")
	tbl.Upsert(m)
	tbl.Upsert(m) // resync with no change
	m.Ready = false
	tbl.Upsert(m)
	tbl.Delete(Key{"demo", "a-00001"})
	tbl.Delete(Key{"demo", "a-00001"})
	want := []string{"add demo/a-00001", "update demo/a-00001", "delete demo/a-00001"}
	if got := rec.list(); !slices.Equal(got, want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
}

func TestTableBoundsRevisions(t *testing.T) {
	rec := &recorder{}
	tbl := NewTable(rec)
	tbl.MaxRevisions = 2
	var refusals []*RefusedError
	tbl.OnRefused = func(e *RefusedError) { refusals = append(refusals, e) }
	a, b, c := meta("demo", "a-00001"), meta("demo", "b-00001"), meta("demo", "c-00001")
	tbl.Upsert(a)
	tbl.Upsert(b)
	tbl.Upsert(c)
	tbl.Upsert(c) // a resync: refused again, reported once
	if _, ok := tbl.Lookup(Key{"demo", "c-00001"}); ok || tbl.Len() != 2 {
		t.Fatalf("a third Revision was taken beyond MaxRevisions 2 (len %d)", tbl.Len())
	}
	if len(refusals) != 1 || refusals[0].Reason != RefusedFull || refusals[0].Key != (Key{"demo", "c-00001"}) ||
		!strings.Contains(refusals[0].Error(), "--max-revisions=2") {
		t.Fatalf("refusals %v, want one full refusal of demo/c-00001 naming the flag", refusals)
	}
	// Known Revisions still take updates when the table is full.
	a.Ready = false
	tbl.Upsert(a)
	if m, _ := tbl.Lookup(Key{"demo", "a-00001"}); m.Ready {
		t.Fatal("an update of a known Revision was refused because the table is full")
	}
	// A deletion frees a slot for the refused Revision's next delivery.
	tbl.Delete(Key{"demo", "b-00001"})
	tbl.Upsert(c)
	if _, ok := tbl.Lookup(Key{"demo", "c-00001"}); !ok {
		t.Fatal("a freed slot was not used")
	}
	want := []string{"add demo/a-00001", "add demo/b-00001", "update demo/a-00001", "delete demo/b-00001", "add demo/c-00001"}
	if got := rec.list(); !slices.Equal(got, want) {
		t.Fatalf("listener saw %v, want %v", got, want)
	}
	// Refused again later (a new episode): reported again.
	tbl.Upsert(b)
	if len(refusals) != 2 {
		t.Fatalf("%d refusals, want a second one for b after it was refused anew", len(refusals))
	}
}

// One namespace cannot fill the table for the others (issue 31): beyond
// MaxRevisionsPerNamespace its new Revisions are refused with their own
// reason, another namespace's are still taken, nothing known is evicted,
// and a deletion in the namespace frees a slot for it alone.
func TestTableBoundsRevisionsPerNamespace(t *testing.T) {
	for _, tc := range []struct {
		name        string
		global, per int
		// the hog's Revisions, then the victim's; want says which of the
		// victim's are taken and why the refused ones are refused.
		hog, victim int
		wantVictim  int
		wantReasons map[string]int
	}{
		{name: "namespace bound only", global: 0, per: 3, hog: 10, victim: 3, wantVictim: 3,
			wantReasons: map[string]int{RefusedNamespaceFull: 7}},
		{name: "both bounds: the hog hits its own first", global: 5, per: 3, hog: 10, victim: 3, wantVictim: 2,
			wantReasons: map[string]int{RefusedNamespaceFull: 7, RefusedFull: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			tbl := NewTable(rec)
			tbl.MaxRevisions, tbl.MaxRevisionsPerNamespace = tc.global, tc.per
			reasons := map[string]int{}
			var last *RefusedError
			tbl.OnRefused = func(e *RefusedError) { reasons[e.Reason]++; last = e }
			for i := range tc.hog {
				tbl.Upsert(meta("hog", fmt.Sprintf("r%d-00001", i)))
			}
			if last == nil || last.Reason != RefusedNamespaceFull || !strings.Contains(last.Error(), "--max-revisions-per-namespace=3") || !strings.Contains(last.Error(), "hog") {
				t.Fatalf("last refusal %v, want one naming the flag and the namespace", last)
			}
			for i := range tc.victim {
				tbl.Upsert(meta("victim", fmt.Sprintf("r%d-00001", i)))
			}
			if got := tbl.NamespaceLen("hog"); got != tc.per {
				t.Fatalf("hog holds %d Revisions, bound %d", got, tc.per)
			}
			if got := tbl.NamespaceLen("victim"); got != tc.wantVictim {
				t.Fatalf("victim holds %d Revisions, want %d", got, tc.wantVictim)
			}
			if !maps.Equal(reasons, tc.wantReasons) {
				t.Fatalf("refusals by reason %v, want %v", reasons, tc.wantReasons)
			}
			// The hog's known Revisions still take updates; its oldest
			// refused one is taken as soon as it deletes one of its own.
			m := meta("hog", "r0-00001")
			m.Ready = false
			tbl.Upsert(m)
			if got, _ := tbl.Lookup(Key{"hog", "r0-00001"}); got.Ready {
				t.Fatal("an update of a known Revision of a namespace at its bound was refused")
			}
			tbl.Delete(Key{"hog", "r1-00001"})
			if _, ok := tbl.Lookup(Key{"hog", "r3-00001"}); !ok {
				t.Fatal("the slot the hog freed was not given to its oldest refused Revision")
			}
			if _, ok := tbl.Lookup(Key{"hog", "r9-00001"}); ok {
				t.Fatal("the hog's newest Revision jumped the queue")
			}
			// Deleting every Revision of a namespace forgets it.
			for i := range tc.victim {
				tbl.Delete(Key{"victim", fmt.Sprintf("r%d-00001", i)})
			}
			if tbl.NamespaceLen("victim") != 0 || tbl.Len() != tc.per {
				t.Fatalf("after deletions: victim %d, len %d", tbl.NamespaceLen("victim"), tbl.Len())
			}
		})
	}
}

// Two fiber-router replicas hear of the same Revisions in different orders
// (a LIST by name, a watch by creation, a resync in map order) and must
// hold the same ones at a bound: a KIngress probe answered by one
// replica otherwise turns a Route Ready whose requests get 404 from the
// other (the tenancy suite's G5 saw 6 of 7 Services Ready, 4 answering
// 404, at a bound of 3).
func TestTableHoldsTheSameRevisionsWhateverTheOrder(t *testing.T) {
	base := time.Date(2026, 12, 4, 7, 0, 0, 0, time.UTC)
	type ev struct {
		k       Key
		created time.Time
		del     bool
	}
	var evs []ev
	// Two tenants, seven Revisions each, some created in the same second
	// (creationTimestamp has 1 s resolution: names break the tie).
	for i := range 7 {
		for _, ns := range []string{"b", "a"} {
			evs = append(evs, ev{k: Key{ns, fmt.Sprintf("fill-%d", 7-i)}, created: base.Add(time.Duration(i/2) * time.Second)})
		}
	}
	held := func(tbl *Table) []string {
		var out []string
		for _, ns := range []string{"a", "b"} {
			for i := 1; i <= 7; i++ {
				if _, ok := tbl.Lookup(Key{ns, fmt.Sprintf("fill-%d", i)}); ok {
					out = append(out, ns+"/"+fmt.Sprintf("fill-%d", i))
				}
			}
		}
		return out
	}
	feed := func(order []ev, global, per int) (*Table, *recorder) {
		rec := &recorder{}
		tbl := NewTable(rec)
		tbl.MaxRevisions, tbl.MaxRevisionsPerNamespace = global, per
		for _, e := range order {
			m := meta(e.k.Namespace, e.k.Name)
			if e.del {
				tbl.Delete(e.k)
				continue
			}
			tbl.UpsertAt(m, e.created)
		}
		return tbl, rec
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, bounds := range [][2]int{{0, 3}, {5, 3}, {4, 0}, {0, 0}} {
		ref, _ := feed(evs, bounds[0], bounds[1])
		want := held(ref)
		for trial := range 50 {
			order := slices.Clone(evs)
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			// A resync: everything again, in another order.
			again := slices.Clone(evs)
			rng.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
			tbl, _ := feed(append(order, again...), bounds[0], bounds[1])
			if got := held(tbl); !slices.Equal(got, want) {
				t.Fatalf("bounds %v, order %d: holds %v; in creation order it holds %v", bounds, trial, got, want)
			}
		}
	}
	// At a bound of 3, the oldest three of each namespace are held: fill-7
	// and fill-6 (the first second), then fill-4 before fill-5 (the next
	// second: the name breaks the tie).
	ref, rec := feed(evs, 0, 3)
	if got, want := held(ref), []string{"a/fill-4", "a/fill-6", "a/fill-7", "b/fill-4", "b/fill-6", "b/fill-7"}; !slices.Equal(got, want) {
		t.Fatalf("holds %v, want the oldest three of each namespace %v", got, want)
	}
	// An older Revision heard of late displaces the newest held one (only
	// before the first sync can that happen: later ones are newer), and
	// the one it displaced is refused, the listener told.
	late := meta("a", "fill-0")
	ref.UpsertAt(late, base.Add(-time.Second))
	if got, want := held(ref), []string{"a/fill-6", "a/fill-7", "b/fill-4", "b/fill-6", "b/fill-7"}; !slices.Equal(got, want) {
		t.Fatalf("after an older Revision arrived: holds %v (fill-0 aside), want %v", got, want)
	}
	if _, ok := ref.Lookup(Key{"a", "fill-0"}); !ok {
		t.Fatal("the older Revision is not held")
	}
	if l := rec.list(); !slices.Equal(l[len(l)-2:], []string{"delete a/fill-4", "add a/fill-0"}) {
		t.Fatalf("listener's last changes %v, want the displaced one let go, then the older taken", l[len(l)-2:])
	}
	// A deletion gives the room to the oldest waiting, at once.
	ref.Delete(Key{"a", "fill-0"})
	if _, ok := ref.Lookup(Key{"a", "fill-4"}); !ok {
		t.Fatal("the room a deletion made was not given back to the oldest waiting Revision")
	}
}

func TestRefuseForgetsAndReportsOnce(t *testing.T) {
	rec := &recorder{}
	tbl := NewTable(rec)
	var n int
	tbl.OnRefused = func(*RefusedError) { n++ }
	k := Key{"demo", "a-00001"}
	tbl.Upsert(meta("demo", "a-00001"))
	bad := &RefusedError{Key: k, Reason: RefusedMalformed, Err: errors.New("data.mode")}
	tbl.Refuse(bad)
	tbl.Refuse(bad)
	if _, ok := tbl.Lookup(k); ok || n != 1 {
		t.Fatalf("after refusals: still held %v, reported %d times (want gone, once)", ok, n)
	}
	tbl.Refuse(&RefusedError{Key: k, Reason: RefusedEndpoint, Err: errors.New("evil:1")})
	if n != 2 {
		t.Fatal("a different refusal of the same Revision was not reported")
	}
	tbl.Upsert(meta("demo", "a-00001"))
	tbl.Refuse(bad)
	if n != 3 {
		t.Fatal("a refusal after the Revision was accepted again was not reported")
	}
	if got := rec.list(); !slices.Equal(got, []string{"add demo/a-00001", "delete demo/a-00001", "add demo/a-00001", "delete demo/a-00001"}) {
		t.Fatalf("listener saw %v", got)
	}
}

func TestDecodeRefusesWhatTheRouterMustNotUse(t *testing.T) {
	good := routermeta.MakeConfigMap(system, meta("demo", "a-00001"))
	if m, err := Decode(good, homes); err != nil || m.Home != "a-00001-home" {
		t.Fatalf("genuine metadata: %+v, %v", m, err)
	}
	for name, c := range map[string]struct {
		mutate func(*corev1.ConfigMap)
		reason string
		key    Key
	}{
		"claims another namespace":       {func(cm *corev1.ConfigMap) { cm.Data["namespace"] = "victim" }, RefusedMalformed, Key{"demo", "a-00001"}},
		"named for another Revision":     {func(cm *corev1.ConfigMap) { cm.Name = routermeta.Name("demo", "b-00001") }, RefusedMalformed, Key{"demo", "b-00001"}},
		"not a metadata name":            {func(cm *corev1.ConfigMap) { cm.Name = "a-00001-lampyr-route" }, RefusedMalformed, Key{Name: "a-00001-lampyr-route"}},
		"endpoint in a tenant namespace": {func(cm *corev1.ConfigMap) { cm.Data["homeEndpoint"] = "evil.demo.svc:9090" }, RefusedEndpoint, Key{"demo", "a-00001"}},
		"endpoint on loopback":           {func(cm *corev1.ConfigMap) { cm.Data["homeEndpoint"] = "127.0.0.1:9090" }, RefusedEndpoint, Key{"demo", "a-00001"}},
	} {
		cm := routermeta.MakeConfigMap(system, meta("demo", "a-00001"))
		c.mutate(cm)
		_, err := Decode(cm, homes)
		if err == nil || err.Reason != c.reason || err.Key != c.key {
			t.Errorf("%s: %v, want a %s refusal of %s", name, err, c.reason, c.key)
		}
	}
	// Not ready yet: no endpoint to check.
	notReady := meta("demo", "a-00001")
	notReady.Ready, notReady.HomeEndpoint, notReady.Home = false, "", ""
	if _, err := Decode(routermeta.MakeConfigMap(system, notReady), homes); err != nil {
		t.Fatalf("metadata of a Revision that is not ready: %v", err)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConfigMapSourceFollowsTheCluster(t *testing.T) {
	a := routermeta.MakeConfigMap(system, meta("demo", "a-00001"))
	unlabelled := routermeta.MakeConfigMap(system, meta("demo", "x-00001"))
	unlabelled.Labels = nil
	// A tenant's own labelled ConfigMap, consistent in every other way: the
	// router must never read it, let alone report it.
	tenant := routermeta.MakeConfigMap(system, meta("victim", "v-00001"))
	tenant.Namespace = "attacker"
	tenant.Data["homeEndpoint"] = "10.0.0.66:9090"
	evil := routermeta.MakeConfigMap(system, meta("demo", "e-00001"))
	evil.Data["homeEndpoint"] = "listener.attacker.svc:9090"
	kube := fake.NewClientset(a, unlabelled, tenant, evil)
	// The fake API server drops events between the informer's list and its
	// watch (it has no resourceVersion history), so mutate only once the
	// watch is established.
	watching := make(chan struct{})
	var once sync.Once
	kube.PrependWatchReactor("configmaps", func(action k8stesting.Action) (bool, watch.Interface, error) {
		once.Do(func() { close(watching) })
		return false, nil, nil
	})

	var mu sync.Mutex
	refused := map[Key]string{}
	src := NewConfigMapSource(kube, system, homes, 0)
	tbl := NewTable(nil)
	tbl.MaxRevisions = 2
	tbl.OnRefused = func(e *RefusedError) {
		mu.Lock()
		refused[e.Key] = e.Reason
		mu.Unlock()
	}
	refusedAs := func(k Key) string {
		mu.Lock()
		defer mu.Unlock()
		return refused[k]
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() { done <- src.Run(ctx, tbl) }()
	waitUntil(t, "initial sync", src.HasSynced)
	select {
	case <-watching:
	case <-time.After(30 * time.Second):
		t.Fatal("the informer never started watching")
	}

	if _, ok := tbl.Lookup(Key{"demo", "a-00001"}); !ok {
		t.Fatal("labelled metadata missing after sync")
	}
	if _, ok := tbl.Lookup(Key{"demo", "x-00001"}); ok {
		t.Fatal("a ConfigMap without the router-metadata label was used")
	}
	if _, ok := tbl.Lookup(Key{"victim", "v-00001"}); ok || refusedAs(Key{"victim", "v-00001"}) != "" {
		t.Fatal("a ConfigMap outside the metadata namespace was read")
	}
	if _, ok := tbl.Lookup(Key{"demo", "e-00001"}); ok || refusedAs(Key{"demo", "e-00001"}) != RefusedEndpoint {
		t.Fatalf("metadata naming a Home outside %s: refusal %q", homes, refusedAs(Key{"demo", "e-00001"}))
	}
	if tbl.Len() != 1 {
		t.Fatalf("table has %d entries", tbl.Len())
	}
	for _, act := range kube.Actions() {
		if act.GetResource().Resource == "configmaps" && act.GetNamespace() != system {
			t.Fatalf("%s of configmaps in namespace %q: the router reads only %s", act.GetVerb(), act.GetNamespace(), system)
		}
	}

	cms := kube.CoreV1().ConfigMaps(system)
	// Updates and deletions flow through.
	upd := a.DeepCopy()
	upd.Data["ready"] = "false"
	if _, err := cms.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "update", func() bool { m, ok := tbl.Lookup(Key{"demo", "a-00001"}); return ok && !m.Ready })

	// Metadata turned malformed must stop routing, not keep the old version.
	bad := upd.DeepCopy()
	bad.Data["ready"] = "true"
	bad.Data["mode"] = "park"
	if _, err := cms.Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "malformed metadata to remove the entry", func() bool { _, ok := tbl.Lookup(Key{"demo", "a-00001"}); return !ok })
	if r := refusedAs(Key{"demo", "a-00001"}); r != RefusedMalformed {
		t.Fatalf("malformed metadata refused as %q", r)
	}

	// Two Revisions fill the table; a third waits for a free slot.
	if _, err := cms.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b := routermeta.MakeConfigMap(system, meta("other", "b-00001"))
	c := routermeta.MakeConfigMap(system, meta("other", "c-00001"))
	for _, cm := range []*corev1.ConfigMap{b, c} {
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "a third Revision to be refused", func() bool { return refusedAs(Key{"other", "c-00001"}) == RefusedFull })
	if _, ok := tbl.Lookup(Key{"other", "b-00001"}); !ok || tbl.Len() != 2 {
		t.Fatalf("b missing or table at %d entries", tbl.Len())
	}
	if _, ok := tbl.Lookup(Key{"demo", "a-00001"}); !ok {
		t.Fatal("a not restored")
	}

	// A deletion finds its Revision by the ConfigMap's name even when its
	// data and labels are gone.
	gutted := b.DeepCopy()
	gutted.Data, gutted.Labels = nil, map[string]string{contract.RouterMetadataLabel: "true"}
	if _, err := cms.Update(ctx, gutted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "gutted metadata to be refused", func() bool { return refusedAs(Key{"other", "b-00001"}) == RefusedMalformed })
	if err := cms.Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, a.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "delete", func() bool { _, ok := tbl.Lookup(Key{"demo", "a-00001"}); return !ok })
	// The freed slots go to c at its next delivery.
	c.Data["generation"] = "2"
	if _, err := cms.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "c in a freed slot", func() bool { _, ok := tbl.Lookup(Key{"other", "c-00001"}); return ok })

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestConfigMapSourceRefusesToWatchEverything(t *testing.T) {
	for _, src := range []*ConfigMapSource{
		NewConfigMapSource(fake.NewClientset(), "", homes, 0),
		NewConfigMapSource(fake.NewClientset(), system, "", 0),
	} {
		if err := src.Run(context.Background(), NewTable(nil)); err == nil {
			t.Fatal("a source without a namespace ran")
		}
	}
}

// BenchmarkTableFill feeds 10000 Revisions over 10 namespaces, as a
// replica's first LIST does: under the default bounds (nothing refused),
// and with each namespace over a bound of 100 (oldest first, every
// namespace sorted on each of its arrivals past the bound).
func BenchmarkTableFill(b *testing.B) {
	base := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	for _, bc := range []struct {
		name        string
		global, per int
	}{{"default bounds", 10000, 1000}, {"per-namespace 100", 10000, 100}, {"global 5000", 5000, 1000}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				tbl := NewTable(nil)
				tbl.MaxRevisions, tbl.MaxRevisionsPerNamespace = bc.global, bc.per
				for i := range 10000 {
					tbl.UpsertAt(meta(fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("r-%05d", i)), base.Add(time.Duration(i)*time.Second))
				}
			}
		})
	}
}
