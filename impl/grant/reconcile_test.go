package grant

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgotesting "k8s.io/client-go/testing"
	pkgreconciler "knative.dev/pkg/reconciler"
	rtesting "knative.dev/pkg/reconciler/testing"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// What the generated reconciler writes around ReconcileKind, for the
// expected statuses: conditions initialized (Ready Unknown for a generation
// not observed yet) before, status.observedGeneration after.
func reconciled(marks ...func(*v1alpha1.CapacityGrant)) grantOpt {
	return func(g *v1alpha1.CapacityGrant) {
		pkgreconciler.PreProcessReconcile(context.Background(), g)
		for _, m := range marks {
			m(g)
		}
		g.Status.ObservedGeneration = g.Generation
	}
}

func markAdmitted(reserved string) func(*v1alpha1.CapacityGrant) {
	return func(g *v1alpha1.CapacityGrant) {
		g.Status.MarkAdmitted(fmt.Sprintf("Reserved %s of fiber memory; this namespace holds %s of its share of 1Gi.", reserved, reserved))
	}
}

func markNotAdmitted(reason contract.Reason, msg string) func(*v1alpha1.CapacityGrant) {
	return func(g *v1alpha1.CapacityGrant) { g.Status.MarkNotAdmitted(reason, "%s", msg) }
}

func reserve(n int64) func(*v1alpha1.CapacityGrant) {
	return func(g *v1alpha1.CapacityGrant) { setReserved(g, n) }
}

// atHome names the grant's Home and its Service as where it is reached.
func atHome(g *v1alpha1.CapacityGrant) {
	g.Status.Home = homeName(g)
	g.Status.HomeEndpoint = resources.HomeEndpoint(g, homesNS)
}

func issued(id string, at time.Time) func(*v1alpha1.CapacityGrant) {
	return func(g *v1alpha1.CapacityGrant) {
		g.Status.GrantID = id
		// Every grant issued names the Home's key (the tests' one key).
		g.Status.HomeKeySHA256 = testHomeKey.SHA256
		exp := metav1.NewTime(at.Add(10 * time.Minute))
		g.Status.ExpiresAt = &exp
	}
}

func homeNotReady(reason contract.Reason, msg string) func(*v1alpha1.CapacityGrant) {
	return func(g *v1alpha1.CapacityGrant) { g.Status.MarkHomeNotReady(reason, "%s", msg) }
}

func homeFailed(reason contract.Reason, msg string) func(*v1alpha1.CapacityGrant) {
	return func(g *v1alpha1.CapacityGrant) { g.Status.MarkHomeFailed(reason, "%s", msg) }
}

func homeReady(g *v1alpha1.CapacityGrant) { g.Status.MarkHomeReady() }

// issuedSecret is the Home Secret holding the grant the reconciler signs
// for g now (grant ID "grant-<name>", see newHarness).
func issuedSecret(g *v1alpha1.CapacityGrant) *corev1.Secret {
	c := resources.MakeClaims(g, testConfig(), testHelper, testHomeKey.SHA256, "grant-"+g.Name, metav1.NewTime(now))
	b, _ := signedgrant.Sign(testKeys.Signing, c)
	return resources.MakeHomeSecret(g, homesNS, b, testKeys.SigningPubPEM, testKeys.RouterPubPEM, testHomeKey)
}

// signedSecret is g's Home Secret holding grant id issued at issuedAt for
// the Home key key (empty: a grant naming no key, as earlier versions
// issued).
func signedSecret(g *v1alpha1.CapacityGrant, id string, issuedAt time.Time, key resources.HomeKey) *corev1.Secret {
	c := resources.MakeClaims(g, testConfig(), testHelper, key.SHA256, id, metav1.NewTime(issuedAt))
	b, _ := signedgrant.Sign(testKeys.Signing, c)
	return resources.MakeHomeSecret(g, homesNS, b, testKeys.SigningPubPEM, testKeys.RouterPubPEM, key)
}

func deleteHome(names ...string) []clientgotesting.DeleteActionImpl {
	var out []clientgotesting.DeleteActionImpl
	for _, n := range names {
		for _, res := range []string{"pods", "services", "secrets"} {
			out = append(out, clientgotesting.NewDeleteAction(corev1.SchemeGroupVersion.WithResource(res), homesNS, n))
		}
	}
	return out
}

