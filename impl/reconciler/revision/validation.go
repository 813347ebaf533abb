package revision

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"knative.dev/serving/pkg/apis/autoscaling"
	apisconfig "knative.dev/serving/pkg/apis/config"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/reconciler/revision/config"
	"lampyr.dev/serving/impl/reconciler/revision/resources"
)

// Bounds of the CapacityGrant CRD (impl/config/crds/capacitygrant.yaml):
// refusing beyond them here names the Revision field instead of failing the
// grant's creation.
const (
	maxFibersLimit = 10000
	maxSeconds     = 86400
)

// Unsupported is one reason a Revision template is outside Lampyr's subset.
type Unsupported struct {
	// Reason is CamelCase and names the field (UnsupportedCommand); it
	// becomes the Revision's Ready reason.
	Reason string
	// Field is the path of the offending field in the Revision.
	Field string
	// Detail says what Lampyr supports instead.
	Detail string
}

func (u Unsupported) String() string { return u.Field + ": " + u.Detail }

// Rejection lists every way a template is outside the subset, in a stable
// order; the first one's Reason is reported as the condition reason.
type Rejection []Unsupported

// Reason is the condition reason: the first offending field's.
func (r Rejection) Reason() string { return r[0].Reason }

// Message lists every offending field, so one round trip fixes them all.
func (r Rejection) Message() string {
	parts := make([]string, len(r))
	for i, u := range r {
		parts[i] = u.String()
	}
	return "Lampyr does not support this Revision template: " + strings.Join(parts, "; ")
}

// ValidateTemplate accepts the supported single-container template subset
// (docs/contracts.md, "Supported Revision template") and returns what Lampyr
// acts on, or every reason it cannot run the Revision. rev must already be
// defaulted (the generated reconciler does so with the installation's
// config-defaults before ReconcileKind); serving is that same config, used
// to accept exactly the fields the Knative webhook fills in on its own.
func ValidateTemplate(rev *v1.Revision, serving *apisconfig.Config) (*resources.Template, Rejection) {
	return validate(rev, serving, nil)
}

// Validate is ValidateTemplate with the installation's config-lampyr: a
// Revision without Lampyr's annotations whose image digest is mapped in
// image-snapshots runs from the mapped snapshot artifact, and its template
// is left for the controller to seal (Template.SealByController).
func Validate(rev *v1.Revision, cfg *config.Config) (*resources.Template, Rejection) {
	var images map[string]string
	if cfg.Lampyr != nil {
		images = cfg.Lampyr.ImageSnapshots
	}
	return validate(rev, cfg.Serving, images)
}

func validate(rev *v1.Revision, serving *apisconfig.Config, images map[string]string) (*resources.Template, Rejection) {
	v := &validator{serving: serving, images: images}
	t := &resources.Template{}
	v.podSpec(&rev.Spec.PodSpec, t)
	v.revisionSpec(&rev.Spec, t)
	v.annotations(rev.Annotations, t)
	if len(v.rej) > 0 {
		return nil, v.rej
	}
	return t, nil
}

type validator struct {
	serving *apisconfig.Config
	// images is config-lampyr image-snapshots: repository@digest -> snapshot.
	images map[string]string
	rej    Rejection
}

func (v *validator) reject(reason, field, detail string) {
	v.rej = append(v.rej, Unsupported{Reason: reason, Field: field, Detail: detail})
}

