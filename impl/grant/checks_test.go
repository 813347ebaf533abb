package grant

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgotesting "k8s.io/client-go/testing"
	"knative.dev/pkg/apis"
	rtesting "knative.dev/pkg/reconciler/testing"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	fiberdclient "lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/seal"
)

// diagnosed asks that the row's fiberd be asked wantCalls times.
func diagnosed(d *fakeDiagnoser, wantCalls int) map[string]any {
	return map[string]any{diagnoserKey: d, "calls": wantCalls, requeueKey: homeDiagnosisInterval}
}

func checkCalls(t *testing.T, row *rtesting.TableRow) {
	d := row.OtherTestData[diagnoserKey].(*fakeDiagnoser)
	if want := row.OtherTestData["calls"].(int); d.calls != want {
		t.Errorf("fiberd asked %d times, want %d", d.calls, want)
	}
}

// TestHomeDiagnosis: a running, not-ready Home says why through its grant:
// a load failure fiberd reports is HomeReady False with fiberd's reason, a
// handler that fails its starts is HomeReady False with the handler's
// facts and words (not the Home's name or address: the Revision's owner
// reads them), a slow start stays Unknown with fiberd's words, and a ready
// Home is not asked.
func TestHomeDiagnosis(t *testing.T) {
	hn := resources.HomeNameFor("default", "hello-00001")
	running := func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = "10.244.0.7"
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	}
	home := func(pod func(*corev1.Pod)) []runtime.Object {
		g := grant("hello-00001", admitted)
		return []runtime.Object{g, homeSecret(g, now), homeService(g), homePod(g, pod)}
	}
	want := func(mark func(*v1alpha1.CapacityGrant)) []clientgotesting.UpdateActionImpl {
		return statusUpdate(grant("hello-00001", admitted, reconciled(reserve(512<<20), atHome, issued("old-grant", now), mark)))
	}
	handlerFailed := func(f v1alpha1.HandlerFailure, msg string) func(*v1alpha1.CapacityGrant) {
		return func(g *v1alpha1.CapacityGrant) { g.Status.MarkHandlerFailed(f, msg) }
	}
	check := []func(*testing.T, *rtesting.TableRow){checkCalls}

	table := rtesting.TableTest{{
		Name:    "handler exits at start-up",
		Key:     "default/hello-00001",
		Objects: home(running),
		WantStatusUpdates: want(handlerFailed(
			v1alpha1.HandlerFailure{Reason: contract.ReasonHandlerExited, ExitCode: 5, Output: "Started...\nCrashed...\ufffd[0m"},
			"the handler exited with code 5 before it listened on $PORT (8080)")),
		OtherTestData: diagnosed(&fakeDiagnoser{reason: "HandlerExited", msg: "the handler exited with code 5 before it listened on $PORT (8080)", ok: true,
			handler: &fiberdclient.HandlerFailure{ExitCode: 5, Output: "Started...\nCrashed...\x1b[0m", ConsecutiveFailures: 3}}, 1),
		PostConditions: check,
	}, {
		Name:    "handler killed by a signal",
		Key:     "default/hello-00001",
		Objects: home(running),
		WantStatusUpdates: want(handlerFailed(
			v1alpha1.HandlerFailure{Reason: contract.ReasonHandlerExited, ExitCode: 137, Signal: "SIGKILL"},
			"the handler was killed by signal SIGKILL (exit code 137) before it listened on $PORT (8080)")),
		OtherTestData: diagnosed(&fakeDiagnoser{reason: "HandlerExited", msg: "the handler was killed by signal SIGKILL (exit code 137) before it listened on $PORT (8080)", ok: true,
			handler: &fiberdclient.HandlerFailure{ExitCode: 137, Signal: "SIGKILL"}}, 1),
		PostConditions: check,
	}, {
		Name:    "handler never listens; its output is bounded",
		Key:     "default/hello-00001",
		Objects: home(running),
		WantStatusUpdates: want(handlerFailed(
			v1alpha1.HandlerFailure{Reason: contract.ReasonHandlerNotListening, Output: strings.Repeat("y", v1alpha1.MaxHandlerOutput)},
			"the handler did not listen on $PORT (8080) within the start-up timeout of 10s")),
		OtherTestData: diagnosed(&fakeDiagnoser{reason: "HandlerNotListening", msg: "the handler did not listen on $PORT (8080) within the start-up timeout of 10s", ok: true,
			handler: &fiberdclient.HandlerFailure{Output: strings.Repeat("y", 5000)}}, 1),
		PostConditions: check,
	}, {
		Name:              "a handler reason without details is not a handler failure",
		Key:               "default/hello-00001",
		Objects:           home(running),
		WantStatusUpdates: want(homeNotReady(contract.ReasonHomeNotReady, "Home Pod lampyr-homes/"+hn+" is running; fiberd is not ready: the handler exited")),
		OtherTestData:     diagnosed(&fakeDiagnoser{reason: "HandlerExited", msg: "the handler exited", ok: true}, 1),
		PostConditions:    check,
	}, {
		Name:              "template port differs from the snapshot's",
		Key:               "default/hello-00001",
		Objects:           home(running),
		WantStatusUpdates: want(homeFailed(contract.ReasonTemplateMismatch, "fiberd in Home Pod lampyr-homes/"+hn+" cannot run this Revision: TemplateMismatch: template helper.port 8080 differs from the snapshot's port 9000")),
		OtherTestData:     diagnosed(&fakeDiagnoser{reason: "TemplateMismatch", msg: `TemplateMismatch: template helper.port 8080 differs from the snapshot's port 9000`, ok: true}, 1),
		PostConditions:    check,
	}, {
		Name:              "snapshot over fiberd's limits",
		Key:               "default/hello-00001",
		Objects:           home(running),
		WantStatusUpdates: want(homeFailed(contract.ReasonSnapshotTooLarge, "fiberd in Home Pod lampyr-homes/"+hn+" cannot run this Revision: SnapshotTooLarge: unpacked size limit of 1073741824 bytes exceeded")),
		OtherTestData:     diagnosed(&fakeDiagnoser{reason: contract.ReasonSnapshotTooLarge, msg: "SnapshotTooLarge: unpacked size limit of 1073741824 bytes exceeded", ok: true}, 1),
		PostConditions:    check,
	}, {
		Name:              "a load reason in the message only is not a load failure",
		Key:               "default/hello-00001",
		Objects:           home(running),
		WantStatusUpdates: want(homeNotReady(contract.ReasonHomeNotReady, "Home Pod lampyr-homes/"+hn+" is running; fiberd is not ready: SnapshotUnavailable: not really")),
		OtherTestData:     diagnosed(&fakeDiagnoser{reason: contract.ReasonNotReady, msg: "SnapshotUnavailable: not really", ok: true}, 1),
		PostConditions:    check,
	}, {
		Name:              "still warming",
		Key:               "default/hello-00001",
		Objects:           home(running),
		WantStatusUpdates: want(homeNotReady(contract.ReasonHomeNotReady, "Home Pod lampyr-homes/"+hn+" is running; fiberd is not ready: warm pool not filled yet")),
		OtherTestData:     diagnosed(&fakeDiagnoser{msg: "warm pool not filled yet", ok: true}, 1),
		PostConditions:    check,
	}, {
		Name:              "fiberd does not answer: the Pod's own view stays",
		Key:               "default/hello-00001",
		Objects:           home(running),
		WantStatusUpdates: want(homeNotReady(contract.ReasonHomeNotReady, "Home Pod "+hn+" is Running and not ready yet (fiberd /readyz: valid grant, template opened, snapshot verified, pool warm).")),
		OtherTestData:     diagnosed(&fakeDiagnoser{}, 1),
		PostConditions:    check,
	}, {
		Name:              "ready Home: not asked",
		Key:               "default/hello-00001",
		Objects:           home(ready),
		WantStatusUpdates: want(homeReady),
		OtherTestData: func() map[string]any {
			d := diagnosed(&fakeDiagnoser{reason: "TemplateMismatch", msg: "TemplateMismatch: never", ok: true}, 0)
			d[requeueKey] = 5 * time.Minute
			return d
		}(),
		PostConditions: check,
	}}
	table.Test(t, factory)
}