func statusUpdate(g *v1alpha1.CapacityGrant) []clientgotesting.UpdateActionImpl {
	return []clientgotesting.UpdateActionImpl{{Object: g}}
}

func requeue(d time.Duration) map[string]any { return map[string]any{requeueKey: d} }

func TestReconcile(t *testing.T) {
	hn := resources.HomeNameFor("default", "hello-00001")
	gone := resources.HomeNameFor("default", "gone")
	// Another namespace's grant reserves 768Mi of 1Gi.
	big := grant("big", withMemory("256Mi", 3), admitted, func(g *v1alpha1.CapacityGrant) { g.Namespace = "other" })
	// The refusal names nothing of other namespaces or of what is free.
	capacityMsg := func(needs, mem string, max int, _ string) string {
		return fmt.Sprintf("needs %s (memoryPerFiber %s × maxFibers %d), and the installation's fiber memory is fully reserved (this namespace holds 0 of its share of 1Gi); lower max-scale or the memory request, delete unused Revisions, or ask an administrator to raise fiber-memory-capacity in ConfigMap config-lampyr", needs, mem, max)
	}
	fresh := grant("hello-00001")
	// A grant whose Home runs, holding a signed grant issued at issuedAt.
	running := func(g *v1alpha1.CapacityGrant, issuedAt time.Time, pod func(*corev1.Pod)) []runtime.Object {
		return []runtime.Object{g, homeSecret(g, issuedAt), homeService(g), homePod(g, pod)}
	}
	noop := func(*corev1.Pod) {}

	table := rtesting.TableTest{{
		Name:    "new grant that fits is admitted and gets a Home",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{fresh},
		WantCreates: []runtime.Object{
			issuedSecret(fresh), homeService(fresh), homePod(fresh, noop),
		},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			markAdmitted("512Mi"), reserve(512<<20), atHome, issued("grant-hello-00001", now),
			homeNotReady(contract.ReasonHomePending, "Home Pod lampyr-homes/"+hn+" created.")))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
		PostConditions:          []func(*testing.T, *rtesting.TableRow){checkNewHome},
	}, {
		Name:    "grant beyond the remaining capacity is refused with an actionable reason",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{big, grant("hello-00001", withMemory("128Mi", 3))},
		WantStatusUpdates: statusUpdate(grant("hello-00001", withMemory("128Mi", 3), reconciled(
			markNotAdmitted(contract.ReasonInsufficientMemory, capacityMsg("384Mi", "128Mi", 3, "256Mi"))))),
	}, {
		Name:    "maxFibers 0 takes the installation default",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{big, grant("hello-00001", withMemory("128Mi", 0))},
		WantCreates: func() []runtime.Object {
			g := grant("hello-00001", withMemory("128Mi", 0))
			return []runtime.Object{issuedSecret(g), homeService(g), homePod(g, noop)}
		}(),
		WantStatusUpdates: statusUpdate(grant("hello-00001", withMemory("128Mi", 0), reconciled(
			markAdmitted("256Mi"), reserve(256<<20), atHome, issued("grant-hello-00001", now),
			homeNotReady(contract.ReasonHomePending, "Home Pod lampyr-homes/"+hn+" created.")))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		Name: "an admitted grant that grows beyond the free capacity loses its admission",
		Key:  "default/hello-00001",
		// Holds 256Mi; now asks 512Mi; 1Gi - 768Mi (big) = 256Mi free. Its
		// Home goes now, not at its signed grant's expiry.
		Objects: append([]runtime.Object{big},
			running(grant("hello-00001", withMemory("128Mi", 4), admitted, reserve(256<<20)), now, ready)...),
		WantDeletes: deleteHome(hn),
		WantStatusUpdates: statusUpdate(grant("hello-00001", withMemory("128Mi", 4), admitted, reserve(256<<20), reconciled(
			markNotAdmitted(contract.ReasonInsufficientMemory, capacityMsg("512Mi", "128Mi", 4, "256Mi"))))),
		SkipNamespaceValidation: true,
	}, {
		Name: "an admitted grant keeps its reservation when the configuration shrinks",
		Key:  "default/hello-00001",
		// The default max was 4 when it was admitted (512Mi); it is 2 now.
		Objects: append([]runtime.Object{big}, running(grant("hello-00001", withMemory("128Mi", 0), admitted, reserve(512<<20)), now, ready)...),
		WantStatusUpdates: statusUpdate(grant("hello-00001", withMemory("128Mi", 0), admitted, reconciled(
			reserve(256<<20), atHome, issued("old-grant", now), homeReady))),
		OtherTestData: requeue(5 * time.Minute),
	}, {
		Name:    "memory per fiber above the cap",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{grant("hello-00001", withMemory("1Gi", 1))},
		WantStatusUpdates: statusUpdate(grant("hello-00001", withMemory("1Gi", 1), reconciled(
			markNotAdmitted(contract.ReasonMemoryPerFiberTooLarge, "memoryPerFiber 1Gi exceeds the per-fiber cap 512Mi; lower the Revision's memory request or raise max-memory-per-fiber in ConfigMap config-lampyr")))),
	}, {
		Name:    "too many fibers",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{grant("hello-00001", withMemory("1Mi", 17))},
		WantStatusUpdates: statusUpdate(grant("hello-00001", withMemory("1Mi", 17), reconciled(
			markNotAdmitted(contract.ReasonTooManyFibers, "maxFibers 17 exceeds the per-grant cap 16; lower autoscaling.knative.dev/max-scale or raise max-fibers-per-grant in ConfigMap config-lampyr")))),
	}, {
		Name:    "template not pinned by digest",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{grant("hello-00001", unpinnedTemplate)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", unpinnedTemplate, reconciled(
			markNotAdmitted(contract.ReasonInvalidSpec, `spec.template: reference "localhost:5002/t:hello-00001" must be digest-pinned (repo@sha256:<64 hex>): a digest must contain exactly one '@' separator (e.g. registry/repository@digest) saw: localhost:5002/t:hello-00001`)))),
	}, {
		Name:    "ready Home with a fresh grant: Ready, nothing written to the cluster",
		Key:     "default/hello-00001",
		Objects: running(grant("hello-00001", admitted), now.Add(-time.Minute), ready),
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now.Add(-time.Minute)), homeReady))),
		OtherTestData: requeue(4 * time.Minute),
	}, {
		Name:        "grant past half its life is renewed",
		Key:         "default/hello-00001",
		Objects:     running(grant("hello-00001", admitted), now.Add(-6*time.Minute), ready),
		WantUpdates: []clientgotesting.UpdateActionImpl{{Object: issuedSecret(grant("hello-00001"))}},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("grant-hello-00001", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		// A renewal must not change what fiber-router accepts: the key
		// stays for the Secret's life (newHomeKey would give testHomeKey).
		Name: "renewal keeps the Home's key",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			objs := running(g, now.Add(-6*time.Minute), ready)
			objs[1] = signedSecret(g, "old-grant", now.Add(-6*time.Minute), otherHomeKey)
			return objs
		}(),
		WantUpdates: []clientgotesting.UpdateActionImpl{{Object: signedSecret(grant("hello-00001"), "grant-hello-00001", now, otherHomeKey)}},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("grant-hello-00001", now), homeReady, func(g *v1alpha1.CapacityGrant) {
				g.Status.HomeKeySHA256 = otherHomeKey.SHA256
			}))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		// A Home Secret an earlier version wrote (no home-key.pem, a grant
		// naming no key): its valid grant is not current; the Home gets a
		// key and a grant that names it.
		Name: "Home Secret of an earlier version gets a key and a grant naming it",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			objs := running(g, now.Add(-time.Minute), ready)
			legacy := signedSecret(g, "old-grant", now.Add(-time.Minute), resources.HomeKey{})
			delete(legacy.Data, resources.SecretKeyHomeKey)
			objs[1] = legacy
			return objs
		}(),
		WantUpdates: []clientgotesting.UpdateActionImpl{{Object: issuedSecret(grant("hello-00001"))}},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("grant-hello-00001", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		Name: "grant whose spec changed is reissued with the new terms",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			objs := running(g, now.Add(-time.Minute), ready)
			g.Spec.MaxFibers = 2
			return objs
		}(),
		WantUpdates: []clientgotesting.UpdateActionImpl{{Object: issuedSecret(grant("hello-00001", withMemory("128Mi", 2)))}},
		WantStatusUpdates: statusUpdate(grant("hello-00001", withMemory("128Mi", 2), admitted, reconciled(
			reserve(256<<20), atHome, issued("grant-hello-00001", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		Name: "failed Home Pod is replaced",
		Key:  "default/hello-00001",
		Objects: running(grant("hello-00001", admitted), now, func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.Message = "Evicted"
		}),
		WantDeletes: []clientgotesting.DeleteActionImpl{clientgotesting.NewDeleteAction(corev1.SchemeGroupVersion.WithResource("pods"), homesNS, hn)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now),
			homeFailed(contract.ReasonHomeFailed, "Home Pod lampyr-homes/"+hn+" is Failed; replacing it. Evicted")))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		// Deleted by hand, evicted or drained: its replacement starts at
		// once under the next name while it drains its requests.
		// fiberd serves on after SIGTERM while it is Ready (it hands
		// over): it stays the Home until the replacement is Ready.
		Name: "a Home Pod being deleted serves while it hands over, and is replaced at once under another name",
		Key:  "default/hello-00001",
		Objects: running(grant("hello-00001", admitted), now, func(p *corev1.Pod) {
			ready(p)
			p.DeletionTimestamp = &metav1.Time{Time: now}
			p.Finalizers = []string{"test/keep"} // the fake tracker keeps a Pod with a deletion time only with one
		}),
		WantCreates: []runtime.Object{homePodN(grant("hello-00001", admitted), 1)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		// Its handover over, it drains and is not Ready: the Revision
		// waits for the replacement (fiber-router holds its requests).
		Name: "a Home Pod being deleted and no longer Ready is replaced at once under another name",
		Key:  "default/hello-00001",
		Objects: running(grant("hello-00001", admitted), now, func(p *corev1.Pod) {
			p.DeletionTimestamp = &metav1.Time{Time: now}
			p.Finalizers = []string{"test/keep"}
		}),
		WantCreates: []runtime.Object{homePodN(grant("hello-00001", admitted), 1)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now),
			homeNotReady(contract.ReasonHomePending, "Home Pod lampyr-homes/"+hn+" is being deleted and drains its requests; its replacement "+hn+"-1 created.")))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		// The replacement exists and starts: the Pod handing over still
		// serves; once the replacement is Ready, it is the Home.
		Name: "a Home Pod handing over serves until its replacement is Ready",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			repl := homePodN(g, 1)
			repl.CreationTimestamp = metav1.Time{Time: now.Add(time.Second)}
			return append(running(g, now, func(p *corev1.Pod) {
				ready(p)
				p.DeletionTimestamp = &metav1.Time{Time: now}
				p.Finalizers = []string{"test/keep"}
			}), repl)
		}(),
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		Name: "of two live Home Pods the older is kept",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			second := homePodN(g, 1)
			second.CreationTimestamp = metav1.Time{Time: now.Add(time.Second)}
			return append(running(g, now, func(p *corev1.Pod) { ready(p); p.CreationTimestamp = metav1.Time{Time: now} }), second)
		}(),
		WantDeletes: []clientgotesting.DeleteActionImpl{clientgotesting.NewDeleteAction(corev1.SchemeGroupVersion.WithResource("pods"), homesNS, hn+"-1")},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		// An upgrade changed the Home image: the outdated Home serves
		// until its replacement is Ready (make before break).
		Name: "a Home of an outdated image keeps serving while its replacement starts",
		Key:  "default/hello-00001",
		Objects: running(grant("hello-00001", admitted), now, func(p *corev1.Pod) {
			ready(p)
			p.Spec.Containers[0].Image = "kind.local/fiberd@sha256:" + strings.Repeat("0", 64)
		}),
		WantCreates: []runtime.Object{homePodN(grant("hello-00001", admitted), 1)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		Name: "once the replacement is Ready the outdated Home goes",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			next := homePodN(g, 1)
			ready(next)
			next.CreationTimestamp = metav1.Time{Time: now.Add(time.Second)}
			return append(running(g, now, func(p *corev1.Pod) {
				ready(p)
				p.Spec.Containers[0].Image = "kind.local/fiberd@sha256:" + strings.Repeat("0", 64)
			}), next)
		}(),
		WantDeletes: []clientgotesting.DeleteActionImpl{clientgotesting.NewDeleteAction(corev1.SchemeGroupVersion.WithResource("pods"), homesNS, hn)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		// After a replacement: the Home runs as <home>-1 and its
		// predecessor is gone. It moves back to the Home's own name, which
		// an earlier grant controller (a downgrade) knows; -1 serves
		// meanwhile.
		Name: "a replacement under another name moves back to the Home's own name",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			p := homePodN(g, 1)
			ready(p)
			return []runtime.Object{g, homeSecret(g, now), homeService(g), p}
		}(),
		WantCreates: []runtime.Object{homePod(grant("hello-00001", admitted), noop)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		Name: "the Home under its own name starting: the replacement still serves",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			p := homePodN(g, 1)
			ready(p)
			return append(running(g, now, noop), p)
		}(),
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		Name: "the Home under its own name Ready: the replacement goes",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			p := homePodN(g, 1)
			ready(p)
			return append(running(g, now, ready), p)
		}(),
		WantDeletes: []clientgotesting.DeleteActionImpl{clientgotesting.NewDeleteAction(corev1.SchemeGroupVersion.WithResource("pods"), homesNS, hn+"-1")},
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now), homeReady))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(5 * time.Minute),
	}, {
		Name: "Home Pod crash-looping reports why",
		Key:  "default/hello-00001",
		Objects: running(grant("hello-00001", admitted), now, func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "fiberd", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s"}}}}
		}),
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now),
			homeNotReady(contract.ReasonHomeNotReady, "Home Pod "+hn+" container fiberd: CrashLoopBackOff back-off 10s")))),
		OtherTestData: requeue(5 * time.Minute),
	}, {
		Name: "a foreign Secret with the Home's name is left alone",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			s := homeSecret(g, now)
			s.Labels = map[string]string{"app": "someone-else"}
			return []runtime.Object{g, s}
		}(),
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome,
			homeFailed(contract.ReasonHomeNameTaken, "Secret lampyr-homes/"+hn+" exists and was not made for this CapacityGrant; delete it")))),
	}, {
		Name: "a leftover Home of an earlier grant of the same name is replaced",
		Key:  "default/hello-00001",
		Objects: func() []runtime.Object {
			old := grant("hello-00001", admitted)
			old.UID = "uid-earlier"
			return []runtime.Object{grant("hello-00001", admitted), homeSecret(old, now), homeService(old), homePod(old, ready)}
		}(),
		WantDeletes: deleteHome(hn),
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome,
			homeNotReady(contract.ReasonHomePending, "The Home of an earlier CapacityGrant named hello-00001 is being deleted.")))),
		SkipNamespaceValidation: true,
		OtherTestData:           requeue(time.Second),
	}, {
		Name: "deleted grant: its Home (found by its labels) is deleted",
		Key:  "default/gone",
		Objects: func() []runtime.Object {
			g := grant("gone", admitted)
			return []runtime.Object{homeSecret(g, now), homeService(g), homePod(g, ready)}
		}(),
		WantDeletes:             deleteHome(gone),
		SkipNamespaceValidation: true,
	}, {
		Name: "deleted grant without a Home: nothing to do",
		Key:  "default/gone",
	}, {
		Name:    "Home image not pinned by digest",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{fresh},
		// Checked before anything is booked or made.
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			homeFailed(contract.ReasonHomeImageNotPinned, `home-image "kind.local/fiberd:latest" in ConfigMap config-lampyr is not pinned by digest (reference "kind.local/fiberd:latest" must be digest-pinned (repo@sha256:<64 hex>): a digest must contain exactly one '@' separator (e.g. registry/repository@digest) saw: kind.local/fiberd:latest); use repository@sha256:<digest>`)))),
		OtherTestData: map[string]any{configKey: func(c *lampyrconfig.Config) { c.HomeImage = "kind.local/fiberd:latest" }},
	}, {
		// CI once saw homeEndpoint blanked when the Service create raced
		// the informer cache: the status written when a later step fails
		// still names the Home Service.
		Name:    "the Home endpoint survives a failed step",
		Key:     "default/hello-00001",
		Objects: []runtime.Object{fresh},
		WithReactors: []clientgotesting.ReactionFunc{func(a clientgotesting.Action) (bool, runtime.Object, error) {
			if a.GetVerb() == "create" && a.GetResource().Resource == "services" {
				return true, nil, fmt.Errorf("services %q already exists", hn)
			}
			return false, nil, nil
		}},
		WantCreates: []runtime.Object{issuedSecret(fresh), homeService(fresh)},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			markAdmitted("512Mi"), reserve(512<<20), atHome, issued("grant-hello-00001", now)))),
		WantErr:                 true,
		WantEvents:              []string{rtesting.Eventf(corev1.EventTypeWarning, "InternalError", "creating Service lampyr-homes/%s: services %q already exists", hn, hn)},
		SkipNamespaceValidation: true,
	}}
	table.Test(t, factory)
}