// Why each commonly written but unsupported field is refused; fields not
// listed get a generic detail.
var unsupportedDetail = map[string]string{
	"command":            "Lampyr runs the snapshot artifact's entrypoint; command overrides are not supported",
	"args":               "Lampyr runs the snapshot artifact's entrypoint; argument overrides are not supported",
	"env":                "a fiber's environment is the Knative runtime contract (PORT, K_SERVICE, K_CONFIGURATION, K_REVISION) only",
	"envFrom":            "a fiber's environment is the Knative runtime contract (PORT, K_SERVICE, K_CONFIGURATION, K_REVISION) only",
	"workingDir":         "the working directory is fixed by the snapshot artifact",
	"volumeMounts":       "fibers have only a private writable /tmp; volumes are not supported",
	"volumes":            "fibers have only a private writable /tmp; volumes are not supported",
	"livenessProbe":      "fibers are started per request from a ready snapshot; only the default readiness probe is accepted",
	"startupProbe":       "fibers are started per request from a ready snapshot; only the default readiness probe is accepted",
	"securityContext":    "fibers run in Lampyr's fixed sandbox; security context settings are not supported",
	"serviceAccountName": "fibers get no Kubernetes identity; service accounts are not supported",
	"runtimeClassName":   "fibers run in fiberd's sandbox; runtime classes are not supported",
	"initContainers":     "exactly one container is supported; init containers are not",
	"lifecycle":          "fibers have no lifecycle hooks",
}

func detailFor(jsonName string) string {
	if d, ok := unsupportedDetail[jsonName]; ok {
		return d
	}
	return "not supported by Lampyr"
}

// podSpecHandled are PodSpec fields checked explicitly; every other set
// field is refused, so new Kubernetes fields are refused until reviewed.
var podSpecHandled = map[string]bool{"containers": true, "enableServiceLinks": true}

func (v *validator) podSpec(ps *corev1.PodSpec, t *resources.Template) {
	for _, f := range setFields(reflect.ValueOf(ps).Elem(), podSpecHandled) {
		v.reject(reasonFor(f), "spec."+f, detailFor(f))
	}
	// The webhook sets enableServiceLinks from config-defaults (false by
	// default); true would inject Service environment variables, which a
	// fiber cannot receive.
	if ps.EnableServiceLinks != nil && *ps.EnableServiceLinks {
		v.reject("UnsupportedEnableServiceLinks", "spec.enableServiceLinks", "Service environment variables are not injected into fibers")
	}
	if len(ps.Containers) != 1 {
		v.reject("UnsupportedContainers", "spec.containers",
			fmt.Sprintf("exactly one container is supported, got %d (sidecars are not supported)", len(ps.Containers)))
		return
	}
	v.container(&ps.Containers[0], "spec.containers[0]", t)
}

var containerHandled = map[string]bool{
	"name": true, "image": true, "ports": true, "resources": true,
	"readinessProbe": true, "securityContext": true,
	// The pull policy has no meaning for fibers (fiberd pulls the snapshot
	// artifact by digest) and is harmless, so it is accepted and ignored.
	"imagePullPolicy": true,
}

func (v *validator) container(c *corev1.Container, path string, t *resources.Template) {
	for _, f := range setFields(reflect.ValueOf(c).Elem(), containerHandled) {
		v.reject(reasonFor(f), path+"."+f, detailFor(f))
	}
	t.ContainerName = c.Name

	if _, err := name.NewDigest(c.Image); err != nil {
		v.reject("UnsupportedImage", path+".image",
			fmt.Sprintf("the image must be pinned by digest (repository@sha256:...): %q: %v", c.Image, err))
	} else {
		t.Image = c.Image
	}

	v.securityContext(c, path)
	v.readinessProbe(c.ReadinessProbe, path+".readinessProbe")
	v.ports(c.Ports, path+".ports", t)
	v.resources(&c.Resources, path+".resources", t)
}

// securityContext accepts none, or exactly the one the webhook adds when
// config-features' secure-pod-defaults is on (computed by running upstream
// defaulting on a container without one), so that setting stays usable.
func (v *validator) securityContext(c *corev1.Container, path string) {
	if c.SecurityContext == nil || *c.SecurityContext == (corev1.SecurityContext{}) {
		return
	}
	if v.serving != nil && v.serving.Features != nil {
		probe := v1.RevisionSpec{PodSpec: corev1.PodSpec{Containers: []corev1.Container{{Ports: c.Ports}}}}
		probe.SetDefaults(apisconfig.ToContext(context.Background(), v.serving))
		if want := probe.Containers[0].SecurityContext; want != nil && equality.Semantic.DeepEqual(want, c.SecurityContext) {
			return
		}
	}
	v.reject("UnsupportedSecurityContext", path+".securityContext", detailFor("securityContext"))
}

