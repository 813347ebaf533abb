package revision

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"knative.dev/pkg/ptr"
	apisconfig "knative.dev/serving/pkg/apis/config"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/reconciler/revision/config"
	"lampyr.dev/serving/impl/reconciler/revision/resources"
)

type rejectionCase struct {
	name                  string
	opts                  []revOption
	reason, field, detail string
}

const containerPath = "spec.containers[0]"

func annField(k string) string { return "metadata.annotations['" + k + "']" }

// rejectionCases: one per unsupported field, each a minimal change to the
// accepted rev(). Shared by the table test (status written) and
// TestValidateTemplateRejects (exactly one Unsupported).
func rejectionCases() []rejectionCase {
	c := func(f func(*corev1.Container)) []revOption { return []revOption{container(f)} }
	ps := func(f func(*corev1.PodSpec)) []revOption { return []revOption{podSpec(f)} }
	ann := func(k, v string) []revOption { return []revOption{annotation(k, v)} }
	return []rejectionCase{{
		name: "command", opts: c(func(c *corev1.Container) { c.Command = []string{"/server"} }),
		reason: "UnsupportedCommand", field: containerPath + ".command", detail: detailFor("command"),
	}, {
		name: "args", opts: c(func(c *corev1.Container) { c.Args = []string{"--port=8080"} }),
		reason: "UnsupportedArgs", field: containerPath + ".args", detail: detailFor("args"),
	}, {
		name: "env", opts: c(func(c *corev1.Container) { c.Env = []corev1.EnvVar{{Name: "GREETING", Value: "hi"}} }),
		reason: "UnsupportedEnv", field: containerPath + ".env", detail: detailFor("env"),
	}, {
		name: "envFrom", opts: c(func(c *corev1.Container) {
			c.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
		}),
		reason: "UnsupportedEnvFrom", field: containerPath + ".envFrom", detail: detailFor("envFrom"),
	}, {
		name: "workingDir", opts: c(func(c *corev1.Container) { c.WorkingDir = "/srv" }),
		reason: "UnsupportedWorkingDir", field: containerPath + ".workingDir", detail: detailFor("workingDir"),
	}, {
		name: "a sidecar", opts: ps(func(p *corev1.PodSpec) {
			p.Containers = append(p.Containers, corev1.Container{Name: "sidecar", Image: testImage})
		}),
		reason: "UnsupportedContainers", field: "spec.containers", detail: "exactly one container is supported, got 2 (sidecars are not supported)",
	}, {
		name: "init containers", opts: ps(func(p *corev1.PodSpec) {
			p.InitContainers = []corev1.Container{{Name: "init", Image: testImage}}
		}),
		reason: "UnsupportedInitContainers", field: "spec.initContainers", detail: detailFor("initContainers"),
	}, {
		name: "volumes", opts: ps(func(p *corev1.PodSpec) {
			p.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		}),
		reason: "UnsupportedVolumes", field: "spec.volumes", detail: detailFor("volumes"),
	}, {
		name: "volumeMounts", opts: c(func(c *corev1.Container) { c.VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}} }),
		reason: "UnsupportedVolumeMounts", field: containerPath + ".volumeMounts", detail: detailFor("volumeMounts"),
	}, {
		name: "a liveness probe", opts: c(func(c *corev1.Container) {
			c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz"}}}
		}),
		reason: "UnsupportedLivenessProbe", field: containerPath + ".livenessProbe", detail: detailFor("livenessProbe"),
	}, {
		name: "a startup probe", opts: c(func(c *corev1.Container) {
			c.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{}}}
		}),
		reason: "UnsupportedStartupProbe", field: containerPath + ".startupProbe", detail: detailFor("startupProbe"),
	}, {
		name: "an httpGet readiness probe", opts: c(func(c *corev1.Container) {
			c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready"}}}
		}),
		reason: "UnsupportedReadinessProbe", field: containerPath + ".readinessProbe",
		detail: "only the default readiness probe (tcpSocket: {}) is supported; fiberd checks the sealed template's readiness itself",
	}, {
		name: "a tuned tcpSocket readiness probe", opts: c(func(c *corev1.Container) {
			c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{}}, PeriodSeconds: 5}
		}),
		reason: "UnsupportedReadinessProbe", field: containerPath + ".readinessProbe",
		detail: "only the default readiness probe (tcpSocket: {}) is supported; fiberd checks the sealed template's readiness itself",
	}, {
		name: "a runtime class", opts: ps(func(p *corev1.PodSpec) { p.RuntimeClassName = ptr.String("gvisor") }),
		reason: "UnsupportedRuntimeClassName", field: "spec.runtimeClassName", detail: detailFor("runtimeClassName"),
	}, {
		name: "a pod security context", opts: ps(func(p *corev1.PodSpec) {
			p.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.Int64(1000)}
		}),
		reason: "UnsupportedSecurityContext", field: "spec.securityContext", detail: detailFor("securityContext"),
	}, {
		name: "a container security context", opts: c(func(c *corev1.Container) {
			c.SecurityContext = &corev1.SecurityContext{RunAsNonRoot: ptr.Bool(true)}
		}),
		reason: "UnsupportedSecurityContext", field: containerPath + ".securityContext", detail: detailFor("securityContext"),
	}, {
		name: "a service account", opts: ps(func(p *corev1.PodSpec) { p.ServiceAccountName = "builder" }),
		reason: "UnsupportedServiceAccountName", field: "spec.serviceAccountName", detail: detailFor("serviceAccountName"),
	}, {
		name: "image pull secrets", opts: ps(func(p *corev1.PodSpec) {
			p.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
		}),
		reason: "UnsupportedImagePullSecrets", field: "spec.imagePullSecrets", detail: detailFor("imagePullSecrets"),
	}, {
		name: "a CPU request", opts: c(func(c *corev1.Container) {
			c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
		}),
		reason: "UnsupportedCPURequest", field: containerPath + ".resources.requests.cpu", detail: "CPU requests are not supported; fibers share the Home's CPU",
	}, {
		name: "an ephemeral-storage request", opts: c(func(c *corev1.Container) {
			c.Resources.Requests = corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("1Gi")}
		}),
		reason: "UnsupportedResourceRequest", field: containerPath + ".resources.requests.ephemeral-storage", detail: "only a memory request is supported, not ephemeral-storage",
	}, {
		name: "a memory limit", opts: c(func(c *corev1.Container) {
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}
		}),
		reason: "UnsupportedResourceLimits", field: containerPath + ".resources.limits", detail: "resource limits are not supported; a fiber's memory limit is its memory request",
	}, {
		name: "two ports", opts: c(func(c *corev1.Container) {
			c.Ports = []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 9090}}
		}),
		reason: "UnsupportedPorts", field: containerPath + ".ports", detail: "at most one container port is supported",
	}, {
		name: "an unknown port name", opts: c(func(c *corev1.Container) { c.Ports = []corev1.ContainerPort{{Name: "grpc", ContainerPort: 8080}} }),
		reason: "UnsupportedPortName", field: containerPath + ".ports[0].name", detail: `port name "grpc": use h2c for HTTP/2 (gRPC), or http1 or no name for HTTP/1`,
	}, {
		name: "min-scale 1", opts: ann("autoscaling.knative.dev/min-scale", "1"),
		reason: "UnsupportedMinScale", field: annField("autoscaling.knative.dev/min-scale"), detail: `min-scale must be 0 until reserved fiber capacity exists, got "1"`,
	}, {
		name: "legacy minScale 2", opts: ann("autoscaling.knative.dev/minScale", "2"),
		reason: "UnsupportedMinScale", field: annField("autoscaling.knative.dev/minScale"), detail: `min-scale must be 0 until reserved fiber capacity exists, got "2"`,
	}, {
		name: "a negative max-scale", opts: ann("autoscaling.knative.dev/max-scale", "-1"),
		reason: "UnsupportedMaxScale", field: annField("autoscaling.knative.dev/max-scale"), detail: `max-scale must be an integer from 0 to 10000, got "-1"`,
	}, {
		name: "max-scale above the grant limit", opts: ann("autoscaling.knative.dev/max-scale", "10001"),
		reason: "UnsupportedMaxScale", field: annField("autoscaling.knative.dev/max-scale"), detail: `max-scale must be an integer from 0 to 10000, got "10001"`,
	}, {
		name: "timeoutSeconds above a day", opts: []revOption{func(r *v1.Revision) { r.Spec.TimeoutSeconds = ptr.Int64(86401) }},
		reason: "UnsupportedTimeoutSeconds", field: "spec.timeoutSeconds", detail: "timeoutSeconds must be between 1 and 86400",
	}, {
		name: "an idle timeout that is not a duration", opts: []revOption{annotation(contract.ExecutionModeAnnotation, "reuse"), annotation(contract.IdleTimeoutAnnotation, "30")},
		reason: "UnsupportedIdleTimeout", field: annField(contract.IdleTimeoutAnnotation), detail: `"30": want a duration such as 30s, at most 24h`,
	}, {
		name: "containerConcurrency 0 (the webhook's default)", opts: []revOption{func(r *v1.Revision) { r.Spec.ContainerConcurrency = ptr.Int64(0) }},
		reason: "UnsupportedContainerConcurrency", field: "spec.containerConcurrency", detail: "containerConcurrency must be 1 (one request per fiber), got 0",
	}, {
		name: "containerConcurrency unset (defaulted to 0)", opts: []revOption{func(r *v1.Revision) { r.Spec.ContainerConcurrency = nil }},
		reason: "UnsupportedContainerConcurrency", field: "spec.containerConcurrency", detail: "containerConcurrency must be 1 (one request per fiber), got 0",
	}, {
		name: "containerConcurrency 10", opts: []revOption{func(r *v1.Revision) { r.Spec.ContainerConcurrency = ptr.Int64(10) }},
		reason: "UnsupportedContainerConcurrency", field: "spec.containerConcurrency", detail: "containerConcurrency must be 1 (one request per fiber), got 10",
	}, {
		name: "responseStartTimeoutSeconds", opts: []revOption{func(r *v1.Revision) { r.Spec.ResponseStartTimeoutSeconds = ptr.Int64(10) }},
		reason: "UnsupportedResponseStartTimeoutSeconds", field: "spec.responseStartTimeoutSeconds", detail: "only timeoutSeconds bounds a request in Lampyr; remove responseStartTimeoutSeconds",
	}, {
		name: "idleTimeoutSeconds", opts: []revOption{func(r *v1.Revision) { r.Spec.IdleTimeoutSeconds = ptr.Int64(10) }},
		reason: "UnsupportedIdleTimeoutSeconds", field: "spec.idleTimeoutSeconds", detail: "only timeoutSeconds bounds a request in Lampyr; use lampyr.dev/idle-timeout for reuse mode instead",
	}, {
		name: "the HPA autoscaler class", opts: ann("autoscaling.knative.dev/class", "hpa.autoscaling.knative.dev"),
		reason: "UnsupportedAutoscalingClass", field: annField("autoscaling.knative.dev/class"), detail: `only the default class kpa.autoscaling.knative.dev is supported, got "hpa.autoscaling.knative.dev"`,
	}, {
		name: "the rps metric", opts: ann("autoscaling.knative.dev/metric", "rps"),
		reason: "UnsupportedAutoscalingMetric", field: annField("autoscaling.knative.dev/metric"), detail: `only the default metric concurrency is supported, got "rps"`,
	}, {
		name: "autoscaler tuning (target)", opts: ann("autoscaling.knative.dev/target", "10"),
		reason: "UnsupportedAutoscalingAnnotation", field: annField("autoscaling.knative.dev/target"), detail: "fibers are admitted one request each up to max-scale; other autoscaler tuning does not apply",
	}, {
		name: "an image pinned by tag", opts: c(func(c *corev1.Container) { c.Image = "registry.example/hello:v1" }),
		reason: "UnsupportedImage", field: containerPath + ".image",
		detail: `the image must be pinned by digest (repository@sha256:...): "registry.example/hello:v1": a digest must contain exactly one '@' separator (e.g. registry/repository@digest) saw: registry.example/hello:v1`,
	}, {
		name: "a missing snapshot artifact", opts: []revOption{withoutAnnotation(contract.SnapshotArtifactAnnotation)},
		reason: "MissingSnapshotArtifact", field: annField(contract.SnapshotArtifactAnnotation), detail: "required: the digest-pinned reference Lampyr runs this Revision from (`ly deploy` writes it), unless the image (repository@digest) is mapped to a snapshot artifact in config-lampyr image-snapshots",
	}, {
		name: "a snapshot artifact pinned by tag", opts: ann(contract.SnapshotArtifactAnnotation, "registry.example/hello-snapshot:latest"),
		reason: "UnsupportedSnapshotArtifact", field: annField(contract.SnapshotArtifactAnnotation),
		detail: `must be pinned by digest (repository@sha256:...): "registry.example/hello-snapshot:latest": a digest must contain exactly one '@' separator (e.g. registry/repository@digest) saw: registry.example/hello-snapshot:latest`,
	}, {
		name: "a missing fiberd template", opts: []revOption{withoutAnnotation(contract.FiberdTemplateAnnotation)},
		reason: "MissingFiberdTemplate", field: annField(contract.FiberdTemplateAnnotation), detail: "required: the digest-pinned reference Lampyr runs this Revision from (`ly deploy` writes it), unless the image (repository@digest) is mapped to a snapshot artifact in config-lampyr image-snapshots",
	}, {
		name: "an unknown execution mode", opts: ann(contract.ExecutionModeAnnotation, "park"),
		reason: "UnsupportedExecutionMode", field: annField(contract.ExecutionModeAnnotation), detail: `"park": use fresh or reuse`,
	}, {
		name: "idle action park", opts: []revOption{
			annotation(contract.ExecutionModeAnnotation, "reuse"), annotation(contract.IdleTimeoutAnnotation, "30s"), annotation(contract.IdleActionAnnotation, "park"),
		},
		reason: "UnsupportedIdleAction", field: annField(contract.IdleActionAnnotation), detail: `"park": only release is supported (park/resume are not)`,
	}, {
		name: "reuse without an idle timeout", opts: ann(contract.ExecutionModeAnnotation, "reuse"),
		reason: "MissingIdleTimeout", field: annField(contract.IdleTimeoutAnnotation), detail: "execution-mode reuse needs an idle timeout such as 30s",
	}, {
		name: "an idle timeout with fresh mode", opts: ann(contract.IdleTimeoutAnnotation, "30s"),
		reason: "UnsupportedIdleTimeout", field: annField(contract.IdleTimeoutAnnotation), detail: "applies to execution-mode reuse only; fresh fibers are released when the request ends",
	}, {
		name: "enableServiceLinks", opts: ps(func(p *corev1.PodSpec) { p.EnableServiceLinks = ptr.Bool(true) }),
		reason: "UnsupportedEnableServiceLinks", field: "spec.enableServiceLinks", detail: "Service environment variables are not injected into fibers",
	}, {
		name: "a node selector", opts: ps(func(p *corev1.PodSpec) { p.NodeSelector = map[string]string{"disk": "ssd"} }),
		reason: "UnsupportedNodeSelector", field: "spec.nodeSelector", detail: detailFor("nodeSelector"),
	}, {
		name: "lifecycle hooks", opts: c(func(c *corev1.Container) {
			c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sleep", "1"}}}}
		}),
		reason: "UnsupportedLifecycle", field: containerPath + ".lifecycle", detail: detailFor("lifecycle"),
	}}
}