func unpinnedTemplate(g *v1alpha1.CapacityGrant) { g.Spec.Template = "localhost:5002/t:hello-00001" }

// checkNewHome: what a new Home is made of (the created objects of the row
// "new grant that fits").
func checkNewHome(t *testing.T, row *rtesting.TableRow) {
	h := row.OtherTestData[harnessKey].(*harness)
	g := grant("hello-00001")
	hn := homeName(g)
	ctx := context.Background()
	if !strings.HasPrefix(hn, "hello-00001-") || len(hn) != len("hello-00001-")+10 {
		t.Errorf("Home name %q: want the grant's name and 10 hex digits", hn)
	}
	st := h.status()
	s, err := h.kube.CoreV1().Secrets(homesNS).Get(ctx, hn, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := signedgrant.Verify(testKeys.Signing.Public().(ed25519.PublicKey), s.Data[resources.SecretKeyGrant], now)
	if err != nil {
		t.Fatalf("issued grant does not verify: %v", err)
	}
	if c.GrantID != st.Status.GrantID || c.MaxFibers != 4 || c.MemoryPerFiberBytes != 128<<20 || c.Revision != "hello-00001" || c.Home != hn || c.Helper != testHelper {
		t.Errorf("issued claims %+v", c)
	}
	// The grant, two public keys and the Home's own TLS key, which the
	// grant and the status name: nothing in a Home's Secret acts on
	// another Home or opens another template.
	if len(s.Data) != 4 || string(s.Data[resources.SecretKeyRouterPubKeys]) != string(testKeys.RouterPubPEM) || string(s.Data[resources.SecretKeyGrantPubKey]) != string(testKeys.SigningPubPEM) {
		t.Errorf("Home Secret keys %v", keysOf(s.Data))
	}
	for k, v := range s.Data {
		if strings.Contains(string(v), "PRIVATE KEY") && k != resources.SecretKeyHomeKey {
			t.Errorf("Home Secret key %s holds a private key", k)
		}
	}
	if hk, ok := resources.HomeKeyOf(s); !ok || c.HomeKeySHA256 != hk.SHA256 || st.Status.HomeKeySHA256 != hk.SHA256 {
		t.Errorf("Home key %s (%v): the grant names %q, status.homeKeySHA256 %q", hk.SHA256, ok, c.HomeKeySHA256, st.Status.HomeKeySHA256)
	}
	p, _ := h.kube.CoreV1().Pods(homesNS).Get(ctx, hn, metav1.GetOptions{})
	if *p.Spec.AutomountServiceAccountToken || len(p.OwnerReferences) != 0 || !resources.IsHomeOf(p, g) {
		t.Errorf("Home Pod: no service-account token, no owner reference across namespaces, labelled for its grant: %+v", p.ObjectMeta)
	}
	if _, err := h.kube.CoreV1().Pods("default").Get(ctx, hn, metav1.GetOptions{}); err == nil {
		t.Error("a Home Pod runs in the tenant namespace")
	}
	if got := p.Spec.Containers[0].Resources.Limits.Memory().String(); got != "768Mi" { // 4×128Mi + 256Mi
		t.Errorf("Home memory limit %s, want 768Mi", got)
	}
}