// readinessProbe accepts no probe or exactly the probe the Knative webhook
// defaults onto a single container (revision_defaults.go,
// applyUserContainerDefaultReadinessProbe + applyReadinessProbeDefaults):
// `tcpSocket: {}` with successThreshold 0 or 1 and nothing else. fiberd
// checks readiness of the sealed template itself and fibers start from a
// ready snapshot, so any other probe would be silently ignored: refuse it.
func (v *validator) readinessProbe(p *corev1.Probe, path string) {
	if p == nil || isDefaultReadinessProbe(p) {
		return
	}
	v.reject("UnsupportedReadinessProbe", path,
		"only the default readiness probe (tcpSocket: {}) is supported; fiberd checks the sealed template's readiness itself")
}

func isDefaultReadinessProbe(p *corev1.Probe) bool {
	if p.TCPSocket == nil || p.TCPSocket.Host != "" || !isEmpty(reflect.ValueOf(p.TCPSocket.Port)) {
		return false
	}
	if p.SuccessThreshold != 0 && p.SuccessThreshold != 1 {
		return false
	}
	rest := *p
	rest.TCPSocket = nil
	rest.SuccessThreshold = 0
	return isEmpty(reflect.ValueOf(rest))
}

func (v *validator) ports(ports []corev1.ContainerPort, path string, t *resources.Template) {
	t.Port = v1.DefaultUserPort
	t.Protocol = routermeta.ProtocolHTTP1
	switch len(ports) {
	case 0:
		return
	case 1:
	default:
		v.reject("UnsupportedPorts", path, "at most one container port is supported")
		return
	}
	p := ports[0]
	pp := path + "[0]"
	switch p.Name {
	case "", "http1":
	case "h2c":
		// gRPC: stock Knative selects HTTP/2 for a port named h2c; so do we.
		t.Protocol = routermeta.ProtocolH2C
	default:
		v.reject("UnsupportedPortName", pp+".name", fmt.Sprintf("port name %q: use h2c for HTTP/2 (gRPC), or http1 or no name for HTTP/1", p.Name))
	}
	if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
		v.reject("UnsupportedPortProtocol", pp+".protocol", fmt.Sprintf("protocol %q: only TCP", p.Protocol))
	}
	if p.HostPort != 0 || p.HostIP != "" {
		v.reject("UnsupportedHostPort", pp+".hostPort", "fibers have no host ports")
	}
	if p.ContainerPort < 0 || p.ContainerPort > math.MaxUint16 {
		v.reject("UnsupportedContainerPort", pp+".containerPort", fmt.Sprintf("port %d is out of range", p.ContainerPort))
	} else if p.ContainerPort != 0 {
		t.Port = p.ContainerPort
	}
}

func (v *validator) resources(r *corev1.ResourceRequirements, path string, t *resources.Template) {
	if len(r.Limits) > 0 {
		v.reject("UnsupportedResourceLimits", path+".limits",
			"resource limits are not supported; a fiber's memory limit is its memory request")
	}
	if len(r.Claims) > 0 {
		v.reject("UnsupportedResourceClaims", path+".claims", "dynamic resource claims are not supported")
	}
	names := make([]string, 0, len(r.Requests))
	for n := range r.Requests {
		names = append(names, string(n))
	}
	slices.Sort(names)
	for _, n := range names {
		q := r.Requests[corev1.ResourceName(n)]
		switch corev1.ResourceName(n) {
		case corev1.ResourceMemory:
			if q.Sign() <= 0 {
				v.reject("UnsupportedMemoryRequest", path+".requests.memory", "the memory request must be positive")
				continue
			}
			t.Memory = ptrTo(q.DeepCopy())
		case corev1.ResourceCPU:
			v.reject("UnsupportedCPURequest", path+".requests.cpu", "CPU requests are not supported; fibers share the Home's CPU")
		default:
			v.reject("UnsupportedResourceRequest", path+".requests."+n, fmt.Sprintf("only a memory request is supported, not %s", n))
		}
	}
}

