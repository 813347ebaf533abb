package revision

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"lampyr.dev/serving/impl/routermeta"
)

func meta(ns, rev string) routermeta.Metadata {
	return routermeta.Metadata{
		Revision: rev, Namespace: ns, Ready: true, HomeEndpoint: rev + "-home." + ns + ".svc:9090",
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
	if got := rec.list(); len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("changes %v, want %v", got, want)
	}
}

func TestDecodeRefusesForgedMetadata(t *testing.T) {
	good := routermeta.MakeConfigMap(meta("demo", "a-00001"))
	if _, err := Decode(good); err != nil {
		t.Fatalf("genuine metadata refused: %v", err)
	}
	otherNS := routermeta.MakeConfigMap(meta("victim", "a-00001"))
	otherNS.Namespace = "attacker"
	if _, err := Decode(otherNS); err == nil {
		t.Fatal("a ConfigMap in namespace attacker claiming namespace victim was accepted")
	}
	renamed := routermeta.MakeConfigMap(meta("demo", "a-00001"))
	renamed.Name = "b-00001" + routermeta.NameSuffix
	if _, err := Decode(renamed); err == nil {
		t.Fatal("a ConfigMap named for another Revision was accepted")
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
	a := routermeta.MakeConfigMap(meta("demo", "a-00001"))
	unlabelled := routermeta.MakeConfigMap(meta("demo", "x-00001"))
	unlabelled.Labels = nil
	forged := routermeta.MakeConfigMap(meta("victim", "v-00001"))
	forged.Namespace = "attacker"
	kube := fake.NewClientset(a, unlabelled, forged)
	// The fake API server drops events between the informer's list and its
	// watch (it has no resourceVersion history), so mutate only once the
	// watch is established.
	watching := make(chan struct{})
	var once sync.Once
	kube.PrependWatchReactor("configmaps", func(action k8stesting.Action) (bool, watch.Interface, error) {
		once.Do(func() { close(watching) })
		return false, nil, nil
	})

	var errs sync.Map
	src := NewConfigMapSource(kube, 0)
	src.OnError = func(err error) { errs.Store(err.Error(), true) }
	tbl := NewTable(nil)
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
	if _, ok := tbl.Lookup(Key{"victim", "v-00001"}); ok {
		t.Fatal("forged cross-namespace metadata was used")
	}
	if tbl.Len() != 1 {
		t.Fatalf("table has %d entries", tbl.Len())
	}
	var sawForged bool
	errs.Range(func(k, _ any) bool { sawForged = true; return false })
	if !sawForged {
		t.Fatal("forged metadata was not reported")
	}

	// Updates and deletions flow through.
	upd := a.DeepCopy()
	upd.Data["ready"] = "false"
	if _, err := kube.CoreV1().ConfigMaps("demo").Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "update", func() bool { m, ok := tbl.Lookup(Key{"demo", "a-00001"}); return ok && !m.Ready })

	// Metadata turned malformed must stop routing, not keep the old version.
	bad := upd.DeepCopy()
	bad.Data["ready"] = "true"
	bad.Data["mode"] = "park"
	if _, err := kube.CoreV1().ConfigMaps("demo").Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "malformed metadata to remove the entry", func() bool { _, ok := tbl.Lookup(Key{"demo", "a-00001"}); return !ok })

	b := routermeta.MakeConfigMap(meta("other", "b-00001"))
	if _, err := kube.CoreV1().ConfigMaps("other").Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "add", func() bool { _, ok := tbl.Lookup(Key{"other", "b-00001"}); return ok })
	if err := kube.CoreV1().ConfigMaps("other").Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "delete", func() bool { _, ok := tbl.Lookup(Key{"other", "b-00001"}); return !ok })

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
