package grant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgotesting "k8s.io/client-go/testing"
	"knative.dev/pkg/controller"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
)

// servingHome is g's Home Pod, Ready for an hour, its fiberd started an
// hour ago.
func servingHome(g *v1alpha1.CapacityGrant, mut ...func(*corev1.Pod)) *corev1.Pod {
	p := homePod(g, ready)
	p.UID = "home-pod-uid"
	p.ResourceVersion = "1"
	p.Status.PodIP = "10.244.0.7"
	p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(now.Add(-time.Hour))
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: resources.FiberdContainer, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now.Add(-time.Hour))}}}}
	for _, m := range mut {
		m(p)
	}
	return p
}

// givenBack: the Home gave back its reservation earlier.
func givenBack(p *corev1.Pod) {
	*p = *resources.WithRequests(p, resources.IdleRequests(testConfig()))
	p.Annotations = map[string]string{resources.ReservationAnnotation: resources.ReservationIdle}
}

// idleHarness runs g's reconcile over its Home (Secret, Service, pod) with
// fiberd answering d; cfg edits the configuration.
func idleHarness(t *testing.T, g *v1alpha1.CapacityGrant, pod *corev1.Pod, d *fakeDiagnoser, cfg func(*lampyrconfig.Config), reactors ...clientgotesting.ReactionFunc) *harness {
	t.Helper()
	h := newHarness(t, []runtime.Object{g, homeSecret(g, now), homeService(g), pod}, reactors...)
	h.r.diagnoser = d
	if cfg != nil {
		h.configured(cfg)
	}
	return h
}

// reconcileAt reconciles g at the given time and returns the requeue asked.
func (h *harness) reconcileAt(t *testing.T, at time.Time) time.Duration {
	t.Helper()
	h.r.now = func() time.Time { return at }
	err := h.reconcile("default/hello-00001")
	ok, d := controller.IsRequeueKey(err)
	if err != nil && !ok {
		t.Fatal(err)
	}
	return d
}

// resizes are the fiberd resources of every pods/resize written.
func (h *harness) resizes() []corev1.ResourceRequirements {
	var out []corev1.ResourceRequirements
	for _, a := range h.kube.Actions() {
		if a.GetVerb() == "update" && a.GetResource().Resource == "pods" && a.GetSubresource() == "resize" {
			out = append(out, resources.FiberdOf(a.(clientgotesting.UpdateAction).GetObject().(*corev1.Pod)).Resources)
		}
	}
	return out
}

// podChanges are the Home Pod creates, deletes and updates other than
// resizes and the reservation annotation.
func (h *harness) podChanges(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, a := range h.kube.Actions() {
		if a.GetResource().Resource != "pods" || a.GetNamespace() != homesNS || a.GetSubresource() == "resize" {
			continue
		}
		switch a.GetVerb() {
		case "create", "delete":
			out = append(out, fmt.Sprintf("%s %v", a.GetVerb(), a))
		case "update":
			out = append(out, "update: "+a.(clientgotesting.UpdateAction).GetObject().(*corev1.Pod).Name)
		case "patch":
			if reservationMark(a) == "" {
				out = append(out, fmt.Sprintf("patch without the reservation annotation: %s", a.(clientgotesting.PatchAction).GetPatch()))
			}
		}
	}
	return out
}

// annotated is the last reservation annotation written on the Home Pod
// (a merge patch of the annotation alone: an update lost to the kubelet's
// status write on a real cluster).
func (h *harness) annotated() string {
	last := ""
	for _, a := range h.kube.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "pods" && a.GetSubresource() == "" {
			if v := reservationMark(a); v != "" {
				last = v
			}
		}
	}
	return last
}

// reservationMark is the reservation annotation a pod patch sets ("" if
// none).
func reservationMark(a clientgotesting.Action) string {
	var p struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if json.Unmarshal(a.(clientgotesting.PatchAction).GetPatch(), &p) != nil {
		return ""
	}
	return p.Metadata.Annotations[resources.ReservationAnnotation]
}