func (v *validator) revisionSpec(rs *v1.RevisionSpec, t *resources.Template) {
	if cc := rs.GetContainerConcurrency(); cc != 1 {
		v.reject("UnsupportedContainerConcurrency", "spec.containerConcurrency",
			fmt.Sprintf("containerConcurrency must be 1 (one request per fiber), got %d", cc))
	}
	if rs.TimeoutSeconds == nil || *rs.TimeoutSeconds <= 0 || *rs.TimeoutSeconds > maxSeconds {
		v.reject("UnsupportedTimeoutSeconds", "spec.timeoutSeconds", fmt.Sprintf("timeoutSeconds must be between 1 and %d", maxSeconds))
	} else {
		t.TimeoutSeconds = *rs.TimeoutSeconds
	}
	// The two timeout variants are accepted only when absent, zero (no
	// timer) or exactly what the webhook defaults from config-defaults:
	// fiber-router bounds a fiber by timeoutSeconds alone.
	var defaults *apisconfig.Defaults
	if v.serving != nil {
		defaults = v.serving.Defaults
	}
	if defaults == nil {
		defaults, _ = apisconfig.NewDefaultsConfigFromMap(nil)
	}
	// Compare with timeoutSeconds as written, even if refused above, so one
	// bad value is reported once.
	var timeout int64
	if rs.TimeoutSeconds != nil {
		timeout = *rs.TimeoutSeconds
	}
	if !webhookTimeoutVariant(rs.ResponseStartTimeoutSeconds, defaults.RevisionResponseStartTimeoutSeconds, timeout) {
		v.reject("UnsupportedResponseStartTimeoutSeconds", "spec.responseStartTimeoutSeconds",
			"only timeoutSeconds bounds a request in Lampyr; remove responseStartTimeoutSeconds")
	}
	if !webhookTimeoutVariant(rs.IdleTimeoutSeconds, defaults.RevisionIdleTimeoutSeconds, timeout) {
		v.reject("UnsupportedIdleTimeoutSeconds", "spec.idleTimeoutSeconds",
			"only timeoutSeconds bounds a request in Lampyr; use lampyr.dev/idle-timeout for reuse mode instead")
	}
}

// webhookTimeoutVariant mirrors RevisionSpec.SetDefaults: the webhook sets a
// variant to its default only when that default is non-zero and below
// timeoutSeconds.
func webhookTimeoutVariant(got *int64, def, timeout int64) bool {
	if got == nil || *got == 0 {
		return true
	}
	return *got == def && def != 0 && def < timeout
}

var (
	minScaleKeys = sliceSet(autoscaling.MinScaleAnnotation)
	maxScaleKeys = sliceSet(autoscaling.MaxScaleAnnotation)
)

