package grant

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	clientgotesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/logging"
	logtesting "knative.dev/pkg/logging/testing"
	pkgreconciler "knative.dev/pkg/reconciler"
	rtesting "knative.dev/pkg/reconciler/testing"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	fiberdfake "lampyr.dev/serving/impl/client/clientset/versioned/fake"
	grantreconciler "lampyr.dev/serving/impl/client/injection/reconciler/fiberd/v1alpha1/capacitygrant"
	fiberdlisters "lampyr.dev/serving/impl/client/listers/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/internal/fetchq"
)

// The TableTest rows of this package run the grant Reconciler behind the
// generated reconciler (grantreconciler.NewReconciler), on fake clients and
// listers over the row's objects, as knative.dev/serving's MakeFactory does.
// The row's OtherTestData may hold:
const (
	// requeueKey: the time.Duration the reconcile must ask to be looked at
	// again after (a requeue that matches is not an error; none is wanted
	// when it is absent).
	requeueKey = "requeue"
	// configKey: a func(*config.Config) applied to testConfig().
	configKey = "config"
	// templatesKey: a func(t, map[string][]byte) editing the registry,
	// which holds every grant's template, sealed by the controller for it.
	templatesKey = "templates"
	// diagnoserKey: the HomeDiagnoser (default none, as fiberd that is
	// never asked).
	diagnoserKey = "diagnoser"
	// harnessKey: set by factory to the row's *harness, for PostConditions.
	harnessKey = "harness"
	// noQuotaPodsKey: the row's grants have no quota Pod yet (unless the
	// row's objects hold one).
	noQuotaPodsKey = "noQuotaPods"
)

// harness is one Reconciler on fake clients, reached through the generated
// reconciler.
type harness struct {
	r         *Reconciler
	quotaPods cache.Indexer
	gen       controller.Reconciler
	kube      *kubefake.Clientset
	fiberd    *fiberdfake.Clientset
	templates *fakeTemplates
	recorder  *record.FakeRecorder
	ctx       context.Context
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	kubefake.AddToScheme(s)
	fiberdfake.AddToScheme(s)
	return s
}

// newHarness builds the Reconciler over objs: CapacityGrants for the fiberd
// client and lister, Pods, Services, Secrets (in homesNS) and ConfigMaps
// (in systemNS) for the kube client and listers. reactors come before the
// fakes' own.
func newHarness(t *testing.T, objs []runtime.Object, reactors ...clientgotesting.ReactionFunc) *harness {
	t.Helper()
	sorter := rtesting.NewObjectSorter(newScheme())
	sorter.AddObjects(objs...)
	h := &harness{
		kube:      kubefake.NewSimpleClientset(sorter.ObjectsForSchemeFunc(kubefake.AddToScheme)...),
		fiberd:    fiberdfake.NewSimpleClientset(sorter.ObjectsForSchemeFunc(fiberdfake.AddToScheme)...),
		templates: &fakeTemplates{m: map[string][]byte{}},
		recorder:  record.NewFakeRecorder(10),
	}
	for _, f := range reactors {
		h.kube.PrependReactor("*", "*", f)
		h.fiberd.PrependReactor("*", "*", f)
	}
	grants := fiberdlisters.NewCapacityGrantLister(sorter.IndexerForObjectType(&v1alpha1.CapacityGrant{}))
	all, _ := grants.List(everything)
	for _, g := range all {
		h.templates.m[templateRef(g.Name)] = sealFor(t, testSealer, g.Namespace, g.Name)
	}
	fleetPEM, _ := testFleet.MarshalPEM()
	fleet := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: contract.FleetKeyName, Namespace: systemNS, ResourceVersion: "1"}, Data: map[string][]byte{contract.FleetPrivateKeyKey: fleetPEM}}
	configMaps := corev1listers.NewConfigMapLister(sorter.IndexerForObjectType(&corev1.ConfigMap{}))
	// Every grant's quota Pod is already in its namespace, counted, unless
	// the row gives its own (rows about quota Pods).
	h.quotaPods = sorter.IndexerForObjectType(&corev1.Pod{})
	h.addQuotaPods(t, all, testConfig())
	h.r = &Reconciler{
		kube:            h.kube,
		grants:          grants,
		homesNamespace:  homesNS,
		pods:            corev1listers.NewPodLister(sorter.IndexerForObjectType(&corev1.Pod{})),
		services:        corev1listers.NewServiceLister(sorter.IndexerForObjectType(&corev1.Service{})),
		secrets:         corev1listers.NewSecretLister(sorter.IndexerForObjectType(&corev1.Secret{})),
		systemNamespace: systemNS,
		fleetSecret:     func() (*corev1.Secret, error) { return fleet, nil },
		sealersConfig: func() (*corev1.ConfigMap, error) {
			return configMaps.ConfigMaps(systemNS).Get(contract.SealersConfigMap)
		},
		keys:       testKeys,
		fetches:    syncFetches{templates: h.templates, retryAt: now.Add(templateRetry)},
		quotaPods:  corev1listers.NewPodLister(h.quotaPods),
		namespaces: corev1listers.NewNamespaceLister(sorter.IndexerForObjectType(&corev1.Namespace{})),
		config:     func(context.Context) (*lampyrconfig.Config, error) { return testConfig(), nil },
		now:        func() time.Time { return now },
		grantID:    func(g *v1alpha1.CapacityGrant) string { return "grant-" + g.Name },
		newHomeKey: func() (resources.HomeKey, error) { return testHomeKey, nil },
		pending:    map[string]int64{},
	}
	h.ctx = logging.WithLogger(context.Background(), logtesting.TestLogger(t))
	h.gen = grantreconciler.NewReconciler(h.ctx, logging.FromContext(h.ctx), h.fiberd, grants, h.recorder, h.r)
	// The generated reconciler does no work until it leads.
	h.gen.(pkgreconciler.LeaderAware).Promote(pkgreconciler.UniversalBucket(), func(pkgreconciler.Bucket, types.NamespacedName) {})
	return h
}