// TestPreinitObserved: a ready Home whose fiberd pre-initializes fibers
// (gvisor, fiber-gvisor-preinit) is asked once per Home Pod how the
// Revision's fibers start, and the grant's FibersPreinitialized says it
// (severity Info: Ready stays True when they start cold); a Home on any
// other backend is never asked.
func TestPreinitObserved(t *testing.T) {
	const uid = "pod-uid-1"
	preinit := func() func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			ready(p)
			p.UID = uid
			p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--backend=gvisor", "--gvisor-preinit=true")
		}
	}
	home := func(pod func(*corev1.Pod), opts ...grantOpt) []runtime.Object {
		g := grant("hello-00001", append([]grantOpt{admitted}, opts...)...)
		return []runtime.Object{g, homeSecret(g, now), homeService(g), homePod(g, pod)}
	}
	want := func(mark ...grantOpt) []clientgotesting.UpdateActionImpl {
		return statusUpdate(grant("hello-00001", append([]grantOpt{admitted, reconciled(reserve(512<<20), atHome, issued("old-grant", now), homeReady)}, mark...)...))
	}
	asked := func(d *fakeDiagnoser, calls int, requeue time.Duration) map[string]any {
		return map[string]any{diagnoserKey: d, "calls": calls, requeueKey: requeue}
	}
	check := []func(*testing.T, *rtesting.TableRow){checkCalls}
	restored := fiberdclient.Readiness{Ready: true, Preinit: &fiberdclient.Preinit{Restored: true}}
	cold := fiberdclient.Readiness{Ready: true, Preinit: &fiberdclient.Preinit{Message: "runsc checkpoint did not finish within 1m0s (gvisor.Config.CheckpointTimeout)"}}
	pending := fiberdclient.Readiness{Ready: true, Preinit: &fiberdclient.Preinit{Pending: true, Message: "no checkpoint made yet"}}

	table := rtesting.TableTest{{
		Name:              "restored from a checkpoint",
		Key:               "default/hello-00001",
		Objects:           home(preinit()),
		WantStatusUpdates: want(func(g *v1alpha1.CapacityGrant) { g.Status.MarkFibersPreinitialized(uid) }),
		OtherTestData:     asked(&fakeDiagnoser{readiness: restored, readinessOK: true}, 1, 5*time.Minute),
		PostConditions:    check,
	}, {
		Name:    "the checkpoint failed: cold starts, said as Info",
		Key:     "default/hello-00001",
		Objects: home(preinit()),
		WantStatusUpdates: want(func(g *v1alpha1.CapacityGrant) {
			g.Status.MarkFibersStartCold(uid, "%s", "The Revision's fibers start cold: no checkpoint of the initialized handler could be made: runsc checkpoint did not finish within 1m0s (gvisor.Config.CheckpointTimeout)")
			if c := g.Status.GetCondition(v1alpha1.GrantConditionFibersPreinitialized); c.Severity != apis.ConditionSeverityInfo || !g.Status.IsReady() {
				t.Errorf("a cold start made the grant not ready or is not Info: %+v", c)
			}
		}),
		OtherTestData:  asked(&fakeDiagnoser{readiness: cold, readinessOK: true}, 1, 5*time.Minute),
		PostConditions: check,
	}, {
		Name:    "no fiber started yet: asked again later",
		Key:     "default/hello-00001",
		Objects: home(preinit()),
		WantStatusUpdates: want(func(g *v1alpha1.CapacityGrant) {
			g.Status.MarkFibersPreinitPending("%s", "No fiber has started yet; the first makes the checkpoint of the initialized handler.")
		}),
		OtherTestData:  asked(&fakeDiagnoser{readiness: pending, readinessOK: true}, 1, preinitPendingInterval),
		PostConditions: check,
	}, {
		Name:              "fiberd does not answer: asked again",
		Key:               "default/hello-00001",
		Objects:           home(preinit()),
		WantStatusUpdates: want(),
		OtherTestData:     asked(&fakeDiagnoser{}, 1, homeDiagnosisInterval),
		PostConditions:    check,
	}, {
		Name:           "this Home Pod was asked already",
		Key:            "default/hello-00001",
		Objects:        home(preinit(), reconciled(reserve(512<<20), atHome, issued("old-grant", now), homeReady), func(g *v1alpha1.CapacityGrant) { g.Status.MarkFibersPreinitialized(uid) }),
		OtherTestData:  asked(&fakeDiagnoser{readiness: cold, readinessOK: true}, 0, 5*time.Minute),
		PostConditions: check,
	}, {
		Name:              "a Home on the process backend: not asked, a leftover condition cleared",
		Key:               "default/hello-00001",
		Objects:           home(ready, func(g *v1alpha1.CapacityGrant) { g.Status.MarkFibersPreinitialized("an-older-pod") }),
		WantStatusUpdates: want(func(g *v1alpha1.CapacityGrant) { g.Status.PreinitObservedPod = "" }),
		OtherTestData:     asked(&fakeDiagnoser{readiness: restored, readinessOK: true}, 0, 5*time.Minute),
		PostConditions:    check,
	}}
	table.Test(t, factory)
}