func (v *validator) annotations(anns map[string]string, t *resources.Template) {
	field := func(k string) string { return "metadata.annotations['" + k + "']" }

	_, hasSnapshot := anns[contract.SnapshotArtifactAnnotation]
	_, hasTemplate := anns[contract.FiberdTemplateAnnotation]
	if snap, ok := v.mappedSnapshot(t.Image); ok && !hasSnapshot && !hasTemplate {
		// An image built with its snapshot (config-lampyr image-snapshots):
		// the controller seals this Revision's template itself.
		t.SnapshotArtifact, t.SealByController = snap, true
	} else {
		t.SnapshotArtifact = v.pinnedAnnotation(anns, contract.SnapshotArtifactAnnotation, "SnapshotArtifact", field)
		t.FiberdTemplate = v.pinnedAnnotation(anns, contract.FiberdTemplateAnnotation, "FiberdTemplate", field)
	}

	keys := make([]string, 0, len(anns))
	for k := range anns {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var class, metric, minScale, maxScale string
	for _, k := range keys {
		if !strings.HasPrefix(k, autoscaling.GroupName+"/") {
			continue
		}
		val := anns[k]
		switch {
		case k == autoscaling.ClassAnnotationKey:
			class = val
		case k == autoscaling.MetricAnnotationKey:
			metric = val
		case minScaleKeys[k]:
			minScale = val
			if n, err := strconv.ParseInt(val, 10, 32); err != nil || n != 0 {
				v.reject("UnsupportedMinScale", field(k), fmt.Sprintf("min-scale must be 0 until reserved fiber capacity exists, got %q", val))
			}
		case maxScaleKeys[k]:
			maxScale = val
			n, err := strconv.ParseInt(val, 10, 32)
			if err != nil || n < 0 || n > maxFibersLimit {
				v.reject("UnsupportedMaxScale", field(k), fmt.Sprintf("max-scale must be an integer from 0 to %d, got %q", maxFibersLimit, val))
			} else {
				t.MaxFibers = int32(n)
			}
		default:
			v.reject("UnsupportedAutoscalingAnnotation", field(k),
				"fibers are admitted one request each up to max-scale; other autoscaler tuning does not apply")
		}
	}
	as := (*autoscalerDefaults)(nil)
	if v.serving != nil && v.serving.Autoscaler != nil {
		as = &autoscalerDefaults{class: v.serving.Autoscaler.PodAutoscalerClass, minScale: v.serving.Autoscaler.MinScale, maxScale: v.serving.Autoscaler.MaxScale}
	}
	// Annotations win over config-autoscaler, as in stock Knative.
	if class == "" && as != nil {
		class = as.class
	}
	if class != "" && class != autoscaling.KPA {
		v.reject("UnsupportedAutoscalingClass", field(autoscaling.ClassAnnotationKey),
			fmt.Sprintf("only the default class %s is supported, got %q", autoscaling.KPA, class))
	}
	if metric != "" && metric != autoscaling.Concurrency {
		v.reject("UnsupportedAutoscalingMetric", field(autoscaling.MetricAnnotationKey),
			fmt.Sprintf("only the default metric %s is supported, got %q", autoscaling.Concurrency, metric))
	}
	if minScale == "" && as != nil && as.minScale != 0 {
		v.reject("UnsupportedMinScale", "config-autoscaler min-scale", fmt.Sprintf("min-scale must be 0, the installation defaults it to %d", as.minScale))
	}
	if maxScale == "" && as != nil && as.maxScale > 0 {
		t.MaxFibers = min(as.maxScale, maxFibersLimit)
	}

	v.execution(anns, t, field)
}

// autoscalerDefaults are config-autoscaler's installation-wide values.
type autoscalerDefaults struct {
	class              string
	minScale, maxScale int32
}

// mappedSnapshot looks the image (repository and digest) up in
// image-snapshots.
func (v *validator) mappedSnapshot(image string) (string, bool) {
	if image == "" || len(v.images) == 0 {
		return "", false
	}
	k, ok := lampyrconfig.ImageKey(image)
	if !ok {
		return "", false
	}
	snap, ok := v.images[k]
	return snap, ok
}

// pinnedAnnotation requires a digest-pinned reference under key.
func (v *validator) pinnedAnnotation(anns map[string]string, key, what string, field func(string) string) string {
	ref, ok := anns[key]
	if !ok || ref == "" {
		v.reject("Missing"+what, field(key), "required: the digest-pinned reference Lampyr runs this Revision from (`ly deploy` writes it), unless the image (repository@digest) is mapped to a snapshot artifact in config-lampyr image-snapshots")
		return ""
	}
	if _, err := name.NewDigest(ref); err != nil {
		v.reject("Unsupported"+what, field(key), fmt.Sprintf("must be pinned by digest (repository@sha256:...): %q: %v", ref, err))
		return ""
	}
	return ref
}

// execution reads the lampyr.yaml execution policy: fresh (default) or
// reuse with an idle timeout and idle action release. park/resume are not
// implemented and are refused rather than silently treated as release.
func (v *validator) execution(anns map[string]string, t *resources.Template, field func(string) string) {
	mode, hasMode := anns[contract.ExecutionModeAnnotation]
	idle, hasIdle := anns[contract.IdleTimeoutAnnotation]
	action, hasAction := anns[contract.IdleActionAnnotation]

	switch fiberdv1alpha1.ExecutionMode(mode) {
	case fiberdv1alpha1.ExecutionFresh:
	case fiberdv1alpha1.ExecutionReuse:
	default:
		if hasMode {
			v.reject("UnsupportedExecutionMode", field(contract.ExecutionModeAnnotation), fmt.Sprintf("%q: use fresh or reuse", mode))
			return
		}
		mode = string(fiberdv1alpha1.ExecutionFresh)
	}
	t.Execution.Mode = fiberdv1alpha1.ExecutionMode(mode)
	if t.Execution.Mode == fiberdv1alpha1.ExecutionFresh {
		if hasIdle {
			v.reject("UnsupportedIdleTimeout", field(contract.IdleTimeoutAnnotation), "applies to execution-mode reuse only; fresh fibers are released when the request ends")
		}
		if hasAction {
			v.reject("UnsupportedIdleAction", field(contract.IdleActionAnnotation), "applies to execution-mode reuse only")
		}
		return
	}

	if !hasIdle {
		v.reject("MissingIdleTimeout", field(contract.IdleTimeoutAnnotation), "execution-mode reuse needs an idle timeout such as 30s")
	} else if d, err := time.ParseDuration(idle); err != nil || d <= 0 || d > maxSeconds*time.Second {
		v.reject("UnsupportedIdleTimeout", field(contract.IdleTimeoutAnnotation), fmt.Sprintf("%q: want a duration such as 30s, at most 24h", idle))
	} else {
		// Whole seconds, rounded up so a fiber is never released early.
		t.Execution.IdleTimeoutSeconds = int64(math.Ceil(d.Seconds()))
	}
	switch {
	case !hasAction || action == fiberdv1alpha1.IdleActionRelease:
		t.Execution.IdleAction = fiberdv1alpha1.IdleActionRelease
	default:
		v.reject("UnsupportedIdleAction", field(contract.IdleActionAnnotation), fmt.Sprintf("%q: only release is supported (park/resume are not)", action))
	}
}

// setFields returns the JSON names of s's fields that are set and not in
// handled, in declaration order.
func setFields(s reflect.Value, handled map[string]bool) []string {
	var out []string
	st := s.Type()
	for i := range st.NumField() {
		sf := st.Field(i)
		jsonName := strings.Split(sf.Tag.Get("json"), ",")[0]
		if jsonName == "" || jsonName == "-" || handled[jsonName] {
			continue
		}
		if !isEmpty(s.Field(i)) {
			out = append(out, jsonName)
		}
	}
	return out
}

// isEmpty treats nil, empty slices and maps, and structs whose fields are
// all empty as unset. Any non-nil pointer is set, even to a zero value:
// runAsUser: 0 and tcpSocket: {} are both things a user wrote.
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		return v.IsNil()
	case reflect.Slice, reflect.Map:
		return v.Len() == 0
	case reflect.Struct:
		// resource.Quantity and similar have unexported state; compare to
		// their zero value instead of walking them.
		if v.Type() == reflect.TypeOf(resource.Quantity{}) {
			q := v.Interface().(resource.Quantity)
			return q.IsZero()
		}
		for i := range v.NumField() {
			if !v.Type().Field(i).IsExported() {
				if !v.Field(i).IsZero() {
					return false
				}
				continue
			}
			if !isEmpty(v.Field(i)) {
				return false
			}
		}
		return true
	default:
		return v.IsZero()
	}
}

// reasonFor turns a JSON field name into the condition reason naming it.
func reasonFor(jsonName string) string {
	return "Unsupported" + strings.ToUpper(jsonName[:1]) + jsonName[1:]
}

func sliceSet(keys []string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

func ptrTo[T any](v T) *T { return &v }