func (h *harness) events() []string {
	var out []string
	for {
		select {
		case e := <-h.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// expectMarked checks that the Home was marked mark, changed in no other
// way, and (reason != "") that the grant got an Event of reason.
func (h *harness) expectMarked(t *testing.T, mark, reason string) {
	t.Helper()
	if a := h.annotated(); a != mark {
		t.Errorf("reservation annotation %q, want %q", a, mark)
	}
	if ch := h.podChanges(t); len(ch) > 0 {
		t.Errorf("the Home Pod was changed otherwise: %v", ch)
	}
	if reason == "" {
		return
	}
	if ev := h.events(); !hasEvent(ev, reason) {
		t.Errorf("events %v, want %s", ev, reason)
	}
}

func hasEvent(events []string, reason string) bool {
	for _, e := range events {
		if strings.Contains(e, " "+reason+" ") {
			return true
		}
	}
	return false
}

// TestIdleHomeGivesBackItsReservation: a Ready Home whose fiberd has been
// idle for home-idle-after has its fiberd requests resized in place to
// home-idle-memory / home-idle-cpu, its limits untouched, the Pod marked
// and an Event on the grant; it is not replaced for it, and it is asked
// again after homeIdleProbeInterval, not sooner.
func TestIdleHomeGivesBackItsReservation(t *testing.T) {
	g := grant("hello-00001", admitted)
	cfg := testConfig()
	full := resources.HomeResources(g, cfg)
	d := &fakeDiagnoser{idle: idleAnswer{seconds: 61, present: true, ok: true}}
	h := idleHarness(t, g, servingHome(g), d, nil)
	if got := h.reconcileAt(t, now); got != homeIdleProbeInterval {
		t.Errorf("requeue after %s, want %s", got, homeIdleProbeInterval)
	}
	rs := h.resizes()
	if len(rs) != 1 {
		t.Fatalf("resizes %v, want one", rs)
	}
	wantReq := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("1m")}
	if !resources.SameRequests(rs[0].Requests, wantReq) {
		t.Errorf("requests %v, want %v", rs[0].Requests, wantReq)
	}
	if !resources.SameRequests(rs[0].Limits, full.Limits) {
		t.Errorf("limits %v, want them untouched: %v", rs[0].Limits, full.Limits)
	}
	h.expectMarked(t, resources.ReservationIdle, reasonReservationReleased)
	// Looked at again 5 s later (a Pod event): fiberd is not asked.
	if got := h.reconcileAt(t, now.Add(5*time.Second)); got != 10*time.Second {
		t.Errorf("requeue after %s, want the 10 s left of the probe period", got)
	}
	if d.idleCalls != 1 || len(h.resizes()) != 1 {
		t.Errorf("asked %d times, resized %d times within the probe period, want 1 and 1", d.idleCalls, len(h.resizes()))
	}
	// After the period it is asked again.
	h.reconcileAt(t, now.Add(homeIdleProbeInterval))
	if d.idleCalls != 2 {
		t.Errorf("asked %d times after the probe period, want 2", d.idleCalls)
	}
}

// TestBusyHomeTakesBackItsReservation: a Home that gave back its
// reservation takes it back (HomeResources' requests, limits as they were)
// once fiberd is idle for less than home-idle-after; while it stays idle
// nothing is written.
func TestBusyHomeTakesBackItsReservation(t *testing.T) {
	g := grant("hello-00001", admitted)
	full := resources.HomeResources(g, testConfig())
	for _, tc := range []struct {
		name    string
		seconds int64
		resized bool
	}{
		{"busy", 0, true},
		{"idle for less than home-idle-after", 30, true},
		{"still idle", 3600, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDiagnoser{idle: idleAnswer{seconds: tc.seconds, present: true, ok: true}}
			h := idleHarness(t, g, servingHome(g, givenBack), d, nil)
			h.reconcileAt(t, now)
			rs := h.resizes()
			if !tc.resized {
				if len(rs) > 0 {
					t.Errorf("resized %v, want nothing", rs)
				}
				if ch := h.podChanges(t); len(ch) > 0 || h.annotated() != "" {
					t.Errorf("an idle Home whose reservation is given back was changed: %v", ch)
				}
				return
			}
			if len(rs) != 1 || !resources.SameRequests(rs[0].Requests, full.Requests) || !resources.SameRequests(rs[0].Limits, full.Limits) {
				t.Fatalf("resizes %v, want one to %v", rs, full)
			}
			h.expectMarked(t, resources.ReservationFull, reasonReservationRestored)
		})
	}
}

// TestReservationKeptWhen: no give-back with home-idle-after 0 (and a Home
// that gave it back takes it back, fiberd unasked), from a fiberd that
// does not send Fiberd-Idle-Seconds (asked again only much later), from a
// Home in its first 30 s (not asked), or from a fiberd that does not
// answer.
func TestReservationKeptWhen(t *testing.T) {
	g := grant("hello-00001", admitted)
	full := resources.HomeResources(g, testConfig())
	idle := idleAnswer{seconds: 3600, present: true, ok: true}
	off := func(c *lampyrconfig.Config) { c.HomeIdleAfter = 0 }
	young := func(p *corev1.Pod) {
		p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.NewTime(now.Add(-10 * time.Second))
	}
	justReady := func(p *corev1.Pod) {
		p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(now.Add(-20 * time.Second))
	}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		answer    idleAnswer
		cfg       func(*lampyrconfig.Config)
		wantCalls int
		// restored: the Home takes back its full reservation.
		restored bool
		// then: a reconcile this much later asks fiberd again or not.
		then      time.Duration
		thenCalls int
	}{
		{name: "off", pod: servingHome(g), answer: idle, cfg: off},
		{name: "off, given back earlier", pod: servingHome(g, givenBack), answer: idle, cfg: off, restored: true},
		{name: "no header", pod: servingHome(g), answer: idleAnswer{ok: true}, wantCalls: 1, then: time.Minute, thenCalls: 1},
		{name: "no header, given back earlier", pod: servingHome(g, givenBack), answer: idleAnswer{ok: true}, wantCalls: 1, restored: true},
		{name: "fiberd started 10 s ago", pod: servingHome(g, young), answer: idle},
		{name: "a claimed spare Ready 20 s ago", pod: servingHome(g, justReady), answer: idle},
		{name: "fiberd does not answer", pod: servingHome(g), answer: idleAnswer{}, wantCalls: 1, then: homeIdleProbeInterval, thenCalls: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDiagnoser{idle: tc.answer}
			h := idleHarness(t, g, tc.pod, d, tc.cfg)
			h.reconcileAt(t, now)
			if d.idleCalls != tc.wantCalls {
				t.Errorf("fiberd asked %d times, want %d", d.idleCalls, tc.wantCalls)
			}
			rs := h.resizes()
			switch {
			case tc.restored && (len(rs) != 1 || !resources.SameRequests(rs[0].Requests, full.Requests) || !resources.SameRequests(rs[0].Limits, full.Limits)):
				t.Errorf("resizes %v, want one back to %v", rs, full)
			case !tc.restored && len(rs) > 0:
				t.Errorf("resized %v, want nothing", rs)
			}
			if ch := h.podChanges(t); len(ch) > 0 {
				t.Errorf("the Home Pod was changed otherwise: %v", ch)
			}
			if tc.then > 0 {
				h.reconcileAt(t, now.Add(tc.then))
				if d.idleCalls != tc.thenCalls {
					t.Errorf("%s later: fiberd asked %d times in all, want %d", tc.then, d.idleCalls, tc.thenCalls)
				}
			}
		})
	}
}

