package grant

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/homekey"
)

// HomeDiagnoser asks a running, not-ready Home's fiberd why it is not ready
// (its /readyz answer), so the grant, and through it the Revision, can say
// so instead of a generic "not ready yet".
type HomeDiagnoser interface {
	// Diagnose returns fiberd's answer: ready, or why not (reason,
	// message and, for a handler that fails its starts, the details); ok
	// is false when fiberd could not be asked. homeKeySHA256 is the
	// Home's TLS key (status.homeKeySHA256): only a peer holding it is
	// asked.
	Diagnose(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string) (answer client.Error, ready, ok bool)
	// Readiness asks a ready Home how its fibers start (fiberd's /readyz
	// in JSON); ok is false when fiberd could not be asked or is not
	// ready.
	Readiness(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string) (answer client.Readiness, ok bool)
	// Idle asks a ready Home how long its pool has had no fiber leased
	// and no acquire in flight (fiberd's /readyz header
	// Fiberd-Idle-Seconds; 0 while busy). present is false when fiberd
	// does not say (a fiberd that predates the header: its Home never
	// gives back its reservation); ok is false when fiberd could not be
	// asked or is not ready.
	Idle(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string) (seconds int64, present, ok bool)
}

// idleSecondsHeader is fiberd's /readyz header saying how long its pool
// has been idle, in whole seconds.
const idleSecondsHeader = client.IdleSecondsHeader

// HTTPHomeDiagnoser GETs /readyz on the Home Pod's IP, over TLS, from a
// peer holding the Home's key only: what it answers lands in the
// Revision's status, so whoever holds the Pod's address otherwise (a
// Service's externalIPs) must not write it.
type HTTPHomeDiagnoser struct {
	// DialContext opens the TCP connection (nil: a net.Dialer); tests
	// lead it elsewhere.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Diagnose implements HomeDiagnoser.
func (h HTTPHomeDiagnoser) Diagnose(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string) (client.Error, bool, bool) {
	status, b, _, ok := h.readyz(ctx, pod, homeKeySHA256)
	if !ok {
		return client.Error{}, false, false
	}
	if status == http.StatusOK {
		return client.Error{}, true, true
	}
	var e client.Error
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		return client.Error{}, false, false
	}
	return e, false, true
}

// Readiness implements HomeDiagnoser.
func (h HTTPHomeDiagnoser) Readiness(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string) (client.Readiness, bool) {
	status, b, _, ok := h.readyz(ctx, pod, homeKeySHA256)
	if !ok || status != http.StatusOK {
		return client.Readiness{}, false
	}
	var r client.Readiness
	if json.Unmarshal(b, &r) != nil {
		// A fiberd that predates the JSON answer ("ok"): nothing to say.
		return client.Readiness{Ready: true}, true
	}
	return r, true
}

// Idle implements HomeDiagnoser.
func (h HTTPHomeDiagnoser) Idle(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string) (int64, bool, bool) {
	status, _, header, ok := h.readyz(ctx, pod, homeKeySHA256)
	if !ok || status != http.StatusOK {
		return 0, false, false
	}
	d, present, err := client.ParseIdleSeconds(header)
	if !present || err != nil {
		// Absent, or not what fiberd says: as if it said nothing.
		return 0, false, true
	}
	return int64(d / time.Second), true, true
}

// readyz GETs /readyz (asking for JSON) from the Home at pod's IP, over
// TLS, from a peer holding homeKeySHA256 only.
func (h HTTPHomeDiagnoser) readyz(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string) (status int, body []byte, header http.Header, ok bool) {
	if pod.Status.PodIP == "" || homeKeySHA256 == "" {
		// No key named yet (a grant not issued by this version): the
		// Home cannot be told from an impostor, so it is not asked.
		return 0, nil, nil, false
	}
	tlsConfig, err := homekey.ClientConfig(homeKeySHA256, "http/1.1")
	if err != nil {
		return 0, nil, nil, false
	}
	dial := h.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: time.Second}).DialContext
	}
	// One connection per question: each Home has its own key, and a Home
	// is asked only every few seconds while it is not ready, and every
	// 15 s when it is (whether it is idle: idle.go).
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		Proxy: nil, DialContext: dial, TLSClientConfig: tlsConfig, DisableKeepAlives: true,
	}}
	u := "https://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(resources.APIPort)) + client.ReadyzPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, nil, false
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, nil, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	return resp.StatusCode, b, resp.Header, true
}

// homeDiagnosisInterval is how often a running, not-ready Home is asked.
const homeDiagnosisInterval = 3 * time.Second

// homeStartingInterval is how often a Home Pod whose fiberd started in
// the last homeStartingFor is asked whether it is ready: fiberd's own
// answer makes the Home ready, not the kubelet's next readiness probe
// (every 10 s: resources.makeHomePod).
const (
	homeStartingInterval = 200 * time.Millisecond
	homeStartingFor      = 30 * time.Second
)

