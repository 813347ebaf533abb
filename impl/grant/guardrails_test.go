package grant

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgotesting "k8s.io/client-go/testing"
	rtesting "knative.dev/pkg/reconciler/testing"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
)

// TestGuardRails: a tenant's ResourceQuota and LimitRange act on its
// Revisions through their quota Pods, a namespace takes no more than its
// share of the installation's fiber memory, and a grant whose Home failed
// holds none (issue 31; docs/security.md, "What a tenant's Kubernetes
// objects still mean").
func TestGuardRails(t *testing.T) {
	hn := resources.HomeNameFor("default", "hello-00001")
	fresh := grant("hello-00001")
	noop := func(*corev1.Pod) {}
	quotaMsg := `pods "hello-00001-lampyr-quota" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2`
	// The quota admission plugin's refusal, as the API server answers a
	// Pod create in a namespace at its ResourceQuota.
	quotaFull := func(a clientgotesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "create" && a.GetResource().Resource == "pods" && a.GetNamespace() == "default" {
			return true, nil, apierrs.NewForbidden(schema.GroupResource{Resource: "pods"}, "hello-00001-lampyr-quota", fmt.Errorf("exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"))
		}
		return false, nil, nil
	}
	share := func(v string) map[string]any {
		return map[string]any{configKey: func(c *lampyrconfig.Config) { c.NamespaceShare, _ = lampyrconfig.ParseShare("test", v) }}
	}
	// Another grant of the same namespace holding 768Mi.
	neighbour := grant("neighbour", withMemory("256Mi", 3), admitted, func(g *v1alpha1.CapacityGrant) { setReserved(g, 768<<20) })
	ungated := resources.MakeQuotaPod(fresh, testConfig())
	ungated.Spec.SchedulingGates = nil

	table := rtesting.TableTest{{
		Name:    "a new grant's quota Pod is made in its namespace before it is admitted",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{fresh},
		WantCreates: []runtime.Object{
			resources.MakeQuotaPod(fresh, testConfig()), issuedSecret(fresh), homeService(fresh), homePod(fresh, noop),
		},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			markAdmitted("512Mi"), reserve(512<<20), atHome, issued("grant-hello-00001", now),
			homeNotReady(contract.ReasonHomePending, "Home Pod lampyr-homes/"+hn+" created.")))),
		SkipNamespaceValidation: true,
		OtherTestData:           map[string]any{noQuotaPodsKey: true, requeueKey: 5 * time.Minute},
	}, {
		Name:         "the namespace's ResourceQuota refuses the quota Pod: refused in the API server's words",
		Key:          "default/hello-00001",
		Objects:      []runtime.Object{fresh},
		WithReactors: []clientgotesting.ReactionFunc{quotaFull},
		WantCreates:  []runtime.Object{resources.MakeQuotaPod(fresh, testConfig())},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(reserve(0),
			markNotAdmitted(contract.ReasonFailedCreate, quotaMsg)))),
		OtherTestData: map[string]any{noQuotaPodsKey: true},
	}, {
		Name:    "a quota Pod whose gate was removed no longer counts: it is replaced",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{fresh, ungated},
		WantDeletes: []clientgotesting.DeleteActionImpl{{
			ActionImpl: clientgotesting.ActionImpl{Namespace: "default", Verb: "delete", Resource: corev1.SchemeGroupVersion.WithResource("pods")},
			Name:       ungated.Name,
		}},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled())),
		OtherTestData:     map[string]any{noQuotaPodsKey: true, requeueKey: leftoverRetry},
	}, {
		Name:    "a Pod the tenant made under the quota Pod's name refuses the grant",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{fresh, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hello-00001-lampyr-quota", Namespace: "default"}}},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			markNotAdmitted(contract.ReasonQuotaPodNameTaken, "Pod default/hello-00001-lampyr-quota exists and was not made for this Revision; delete it (Lampyr counts the Revision against this namespace's ResourceQuota with a Pod of that name)")))),
		OtherTestData: map[string]any{noQuotaPodsKey: true},
	}, {
		Name:    "a namespace's share: its own usage only is named",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{neighbour, fresh},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			markNotAdmitted(contract.ReasonNamespaceShareExceeded, "needs 512Mi (memoryPerFiber 128Mi × maxFibers 4), but this namespace's share of fiber memory is 1Gi (namespace-fiber-memory-share in ConfigMap config-lampyr) and its other Revisions hold 768Mi; lower max-scale or the memory request, delete unused Revisions, or ask an administrator for a larger share")))),
		OtherTestData: share("100%"),
	}, {
		Name: "an administrator's share on the Namespace wins over the default",
		Key:  "default/hello-00001",
		Objects: []runtime.Object{fresh, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default",
			Annotations: map[string]string{contract.FiberMemoryShareAnnotation: "256Mi"}}}},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			markNotAdmitted(contract.ReasonNamespaceShareExceeded, "needs 512Mi (memoryPerFiber 128Mi × maxFibers 4), but this namespace's share of fiber memory is 256Mi (its Namespace's lampyr.dev/fiber-memory-share) and its other Revisions hold 0; lower max-scale or the memory request, delete unused Revisions, or ask an administrator for a larger share")))),
		OtherTestData: share("100%"),
	}, {
		Name: "a grant whose Home failed holds nothing: the next one fits",
		Key:  "default/hello-00001",
		Objects: []runtime.Object{fresh, grant("hog", withMemory("256Mi", 3), admitted, func(g *v1alpha1.CapacityGrant) {
			setReserved(g, 768<<20)
			g.Status.MarkHomeFailed(contract.ReasonTemplateNotAuthorized, "sealer not authorized")
		})},
		WantCreates: []runtime.Object{issuedSecret(fresh), homeService(fresh), homePod(fresh, noop)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			markAdmitted("512Mi"), reserve(512<<20), atHome, issued("grant-hello-00001", now),
			homeNotReady(contract.ReasonHomePending, "Home Pod lampyr-homes/"+hn+" created.")))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}}
	table.Test(t, factory)
}