// TestYoungHomeIsLookedAtAfter30s: a Home whose fiberd started 10 s ago is
// looked at again once it is 30 s old.
func TestYoungHomeIsLookedAtAfter30s(t *testing.T) {
	g := grant("hello-00001", admitted)
	d := &fakeDiagnoser{idle: idleAnswer{seconds: 3600, present: true, ok: true}}
	h := idleHarness(t, g, servingHome(g, func(p *corev1.Pod) {
		p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.NewTime(now.Add(-10 * time.Second))
	}), d, nil)
	if got := h.reconcileAt(t, now); got != 20*time.Second {
		t.Errorf("requeue after %s, want 20s (when the Home is 30 s old)", got)
	}
}

// TestRefusedResizeLeavesTheHome: a cluster that refuses the resize (no
// pods/resize: an older cluster) leaves the Home serving as it is: not
// deleted or replaced, a Warning Event on the grant, and no second try for
// homeResizeRetry (nor is fiberd asked meanwhile). A resize the kubelet
// found Infeasible is not repeated either.
func TestRefusedResizeLeavesTheHome(t *testing.T) {
	g := grant("hello-00001", admitted)
	refuse := func(a clientgotesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "update" && a.GetSubresource() == "resize" {
			return true, nil, errors.New("the server could not find the requested resource")
		}
		return false, nil, nil
	}
	d := &fakeDiagnoser{idle: idleAnswer{seconds: 3600, present: true, ok: true}}
	h := idleHarness(t, g, servingHome(g), d, nil, refuse)
	h.reconcileAt(t, now)
	if len(h.resizes()) != 1 {
		t.Fatalf("resizes %v, want one tried", h.resizes())
	}
	if ch := h.podChanges(t); len(ch) > 0 {
		t.Errorf("a refused resize changed the Home Pod: %v", ch)
	}
	if ev := h.events(); !hasEvent(ev, reasonResizeRefused) {
		t.Errorf("events %v, want %s", ev, reasonResizeRefused)
	}
	for _, later := range []time.Duration{homeIdleProbeInterval, time.Minute, homeResizeRetry - time.Second} {
		h.reconcileAt(t, now.Add(later))
	}
	if len(h.resizes()) != 1 || d.idleCalls != 1 {
		t.Errorf("within %s: %d resizes, fiberd asked %d times, want 1 and 1", homeResizeRetry, len(h.resizes()), d.idleCalls)
	}
	h.reconcileAt(t, now.Add(homeResizeRetry))
	if len(h.resizes()) != 2 {
		t.Errorf("after %s: %d resizes, want a second try", homeResizeRetry, len(h.resizes()))
	}

	infeasible := func(p *corev1.Pod) {
		givenBack(p)
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: corev1.PodReasonInfeasible})
	}
	d = &fakeDiagnoser{idle: idleAnswer{seconds: 3600, present: true, ok: true}}
	h = idleHarness(t, g, servingHome(g, infeasible), d, nil)
	h.reconcileAt(t, now)
	h.reconcileAt(t, now.Add(time.Minute))
	if len(h.resizes()) != 0 || d.idleCalls != 0 {
		t.Errorf("an Infeasible resize: %d resizes, fiberd asked %d times, want none", len(h.resizes()), d.idleCalls)
	}
	if ev := h.events(); len(ev) != 1 || !hasEvent(ev, reasonResizeRefused) {
		t.Errorf("events %v, want one %s", ev, reasonResizeRefused)
	}
}