// TestTemplateChecks: the grant controller opens every template itself and
// runs a Revision only from one a trusted sealer sealed for exactly this
// namespace, Revision and snapshot (docs/security.md §2). A refused template
// stops a running Home; a registry that does not answer does not.
func TestTemplateChecks(t *testing.T) {
	hn := resources.HomeNameFor("default", "hello-00001")
	mallory, _ := seal.GenerateSealerKey()
	alice, _ := seal.GenerateSealerKey()
	otherFleet, _ := seal.GenerateFleetKey()
	sealers := func(namespaces ...string) *corev1.ConfigMap {
		v, _ := seal.FormatSealer(seal.TrustedSealer{Key: alice.Public(), Namespaces: namespaces})
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: contract.SealersConfigMap, Namespace: systemNS}, Data: map[string]string{"alice": v}}
	}
	fresh := grant("hello-00001")
	ref := "sealed template " + templateRef("hello-00001")
	running := func() []runtime.Object {
		g := grant("hello-00001", admitted)
		return []runtime.Object{g, homeSecret(g, now.Add(-time.Minute)), homeService(g), homePod(g, ready)}
	}
	// template replaces the registry's template (nil: the registry cannot
	// answer).
	template := func(sealed func(t testing.TB) []byte) func(testing.TB, map[string][]byte) {
		return func(t testing.TB, m map[string][]byte) {
			delete(m, templateRef("hello-00001"))
			if sealed != nil {
				m[templateRef("hello-00001")] = sealed(t)
			}
		}
	}
	with := func(sealed func(t testing.TB) []byte, requeue time.Duration) map[string]any {
		return map[string]any{templatesKey: template(sealed), requeueKey: requeue}
	}
	refusedNew := func(reason contract.Reason, msg string) []clientgotesting.UpdateActionImpl {
		// Nothing is booked before the template and snapshot pass.
		return statusUpdate(grant("hello-00001", reconciled(homeFailed(reason, msg))))
	}

	table := rtesting.TableTest{{
		Name:    "replayed from another namespace, with a Home running: the Home stops",
		Key:     "default/hello-00001",
		Objects: running(),
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			homeFailed(contract.ReasonTemplateMismatch, `template was sealed for namespace "victim" but the Revision is in "default": a template cannot be replayed into another namespace; deploy the Service with `+"`ly deploy`"+` in this namespace`)))),
		WantDeletes:             deleteHome(hn),
		SkipNamespaceValidation: true,
		OtherTestData:           with(func(t testing.TB) []byte { return sealFor(t, testSealer, "victim", "hello-00001") }, 0),
	}, {
		Name:              "sealed by an identity nobody trusts",
		Key:               "default/hello-00001",
		Objects:           []runtime.Object{fresh},
		WantStatusUpdates: refusedNew(contract.ReasonTemplateUnauthenticated, ref+": template sealed by an identity this installation does not trust: it was signed by sealer key "+mallory.KeyID()[:16]+"; an administrator authorizes a `ly` identity with `ly cluster authorize-sealer` (ConfigMap lampyr-system/lampyr-template-sealers)"),
		OtherTestData:     with(func(t testing.TB) []byte { return sealFor(t, mallory, "default", "hello-00001") }, 0),
	}, {
		Name:              "sealed by a ly identity authorized for other namespaces",
		Key:               "default/hello-00001",
		Objects:           []runtime.Object{fresh, sealers("team-b")},
		WantStatusUpdates: refusedNew(contract.ReasonTemplateNotAuthorized, ref+`: sealer not authorized for the template's namespace: sealer "alice" (key `+alice.KeyID()[:16]+`) may seal for team-b, not for namespace "default"; an administrator extends it with `+"`ly cluster authorize-sealer`"),
		OtherTestData:     with(func(t testing.TB) []byte { return sealFor(t, alice, "default", "hello-00001") }, 0),
	}, {
		Name:        "sealed by a ly identity authorized for this namespace",
		Key:         "default/hello-00001",
		Objects:     []runtime.Object{fresh, sealers("team-b", "default")},
		WantCreates: []runtime.Object{issuedSecret(fresh), homeService(fresh), homePod(fresh, func(*corev1.Pod) {})},
		WantStatusUpdates: statusUpdate(grant("hello-00001", reconciled(
			markAdmitted("512Mi"), reserve(512<<20), atHome, issued("grant-hello-00001", now),
			homeNotReady(contract.ReasonHomePending, "Home Pod lampyr-homes/"+hn+" created.")))),
		SkipNamespaceValidation: true,
		OtherTestData:           with(func(t testing.TB) []byte { return sealFor(t, alice, "default", "hello-00001") }, 5*time.Minute),
	}, {
		Name:              "a format v1 template (unsigned)",
		Key:               "default/hello-00001",
		Objects:           []runtime.Object{fresh},
		WantStatusUpdates: refusedNew(contract.ReasonTemplateUnauthenticated, ref+": template is not signed: it is a format v1 template (no sealer signature, not bound to a namespace), made by an older ly; redeploy with `ly deploy` to reseal it"),
		OtherTestData:     with(func(testing.TB) []byte { return append([]byte("LYTPL1\x00\x00"), make([]byte, 100)...) }, 0),
	}, {
		Name:              "sealed to another installation's fleet key",
		Key:               "default/hello-00001",
		Objects:           []runtime.Object{fresh},
		WantStatusUpdates: refusedNew(contract.ReasonTemplateUnsealable, ref+": template sealed to another fleet key: it names fleet key "+otherFleet.Public().KeyID()[:16]+" but this cluster holds "+testFleet.Public().KeyID()[:16]+"; re-run `ly deploy` against this cluster so the template is sealed to its key (ConfigMap lampyr-system/lampyr-fleet-key)"),
		OtherTestData: with(func(testing.TB) []byte {
			b, _ := seal.Seal(otherFleet.Public(), testSealer, seal.Template{Namespace: "default", Revision: "hello-00001", SnapshotDigest: digest, Execution: seal.ExecutionPolicy{Mode: "fresh"}, Helper: seal.HelperFacts{Port: 8080}})
			return b
		}, 0),
	}, {
		Name:              "registry does not answer, nothing running yet: asked again shortly",
		Key:               "default/hello-00001",
		Objects:           []runtime.Object{fresh},
		WantStatusUpdates: refusedNew(contract.ReasonTemplateUnavailable, "cannot read the sealed template "+templateRef("hello-00001")+": GET "+templateRef("hello-00001")+": connection refused"),
		OtherTestData:     with(nil, templateRetry),
	}, {
		Name:    "registry does not answer, Home running on its grant: it keeps running",
		Key:     "default/hello-00001",
		Objects: running(),
		WantStatusUpdates: statusUpdate(grant("hello-00001", admitted, reconciled(
			reserve(512<<20), atHome, issued("old-grant", now.Add(-time.Minute)), homeReady))),
		OtherTestData: with(nil, 4*time.Minute),
	}}
	table.Test(t, factory)
}