// diagnoseHome refines HomeReady for a Home Pod that runs but is not
// ready. fiberd answering ready makes HomeReady True at once (fiberdReady:
// the kubelet's probe has not seen it yet); a load failure fiberd reports
// makes HomeReady False with fiberd's reason; anything else is kept
// Unknown with fiberd's message. It returns when to look again.
func (r *Reconciler) diagnoseHome(ctx context.Context, g *v1alpha1.CapacityGrant, pod *corev1.Pod) (again time.Duration, fiberdReady bool) {
	if r.diagnoser == nil || pod == nil || pod.Status.Phase != corev1.PodRunning {
		return 0, false
	}
	if podReady(pod) {
		return r.observePreinit(ctx, g, pod), false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	interval := homeDiagnosisInterval
	if started := fiberdStarted(pod); !started.IsZero() && r.now().Sub(started) < homeStartingFor {
		interval = homeStartingInterval
	}
	e, ready, ok := r.diagnoser.Diagnose(ctx, pod, g.Status.HomeKeySHA256)
	if !ok {
		return interval, false
	}
	if ready {
		g.Status.MarkHomeReady()
		return r.observePreinit(ctx, g, pod), true
	}
	reason, msg := e.Reason, e.Message
	if f := handlerFailure(e); f != nil {
		// The handler's own failure, in its own words: no Pod name or
		// address of the Home, since it is shown to the Revision's owner.
		g.Status.MarkHandlerFailed(*f, boundMessage(msg))
		return homeDiagnosisInterval, false
	}
	// fiberd's reasons for not loading a Revision (its load error, the
	// reason of /readyz's 503) do not heal by waiting: the grant or its
	// snapshot must change. Template reasons other than a port that differs
	// from the snapshot's come from the grant controller itself
	// (template.go), which opens templates.
	if contract.LoadFailure(reason) {
		g.Status.MarkHomeFailed(reason, "fiberd in Home Pod %s/%s cannot run this Revision: %s", pod.Namespace, pod.Name, msg)
		return homeDiagnosisInterval, false
	}
	g.Status.MarkHomeNotReady(contract.ReasonHomeNotReady, "Home Pod %s/%s is running; fiberd is not ready: %s", pod.Namespace, pod.Name, msg)
	return interval, false
}

// preinitPendingInterval is how often a ready Home whose checkpoint is not
// made yet (no fiber started: a Home without warm fibers) is asked again.
const preinitPendingInterval = 30 * time.Second

// observePreinit asks a ready Home Pod, once, how the Revision's fibers
// start, and records it in FibersPreinitialized (docs/contracts.md §1):
// True when they are restored from a checkpoint of the initialized handler,
// False with fiberd's reason when they start cold. A backend that does not
// pre-initialize fibers says nothing and the condition is cleared. It
// returns when to ask again (0: not before the Pod changes). A Home on any
// other backend is never asked.
func (r *Reconciler) observePreinit(ctx context.Context, g *v1alpha1.CapacityGrant, pod *corev1.Pod) time.Duration {
	uid := string(pod.UID)
	if g.Status.PreinitObservedPod == uid {
		return 0
	}
	if !resources.PreinitializesFibers(pod) {
		if g.Status.GetCondition(v1alpha1.GrantConditionFibersPreinitialized) != nil {
			g.Status.ClearFibersPreinitialized(uid)
		}
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	a, ok := r.diagnoser.Readiness(ctx, pod, g.Status.HomeKeySHA256)
	switch {
	case !ok:
		return homeDiagnosisInterval
	case a.Preinit == nil:
		g.Status.ClearFibersPreinitialized(uid)
	case a.Preinit.Restored:
		g.Status.MarkFibersPreinitialized(uid)
	case a.Preinit.Pending:
		g.Status.MarkFibersPreinitPending("No fiber has started yet; the first makes the checkpoint of the initialized handler.")
		return preinitPendingInterval
	default:
		g.Status.MarkFibersStartCold(uid, "The Revision's fibers start cold: no checkpoint of the initialized handler could be made: %s", boundMessage(a.Preinit.Message))
	}
	return 0
}

// fiberdStarted is when the Home Pod's fiberd container last started.
func fiberdStarted(p *corev1.Pod) time.Time {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == resources.FiberdContainer && cs.State.Running != nil {
			return cs.State.Running.StartedAt.Time
		}
	}
	return time.Time{}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// handlerFailure is fiberd's typed report of a failing handler, bounded and
// cleaned again (the output is the tenant's: fiberd bounds it, and the
// grant controller does not take a larger one from any Home).
func handlerFailure(e client.Error) *v1alpha1.HandlerFailure {
	// A Revision whose handler fails every fiber start: the handler must
	// change, so it is HomeReady False, and the Revision's ContainerHealthy
	// follows.
	if e.Handler == nil || !contract.HandlerFailure(e.Reason) {
		return nil
	}
	f := &v1alpha1.HandlerFailure{
		Reason:   e.Reason,
		ExitCode: e.Handler.ExitCode,
		Output:   backend.LastOutput([]byte(e.Handler.Output)),
	}
	if sig := e.Handler.Signal; len(sig) <= 16 && strings.TrimLeft(sig, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-") == "" {
		f.Signal = sig
	}
	return f
}

// maxHandlerMessage bounds fiberd's message about a failing handler.
const maxHandlerMessage = 512

func boundMessage(msg string) string {
	msg = backend.LastOutput([]byte(msg))
	msg = strings.ReplaceAll(msg, "\n", " ")
	if len(msg) > maxHandlerMessage {
		msg = strings.ToValidUTF8(msg[:maxHandlerMessage], "") + "..."
	}
	return msg
}