// TestHTTPHomeDiagnoserIdle reads Fiberd-Idle-Seconds from fiberd's /readyz
// answer: absent or not a count is "not said".
func TestHTTPHomeDiagnoserIdle(t *testing.T) {
	header := ""
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if header != "" {
			w.Header().Set(idleSecondsHeader, header)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ready":true}`))
	}))
	target := startFiberdTLS(t, srv)
	d := HTTPHomeDiagnoser{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, target)
	}}
	pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.244.0.7"}}
	for _, tc := range []struct {
		header           string
		seconds          int64
		present, learned bool
	}{
		{"42", 42, true, true},
		{"0", 0, true, true},
		{"", 0, false, true},
		{"soon", 0, false, true},
		{"-3", 0, false, true},
	} {
		header = tc.header
		s, present, ok := d.Idle(context.Background(), pod, testHomeKey.SHA256)
		if s != tc.seconds || present != tc.present || ok != tc.learned {
			t.Errorf("header %q: Idle = %d %v %v, want %d %v %v", tc.header, s, present, ok, tc.seconds, tc.present, tc.learned)
		}
	}
	if _, _, ok := d.Idle(context.Background(), pod, otherHomeKey.SHA256); ok {
		t.Error("a peer without the Home's key was believed")
	}
}

// A Home resized to the idle requests whose mark did not land (on a real
// cluster the kubelet's status write after the resize made the marking
// Update conflict: 9 of 20 Homes) is marked at its next reconcile, without
// another resize.
func TestUnmarkedIdleHomeIsMarked(t *testing.T) {
	g := grant("hello-00001", admitted)
	unmarked := func(p *corev1.Pod) {
		givenBack(p)
		p.Annotations = nil
	}
	d := &fakeDiagnoser{idle: idleAnswer{seconds: 3600, present: true, ok: true}}
	h := idleHarness(t, g, servingHome(g, unmarked), d, nil)
	h.reconcileAt(t, now)
	if rs := h.resizes(); len(rs) > 0 {
		t.Errorf("resized %v, want only the mark", rs)
	}
	h.expectMarked(t, resources.ReservationIdle, "")
}