// defaulted returns r as the webhook (and PreProcessReconcile) leaves it.
func defaulted(_ testing.TB, r *v1.Revision, cfg *apisconfig.Config) *v1.Revision {
	r = r.DeepCopy()
	r.SetDefaults(apisconfig.ToContext(context.Background(), cfg))
	return r
}

func TestValidateTemplateRejects(t *testing.T) {
	cfg := testServingConfig(t)
	for _, c := range rejectionCases() {
		t.Run(c.name, func(t *testing.T) {
			tmpl, rej := ValidateTemplate(defaulted(t, rev(c.opts...), cfg), cfg)
			if tmpl != nil {
				t.Fatalf("accepted: %+v", tmpl)
			}
			want := Rejection{{Reason: c.reason, Field: c.field, Detail: c.detail}}
			if diff := cmp.Diff(want, rej); diff != "" {
				t.Errorf("rejection (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidateTemplateAccepts(t *testing.T) {
	cfg := testServingConfig(t)
	securePodDefaults := testServingConfig(t)
	securePodDefaults.Features.SecurePodDefaults = apisconfig.Enabled
	longResponseStart := testServingConfig(t)
	longResponseStart.Defaults.RevisionResponseStartTimeoutSeconds = 300

	tests := []struct {
		name string
		rev  *v1.Revision
		cfg  *apisconfig.Config
		want *resources.Template
	}{{
		name: "plain Service with containerConcurrency 1, after defaulting",
		rev:  rev(),
		want: accepted(),
	}, {
		name: "the webhook's default readiness probe, written out",
		rev: rev(container(func(c *corev1.Container) {
			c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(0)}}, SuccessThreshold: 1}
		})),
		want: accepted(),
	}, {
		name: "named h2c port",
		rev:  rev(container(func(c *corev1.Container) { c.Ports = []corev1.ContainerPort{{Name: "h2c", ContainerPort: 50051}} })),
		want: accepted(h2c),
	}, {
		name: "one http1 port with TCP protocol",
		rev: rev(container(func(c *corev1.Container) {
			c.Ports = []corev1.ContainerPort{{Name: "http1", ContainerPort: 9000, Protocol: corev1.ProtocolTCP}}
		})),
		want: accepted(func(t *resources.Template) { t.Port = 9000 }),
	}, {
		name: "memory request, max-scale, min-scale 0, timeoutSeconds, KPA class, concurrency metric, labels and annotations",
		rev: rev(
			container(func(c *corev1.Container) {
				c.Name = "app"
				c.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
				c.ImagePullPolicy = corev1.PullIfNotPresent
			}),
			annotation("autoscaling.knative.dev/max-scale", "20"),
			annotation("autoscaling.knative.dev/minScale", "0"),
			annotation("autoscaling.knative.dev/class", "kpa.autoscaling.knative.dev"),
			annotation("autoscaling.knative.dev/metric", "concurrency"),
			annotation("example.com/team", "payments"),
			func(r *v1.Revision) {
				r.Labels["example.com/tier"] = "web"
				r.Spec.TimeoutSeconds = ptr.Int64(60)
			},
		),
		want: accepted(func(t *resources.Template) {
			t.ContainerName = "app"
			t.Memory = ptrTo(resource.MustParse("64Mi"))
			t.MaxFibers = 20
			t.TimeoutSeconds = 60
		}),
	}, {
		name: "reuse with idle timeout (rounded up to whole seconds) and release",
		rev: rev(
			annotation(contract.ExecutionModeAnnotation, "reuse"),
			annotation(contract.IdleTimeoutAnnotation, "1500ms"),
			annotation(contract.IdleActionAnnotation, "release"),
		),
		want: accepted(func(t *resources.Template) {
			t.Execution = fiberdv1alpha1.ExecutionPolicy{Mode: fiberdv1alpha1.ExecutionReuse, IdleTimeoutSeconds: 2, IdleAction: "release"}
		}),
	}, {
		name: "explicit fresh mode",
		rev:  rev(annotation(contract.ExecutionModeAnnotation, "fresh")),
		want: accepted(),
	}, {
		name: "secure-pod-defaults: the security context the webhook adds is accepted",
		rev:  rev(),
		cfg:  securePodDefaults,
		want: accepted(),
	}, {
		name: "timeoutSeconds above the response-start default: the defaulted responseStartTimeoutSeconds is accepted",
		rev:  rev(func(r *v1.Revision) { r.Spec.TimeoutSeconds = ptr.Int64(600) }),
		cfg:  longResponseStart,
		want: accepted(func(t *resources.Template) { t.TimeoutSeconds = 600 }),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			if c == nil {
				c = cfg
			}
			r := defaulted(t, tc.rev, c)
			got, rej := ValidateTemplate(r, c)
			if rej != nil {
				t.Fatalf("rejected: %s (%s)\nspec: %+v", rej.Reason(), rej.Message(), r.Spec)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("template (-want +got):\n%s", diff)
			}
		})
	}
}

// The security context secure-pod-defaults adds is accepted only as the
// webhook writes it, not when the user tightens or loosens it.
func TestValidateTemplateSecurePodDefaultsIsExact(t *testing.T) {
	cfg := testServingConfig(t)
	cfg.Features.SecurePodDefaults = apisconfig.Enabled
	r := defaulted(t, rev(), cfg)
	if r.Spec.Containers[0].SecurityContext == nil {
		t.Fatal("secure-pod-defaults did not add a security context; the test is not testing anything")
	}
	r.Spec.Containers[0].SecurityContext.Privileged = ptr.Bool(true)
	if _, rej := ValidateTemplate(r, cfg); rej == nil || rej.Reason() != "UnsupportedSecurityContext" {
		t.Fatalf("rejection = %v, want UnsupportedSecurityContext", rej)
	}
}

// Several offending fields are all listed, the first giving the reason.
func TestValidateTemplateListsEveryField(t *testing.T) {
	cfg := testServingConfig(t)
	r := defaulted(t, rev(
		container(func(c *corev1.Container) { c.Command = []string{"x"}; c.Env = []corev1.EnvVar{{Name: "A"}} }),
		annotation("autoscaling.knative.dev/min-scale", "3"),
	), cfg)
	_, rej := ValidateTemplate(r, cfg)
	var reasons []string
	for _, u := range rej {
		reasons = append(reasons, u.Reason)
	}
	if want := []string{"UnsupportedCommand", "UnsupportedEnv", "UnsupportedMinScale"}; !cmp.Equal(want, reasons) {
		t.Errorf("reasons = %v, want %v", reasons, want)
	}
	if rej.Reason() != "UnsupportedCommand" || !strings.Contains(rej.Message(), "spec.containers[0].env") {
		t.Errorf("Reason() = %q, Message() = %q", rej.Reason(), rej.Message())
	}
}

// FuzzValidate feeds arbitrary Revisions through defaulting and validation.
// Input: a Revision as JSON (when it does not parse, the accepted rev() is
// used) plus one annotation, containerConcurrency and one port the fuzzer
// sets directly, so that annotation values, concurrency and ports are
// explored even when byte mutations break the JSON. Properties: no panic;
// exactly one of template / rejection; every rejection names a reason, a
// field and a detail; an accepted template is inside the subset and renders
// every owned object.
func FuzzValidate(f *testing.F) {
	seed := func(r *v1.Revision) {
		b, err := json.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "", "", int64(0), int32(0), "")
	}
	seed(rev())
	seed(rev(container(func(c *corev1.Container) { c.Ports = []corev1.ContainerPort{{Name: "h2c", ContainerPort: 50051}} })))
	seed(rev(annotation(contract.ExecutionModeAnnotation, "reuse"), annotation(contract.IdleTimeoutAnnotation, "30s")))
	for _, c := range rejectionCases() {
		seed(rev(c.opts...))
	}
	f.Add([]byte(`{"spec":{"containers":[]}}`), "", "", int64(0), int32(0), "")
	f.Add([]byte(`{"metadata":{"annotations":{"autoscaling.knative.dev/max-scale":"99999999999"}},"spec":{"containers":[{"image":"a@sha256:x"}]}}`), "", "", int64(0), int32(0), "")
	f.Add([]byte("not json"), "autoscaling.knative.dev/max-scale", "12", int64(1), int32(8080), "http1")
	f.Add([]byte("not json"), contract.IdleTimeoutAnnotation, "1h30m", int64(1), int32(50051), "h2c")
	f.Add([]byte("not json"), "autoscaling.knative.dev/minScale", "0", int64(-3), int32(-1), "grpc")

	cfg := testServingConfig(f)
	lampyr := testLampyr(lampyrconfig.BackendEndpointSlice)
	f.Fuzz(func(t *testing.T, data []byte, annKey, annValue string, concurrency int64, port int32, portName string) {
		r := &v1.Revision{}
		if err := json.Unmarshal(data, r); err != nil {
			r = rev()
		}
		if annKey != "" {
			if r.Annotations == nil {
				r.Annotations = map[string]string{}
			}
			r.Annotations[annKey] = annValue
		}
		if concurrency != 0 {
			r.Spec.ContainerConcurrency = &concurrency
		}
		if (port != 0 || portName != "") && len(r.Spec.Containers) > 0 {
			r.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: portName, ContainerPort: port}}
		}
		check := func(r *v1.Revision) {
			tmpl, rej := ValidateTemplate(r, cfg)
			if (tmpl == nil) == (rej == nil) {
				t.Fatalf("template %v and rejection %v: want exactly one", tmpl, rej)
			}
			if rej != nil {
				for _, u := range rej {
					if u.Reason == "" || u.Field == "" || u.Detail == "" {
						t.Fatalf("incomplete rejection %+v", u)
					}
				}
				_ = rej.Message()
				return
			}
			if r.Spec.GetContainerConcurrency() != 1 || len(r.Spec.Containers) != 1 || len(r.Spec.InitContainers) != 0 ||
				tmpl.TimeoutSeconds <= 0 || tmpl.Image == "" || tmpl.SnapshotArtifact == "" || tmpl.FiberdTemplate == "" ||
				tmpl.MaxFibers < 0 || tmpl.MaxFibers > maxFibersLimit || tmpl.TimeoutSeconds > maxSeconds ||
				tmpl.Execution.IdleTimeoutSeconds > maxSeconds || tmpl.Port <= 0 || tmpl.Port > 65535 ||
				(tmpl.Execution.Mode == fiberdv1alpha1.ExecutionReuse) != (tmpl.Execution.IdleTimeoutSeconds > 0) {
				t.Fatalf("accepted a template outside the subset: %+v from %+v", tmpl, r)
			}
			resources.MakeCapacityGrant(r, tmpl, lampyr)
			resources.MakeService(r, tmpl, lampyr)
			resources.MakeEndpointSlice(r, tmpl, nil)
			resources.MakeRouterMetadata(r, tmpl, "lampyr-system", resources.Home{}, false)
		}
		check(r)
		// And as the reconciler sees it, after defaulting.
		d := r.DeepCopy()
		d.SetDefaults(apisconfig.ToContext(context.Background(), cfg))
		check(d)
	})
}