// addQuotaPods puts each grant's quota Pod, as cfg makes it, where the
// reconciler finds it (lister and fake client), unless one of that name is
// there already.
func (h *harness) addQuotaPods(t *testing.T, grants []*v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) {
	t.Helper()
	for _, g := range grants {
		p := resources.MakeQuotaPod(g, cfg)
		if _, ok, _ := h.quotaPods.GetByKey(p.Namespace + "/" + p.Name); ok {
			continue
		}
		if err := h.quotaPods.Add(p); err != nil {
			t.Fatal(err)
		}
		if err := h.kube.Tracker().Add(p); err != nil {
			t.Fatal(err)
		}
	}
}

// rowHolds says whether the row's own objects include p.
func rowHolds(row *rtesting.TableRow, p *corev1.Pod) bool {
	for _, o := range row.Objects {
		if q, ok := o.(*corev1.Pod); ok && q.Namespace == p.Namespace && q.Name == p.Name {
			return true
		}
	}
	return false
}

// syncFetches reads templates at once, on the worker: rows see one
// reconcile's outcome (the off-worker reads have their own test).
type syncFetches struct {
	templates TemplateFetcher
	retryAt   time.Time
}

func (f syncFetches) Get(_ types.NamespacedName, key string) fetchq.Result[[]byte] {
	tmpl, _, _ := strings.Cut(key, " ")
	b, err := f.templates.Fetch(context.Background(), tmpl)
	if err != nil {
		return fetchq.Result[[]byte]{State: fetchq.Failed, Err: fmt.Errorf("the sealed template %s: %w", tmpl, err), RetryAt: f.retryAt}
	}
	return fetchq.Result[[]byte]{State: fetchq.Done, Value: b}
}

// reconcile runs one reconcile of key through the generated reconciler.
func (h *harness) reconcile(key string) error { return h.gen.Reconcile(h.ctx, key) }

// status returns the last status written for a grant, nil if none.
func (h *harness) status() *v1alpha1.CapacityGrant {
	var last *v1alpha1.CapacityGrant
	for _, a := range h.fiberd.Actions() {
		if u, ok := a.(clientgotesting.UpdateAction); ok && a.GetSubresource() == "status" {
			last = u.GetObject().(*v1alpha1.CapacityGrant)
		}
	}
	return last
}

// actions returns "verb resource name" for every write to the kube client.
func (h *harness) actions() []string {
	var out []string
	for _, a := range h.kube.Actions() {
		switch a.GetVerb() {
		case "create", "update":
			obj := a.(interface{ GetObject() runtime.Object }).GetObject()
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource+" "+obj.(metav1.Object).GetName())
		case "delete":
			out = append(out, "delete "+a.GetResource().Resource+" "+a.(clientgotesting.DeleteAction).GetName())
		}
	}
	return out
}

// factory is the TableTest Factory over newHarness.
func factory(t *testing.T, row *rtesting.TableRow) (controller.Reconciler, rtesting.ActionRecorderList, rtesting.EventList) {
	h := newHarness(t, row.Objects, row.WithReactors...)
	if f, ok := row.OtherTestData[configKey].(func(*lampyrconfig.Config)); ok {
		h.r.config = func(context.Context) (*lampyrconfig.Config, error) {
			c := testConfig()
			f(c)
			return c, nil
		}
		// Quota Pods carry the Home's resources under this configuration.
		c := testConfig()
		f(c)
		for _, o := range row.Objects {
			if g, ok := o.(*v1alpha1.CapacityGrant); ok {
				p := resources.MakeQuotaPod(g, c)
				if old, ok, _ := h.quotaPods.GetByKey(p.Namespace + "/" + p.Name); ok && ownershipOf(old.(*corev1.Pod), g) == ownedByGrant {
					_ = h.quotaPods.Update(p)
					_ = h.kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), p, p.Namespace)
				}
			}
		}
	}
	if f, ok := row.OtherTestData[templatesKey].(func(testing.TB, map[string][]byte)); ok {
		f(t, h.templates.m)
	}
	if _, ok := row.OtherTestData[noQuotaPodsKey]; ok {
		for _, o := range h.quotaPods.List() {
			p := o.(*corev1.Pod)
			if p.Labels[resources.ComponentKey] != contract.QuotaPodComponent || rowHolds(row, p) {
				continue
			}
			_ = h.quotaPods.Delete(p)
			_ = h.kube.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), p.Namespace, p.Name)
		}
	}
	if d, ok := row.OtherTestData[diagnoserKey].(HomeDiagnoser); ok {
		h.r.diagnoser = d
	}
	want, _ := row.OtherTestData[requeueKey].(time.Duration)
	if row.OtherTestData == nil {
		row.OtherTestData = map[string]any{}
	}
	row.OtherTestData[harnessKey] = h
	row.Ctx = h.ctx
	return requeueIs{t: t, inner: h.gen, want: want}, rtesting.ActionRecorderList{h.fiberd, h.kube}, rtesting.EventList{Recorder: h.recorder}
}

// requeueIs checks when the reconcile asks to be looked at again.
type requeueIs struct {
	t     *testing.T
	inner controller.Reconciler
	want  time.Duration
}

func (q requeueIs) Reconcile(ctx context.Context, key string) error {
	err := q.inner.Reconcile(ctx, key)
	got := time.Duration(0)
	if ok, d := controller.IsRequeueKey(err); ok {
		got, err = d, nil
	}
	if got != q.want {
		q.t.Errorf("requeue after %s, want %s", got, q.want)
	}
	return err
}