// TestValidateImageMapped: with config-lampyr image-snapshots, a Revision
// without Lampyr annotations runs from the snapshot mapped to its image's
// digest and the controller seals its template; annotations always win; a
// half-annotated or unmapped Revision is refused as before.
func TestValidateImageMapped(t *testing.T) {
	cfg := &config.Config{Lampyr: mapping(), Serving: testServingConfig(t)}
	plain := []revOption{withoutAnnotation(contract.SnapshotArtifactAnnotation), withoutAnnotation(contract.FiberdTemplateAnnotation)}
	validate := func(r *v1.Revision) (*resources.Template, Rejection) {
		r.SetDefaults(apisconfig.ToContext(context.Background(), cfg.Serving))
		return Validate(r, cfg)
	}

	got, rej := validate(rev(plain...))
	if rej != nil {
		t.Fatalf("mapped image refused: %s", rej.Message())
	}
	if want := accepted(func(t *resources.Template) { t.FiberdTemplate = ""; t.SealByController = true }); !cmp.Equal(want, got) {
		t.Errorf("mapped template (-want +got):\n%s", cmp.Diff(want, got))
	}

	if got, rej := validate(rev()); rej != nil || got.SealByController || got.FiberdTemplate != testTemplate {
		t.Errorf("annotated Revision: %+v %v, want the annotations' template", got, rej)
	}

	_, rej = validate(rev(withoutAnnotation(contract.FiberdTemplateAnnotation)))
	if rej == nil || rej.Reason() != "MissingFiberdTemplate" {
		t.Errorf("half-annotated Revision: %v, want MissingFiberdTemplate", rej)
	}

	unmapped := append(plain, container(func(c *corev1.Container) {
		c.Image = "registry.example/other@sha256:" + strings.Repeat("9", 64)
	}))
	_, rej = validate(rev(unmapped...))
	if rej == nil || rej.Reason() != "MissingSnapshotArtifact" || !strings.Contains(rej.Message(), "image-snapshots") {
		t.Errorf("unmapped image: %v, want MissingSnapshotArtifact naming image-snapshots", rej)
	}

	// The mapped digest under another repository is another image.
	otherRepo := append(plain, container(func(c *corev1.Container) {
		c.Image = "registry.example/intruder@sha256:" + strings.Repeat("1", 64)
	}))
	_, rej = validate(rev(otherRepo...))
	if rej == nil || rej.Reason() != "MissingSnapshotArtifact" {
		t.Errorf("mapped digest under another repository: %v, want MissingSnapshotArtifact", rej)
	}
}
