package lampyr

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	grantconfig "lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/ly"
)

// SystemNamespace is where Lampyr's components run.
const SystemNamespace = "lampyr-system"

// Labels that select tests (-ginkgo.label-filter).
const (
	LabelInstall      = "install"      // what the installation runs
	LabelRouting      = "routing"      // requests through the gateway to fibers
	LabelTemplate     = "template"     // the Revision template subset
	LabelRefusal      = "refusal"      // a Revision refused, with the reason a person needs
	LabelScaling      = "scaling"      // max-scale, one request per fiber, timeouts
	LabelReadiness    = "readiness"    // Revision conditions
	LabelCapacity     = "capacity"     // CapacityGrant limits
	LabelExecution    = "execution"    // execution modes
	LabelRestart      = "restart"      // components or Homes killed mid-operation
	LabelKeys         = "keys"         // fleet key, sealing
	LabelTenancy      = "tenancy"      // nothing of a Revision in the tenant's namespace, nothing left after it
	LabelFinalization = "finalization" // deleting Services cleans up
)

// Tests is Lampyr's conformance suite.
var Tests = concat(
	[]Test{installation(), valid()},
	refusals(),
	[]Test{supported(), capped(), bounded(), unbuilt(), imageOnly(), tooBig(), homeless(), mended(), fresh(), reuse()},
	restarts(),
	[]Test{rotation(), finalization()},
)

func concat(lists ...[]Test) []Test {
	var out []Test
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// installation: from clusters/e2e/lampyr.
func installation() Test {
	return Test{
		Name: "installation", Feature: FeatureInstallation, Labels: []string{LabelInstall},
		Description: "runs no stock controller, activator or autoscaler",
		Assert: func(ctx context.Context, t *T) {
			provider := t.NetworkingProvider(ctx)
			ds, err := t.Clients.Kube.AppsV1().Deployments("knative-serving").List(ctx, metav1.ListOptions{})
			Expect(err).NotTo(HaveOccurred())
			var names []string
			for _, d := range ds.Items {
				names = append(names, d.Name)
			}
			// Upstream's webhook, and the networking provider's own
			// Deployments there (net-gateway-api's controller and webhook).
			want := []string{"webhook"}
			objs, err := networking.Rendered(provider, clusters.DefaultNodePort)
			Expect(err).NotTo(HaveOccurred())
			for _, o := range objs {
				if o.GetKind() == "Deployment" && o.GetNamespace() == "knative-serving" {
					want = append(want, o.GetName())
				}
			}
			Expect(names).To(ConsistOf(want), "knative-serving must hold only upstream's webhook and %s's own Deployments", provider.Name())
			ls, err := t.Clients.Kube.AppsV1().Deployments(SystemNamespace).List(ctx, metav1.ListOptions{})
			Expect(err).NotTo(HaveOccurred())
			names = nil
			for _, d := range ls.Items {
				names = append(names, d.Name)
			}
			Expect(names).To(ConsistOf("lampyr-controller", "lampyr-grant-controller", "fiber-router"))
		},
	}
}

// valid: from clusters/e2e/lampyr.
func valid() Test {
	return Test{
		Name: "valid", Feature: FeatureServing, Labels: []string{LabelRouting, LabelTenancy},
		Description: "makes a valid Service Ready with its CapacityGrant, Home and backend Service, and serves it from fibers",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{t.Service(ctx, "valid", nil, nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			_, err := t.Clients.WaitReady(ctx, e2eutil.KServices, t.Namespace, "valid", 4*time.Minute)
			Expect(err).NotTo(HaveOccurred())
			rev := "valid-00001"
			g, err := t.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(t.Namespace).Get(ctx, rev, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred(), "the Revision's CapacityGrant")
			for _, typ := range []string{"Admitted", "HomeReady", "Ready"} {
				s, r, m := e2eutil.Condition(g, typ)
				Expect(s).To(Equal("True"), "grant condition %s: %s %s", typ, r, m)
			}
			gsnap, _, _ := unstructured.NestedString(g.Object, "spec", "snapshotArtifact")
			Expect(gsnap).To(Equal(t.Snap.String()))
			pods, err := e2eutil.HomePods(ctx, t.Clients, t.Namespace, rev)
			Expect(err).NotTo(HaveOccurred())
			Expect(pods.Items).NotTo(BeEmpty(), "the Revision's Home Pod, in %s", contract.HomesNamespace)
			for _, p := range pods.Items {
				Expect(p.Status.Phase).To(Equal(corev1.PodRunning), "Home %s", p.Name)
			}
			inNS, err := t.Clients.Kube.CoreV1().Pods(t.Namespace).List(ctx, metav1.ListOptions{})
			Expect(err).NotTo(HaveOccurred())
			// Nothing of the Revision runs in the tenant's namespace: the
			// one Pod of it there is its quota Pod, which the namespace's
			// ResourceQuota counts and the scheduler never places
			// (docs/security.md, "What a tenant's Kubernetes objects still
			// mean").
			var quotaPods []string
			for _, p := range inNS.Items {
				if p.Labels[contract.GrantLabel] != rev || p.Labels[contract.ComponentLabel] != contract.QuotaPodComponent {
					Fail(fmt.Sprintf("Pod %s in the tenant's namespace (labels %v) is not a quota Pod: no Pod of a Revision runs there", p.Name, p.Labels))
				}
				gated := false
				for _, g := range p.Spec.SchedulingGates {
					gated = gated || g.Name == contract.QuotaPodGate
				}
				Expect(gated).To(BeTrue(), "quota Pod %s keeps its scheduling gate %s", p.Name, contract.QuotaPodGate)
				Expect(p.Spec.NodeName).To(BeEmpty(), "quota Pod %s is never scheduled", p.Name)
				quotaPods = append(quotaPods, p.Name)
			}
			Expect(quotaPods).To(ConsistOf(rev+"-lampyr-quota"), "the Revision's one quota Pod, counted by the namespace's ResourceQuota")
			svc, err := t.Clients.Kube.CoreV1().Services(t.Namespace).Get(ctx, rev, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred(), "the backend Service the upstream Route reconciler expects, named after the Revision")
			provider := t.NetworkingProvider(ctx)
			strategy := install.BackendStrategyFor(provider.Name())
			if strategy == "externalname" {
				Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeExternalName), "externalname strategy (%s)", provider.Name())
			} else {
				Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP), "endpointslice strategy (%s)", provider.Name())
			}
			Expect(svc.Spec.Selector).To(BeEmpty())
			var ports []int32
			for _, p := range svc.Spec.Ports {
				ports = append(ports, p.Port)
			}
			Expect(ports).To(ContainElement(int32(80)), "port 80 (http) for an http1 Revision, as upstream's Route expects")
			if strategy == "endpointslice" {
				slices, err := t.Clients.Kube.DiscoveryV1().EndpointSlices(t.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + rev})
				Expect(err).NotTo(HaveOccurred())
				Expect(slices.Items).NotTo(BeEmpty(), "mirrored EndpointSlice")
			}
			_, err = t.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Get(ctx, e2eutil.RouterMetadataName(t.Namespace, rev), metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred(), "router metadata, in %s", contract.SystemNamespace)
			Eventually(func() (string, error) {
				code, body, _, err := t.Get(ctx, "valid", "/")
				if err == nil && code != 200 {
					err = fmt.Errorf("status %d: %s", code, body)
				}
				return body, err
			}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal("Hello World!\n"))
			code, body, _, err := t.Get(ctx, "valid", "/echo")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200))
			Expect(body).To(ContainSubstring(`"K_REVISION": "valid-00001"`))
		},
	}
}

// refusals: one test per refused template field. Merged from
// clusters/e2e/lampyr: bad-command (command), bad-env (env), bad-min-scale
// (minscale), bad-concurrency (concurrency), bad-template (notemplate),
// bad-image (tag); bad-park is idleaction.
func refusals() []Test {
	type refusal struct {
		name, reason, field string
		post                func(tspec, ann map[string]any)
	}
	other := "localhost:5002/elsewhere@sha256:" + strings.Repeat("e", 64)
	var out []Test
	for _, tc := range []refusal{
		{"command", "UnsupportedCommand", "command", func(t, _ map[string]any) { container(t)["command"] = []any{"/handler"} }},
		{"args", "UnsupportedArgs", "args", func(t, _ map[string]any) { container(t)["args"] = []any{"-v"} }},
		{"env", "UnsupportedEnv", "env", func(t, _ map[string]any) {
			container(t)["env"] = []any{map[string]any{"name": "TARGET", "value": "x"}}
		}},
		{"envfrom", "UnsupportedEnvFrom", "envFrom", func(t, _ map[string]any) {
			container(t)["envFrom"] = []any{map[string]any{"configMapRef": map[string]any{"name": "absent"}}}
		}},
		{"workingdir", "UnsupportedWorkingDir", "workingDir", func(t, _ map[string]any) { container(t)["workingDir"] = "/tmp" }},
		{"volumes", "UnsupportedVolumes", "volumes", func(t, _ map[string]any) {
			t["volumes"] = []any{map[string]any{"name": "v", "configMap": map[string]any{"name": "absent"}}}
			container(t)["volumeMounts"] = []any{map[string]any{"name": "v", "mountPath": "/v"}}
		}},
		{"liveness", "UnsupportedLivenessProbe", "livenessProbe", func(t, _ map[string]any) {
			container(t)["livenessProbe"] = map[string]any{"httpGet": map[string]any{"path": "/"}}
		}},
		{"readiness", "UnsupportedReadinessProbe", "readinessProbe", func(t, _ map[string]any) {
			container(t)["readinessProbe"] = map[string]any{"httpGet": map[string]any{"path": "/"}, "periodSeconds": int64(1)}
		}},
		{"runasuser", "UnsupportedSecurityContext", "securityContext", func(t, _ map[string]any) {
			container(t)["securityContext"] = map[string]any{"runAsUser": int64(1000)}
		}},
		{"serviceaccount", "UnsupportedServiceAccountName", "serviceAccountName", func(t, _ map[string]any) { t["serviceAccountName"] = "default" }},
		{"limits", "UnsupportedResourceLimits", "limits", func(t, _ map[string]any) {
			container(t)["resources"] = map[string]any{"limits": map[string]any{"memory": "128Mi"}}
		}},
		{"cpu", "UnsupportedCPURequest", "requests.cpu", func(t, _ map[string]any) {
			container(t)["resources"] = map[string]any{"requests": map[string]any{"cpu": "100m"}}
		}},
		{"sidecar", "UnsupportedContainers", "spec.containers", func(t, _ map[string]any) {
			container(t)["name"] = "user"
			t["containers"] = append(t["containers"].([]any), map[string]any{"name": "sidecar", "image": other})
		}},
		{"tag", "UnsupportedImage", "image", nil}, // by tag: the registry is the installation's, set below
		{"concurrency", "UnsupportedContainerConcurrency", "containerConcurrency", func(t, _ map[string]any) { t["containerConcurrency"] = int64(0) }},
		{"responsestart", "UnsupportedResponseStartTimeoutSeconds", "responseStartTimeoutSeconds", func(t, _ map[string]any) {
			t["responseStartTimeoutSeconds"] = int64(5)
		}},
		{"minscale", "UnsupportedMinScale", "min-scale", func(_, a map[string]any) { a["autoscaling.knative.dev/min-scale"] = "1" }},
		{"target", "UnsupportedAutoscalingAnnotation", "autoscaling.knative.dev/target", func(_, a map[string]any) {
			a["autoscaling.knative.dev/target"] = "10"
		}},
		{"metric", "UnsupportedAutoscalingMetric", "metric", func(_, a map[string]any) { a["autoscaling.knative.dev/metric"] = "rps" }},
		{"notemplate", "MissingFiberdTemplate", contract.FiberdTemplateAnnotation, func(_, a map[string]any) { delete(a, contract.FiberdTemplateAnnotation) }},
		{"park", "UnsupportedExecutionMode", contract.ExecutionModeAnnotation, func(_, a map[string]any) { a[contract.ExecutionModeAnnotation] = "park" }},
		{"idleaction", "UnsupportedIdleAction", "idle-action", func(_, a map[string]any) {
			a[contract.ExecutionModeAnnotation] = "reuse"
			a[contract.IdleTimeoutAnnotation] = "30s"
			a[contract.IdleActionAnnotation] = "park"
		}},
	} {
		svc := "refuse-" + tc.name
		out = append(out, Test{
			Name: svc, Feature: FeatureTemplateSubset, Labels: []string{LabelTemplate, LabelRefusal},
			Description: "refuses " + tc.field + " with Ready=False " + tc.reason + ", and creates no grant",
			Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
				post := tc.post
				if tc.name == "tag" {
					post = func(ts, _ map[string]any) {
						container(ts)["image"] = t.Inst.Registry + "/lampyr-conformance/handler:conformance"
					}
				}
				return []*unstructured.Unstructured{t.Service(ctx, svc, nil, post)}
			},
			Assert: func(ctx context.Context, t *T) {
				reason, msg := t.WaitCondition(ctx, svc+"-00001", "Ready", "False", 2*time.Minute)
				Logf("%s: Ready=False %s: %s", svc, reason, msg)
				Expect(reason).To(Equal(tc.reason), "message: %s", msg)
				Expect(msg).To(ContainSubstring(tc.field))
				_, err := t.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(t.Namespace).Get(ctx, svc+"-00001", metav1.GetOptions{})
				Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a refused Revision gets no CapacityGrant")
			},
		})
	}
	return out
}

func supported() Test {
	return Test{
		Name: "supported", Feature: FeatureTemplateSubset, Labels: []string{LabelTemplate, LabelRouting},
		Description: "accepts the supported fields and carries each into the CapacityGrant",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			maxScale, timeout := int32(3), int64(45)
			return []*unstructured.Unstructured{t.Service(ctx, "supported", func(p *ly.Project) {
				p.Memory, p.MaxScale, p.TimeoutSeconds = "96Mi", &maxScale, &timeout
				p.Execution = ly.Execution{Mode: "reuse", IdleTimeout: "20s", IdleAction: "release"}
			}, func(ts, _ map[string]any) {
				// The webhook's own default probe, written out, is accepted.
				container(ts)["readinessProbe"] = map[string]any{"tcpSocket": map[string]any{}, "successThreshold": int64(1)}
				container(ts)["imagePullPolicy"] = "IfNotPresent"
			})}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "supported", 4*time.Minute)
			g, err := t.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(t.Namespace).Get(ctx, "supported-00001", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			spec := g.Object["spec"].(map[string]any)
			Expect(spec["memoryPerFiber"]).To(Equal("96Mi"))
			Expect(spec["maxFibers"]).To(BeNumerically("==", 3))
			Expect(spec["maxRequestSeconds"]).To(BeNumerically("==", 45))
			Expect(spec["execution"]).To(HaveKeyWithValue("mode", "reuse"))
			Expect(spec["execution"]).To(HaveKeyWithValue("idleTimeoutSeconds", BeNumerically("==", 20)))
			Expect(spec["snapshotArtifact"]).To(Equal(t.Snap.String()))
		},
	}
}

func capped() Test {
	return Test{
		Name: "max-scale", Feature: FeatureMaxScale, Labels: []string{LabelScaling, LabelRouting},
		Description: "serves one request per fiber and never more than max-scale fibers at once",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			maxScale := int32(2)
			return []*unstructured.Unstructured{t.Service(ctx, "capped", func(p *ly.Project) { p.MaxScale = &maxScale }, nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "capped", 4*time.Minute)
			// Four 2 s requests on at most two fibers, one request each: at
			// least two rounds. (Without either rule they would all end in
			// about 2 s.)
			const n, sleep = 4, 2 * time.Second
			var wg sync.WaitGroup
			codes := make([]int, n)
			errs := make([]error, n)
			start := time.Now()
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes[i], _, _, errs[i] = t.Get(ctx, "capped", fmt.Sprintf("/sleep?ms=%d", sleep.Milliseconds()))
				}()
			}
			wg.Wait()
			took := time.Since(start)
			Logf("4 concurrent 2 s requests, max-scale 2: %v, statuses %v, errors %v", took, codes, errs)
			Expect(errs).To(HaveEach(BeNil()))
			Expect(codes).To(HaveEach(200))
			Expect(took).To(BeNumerically(">=", 2*sleep), "4 requests finished in %v: more than 2 ran at once", took)
		},
	}
}

func bounded() Test {
	return Test{
		Name: "timeout", Feature: FeatureTimeout, Labels: []string{LabelScaling, LabelRouting},
		Description: "ends a request, a stream and a WebSocket at timeoutSeconds",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			timeout := int64(3)
			return []*unstructured.Unstructured{t.Service(ctx, "bounded", func(p *ly.Project) { p.TimeoutSeconds = &timeout }, nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "bounded", 4*time.Minute)
			code, body, took, err := t.Get(ctx, "bounded", "/sleep?ms=12000")
			Logf("request sleeping 12 s, timeoutSeconds 3: %d after %v: %q %v", code, took, body, err)
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(http.StatusGatewayTimeout))
			Expect(took).To(BeNumerically("<", 9*time.Second))

			// 40 chunks 250 ms apart would take 10 s.
			code, body, took, err = t.Get(ctx, "bounded", "/stream?n=40&delayms=250")
			chunks := strings.Count(body, "chunk-")
			Logf("10 s stream, timeoutSeconds 3: %d, %d chunks, %v, err %v", code, chunks, took, err)
			Expect(chunks).To(BeNumerically(">", 0), "the stream started")
			Expect(chunks).To(BeNumerically("<", 40), "the stream was cut")
			Expect(took).To(BeNumerically("<", 9*time.Second))

			h := http.Header{"Host": []string{t.Host("bounded")}}
			d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
			var conn *websocket.Conn
			Eventually(func() error {
				var err error
				conn, _, err = d.DialContext(ctx, strings.Replace(t.Gateway, "http://", "ws://", 1)+"/ws", h)
				return err
			}).WithTimeout(30 * time.Second).Should(Succeed())
			defer conn.Close()
			opened := time.Now()
			Expect(conn.WriteMessage(websocket.TextMessage, []byte("hi"))).To(Succeed())
			_, msg, err := conn.ReadMessage()
			Expect(err).NotTo(HaveOccurred())
			Expect(string(msg)).To(Equal("echo: hi"))
			conn.SetReadDeadline(time.Now().Add(15 * time.Second))
			_, _, err = conn.ReadMessage()
			closed := time.Since(opened)
			Logf("WebSocket, timeoutSeconds 3: closed after %v: %v", closed, err)
			Expect(err).To(HaveOccurred(), "the WebSocket outlived timeoutSeconds")
			Expect(closed).To(BeNumerically("<", 10*time.Second), "closed by the read deadline, not by timeoutSeconds")
		},
	}
}

func unbuilt() Test {
	image := func(t *T) string {
		return t.Inst.Registry + "/lampyr-conformance/absent@sha256:" + strings.Repeat("a", 64)
	}
	missing := func(t *T) string {
		return t.Inst.Registry + "/lampyr-conformance/absent-snapshot@sha256:" + strings.Repeat("b", 64)
	}
	return Test{
		Name: "container-missing", Feature: FeatureImageSnapshots, Labels: []string{LabelReadiness},
		Description: "is ContainerMissing when the image's mapped snapshot is not in the registry",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			Expect(ly.RegisterImageSnapshots(ctx, t.Ly, []*ly.ImageSnapshot{{Image: image(t), Snapshot: missing(t)}})).To(Succeed())
			DeferCleanup(func(ctx SpecContext) {
				Expect(ly.UnregisterImageSnapshots(ctx, t.Ly, []string{"sha256:" + strings.Repeat("a", 64)})).To(Succeed())
			})
			return []*unstructured.Unstructured{t.Service(ctx, "unbuilt", nil, func(ts, a map[string]any) {
				delete(a, contract.SnapshotArtifactAnnotation)
				delete(a, contract.FiberdTemplateAnnotation)
				container(ts)["image"] = image(t)
			})}
		},
		Assert: func(ctx context.Context, t *T) {
			reason, msg := t.WaitCondition(ctx, "unbuilt-00001", "ContainerHealthy", "False", 2*time.Minute)
			Logf("unbuilt: ContainerHealthy=False %s: %s", reason, msg)
			Expect(reason).To(Equal("ContainerMissing"))
			Expect(msg).To(ContainSubstring(missing(t)))
			s, _, _, err := t.Condition(ctx, "unbuilt-00001", "Ready")
			Expect(err).NotTo(HaveOccurred())
			Expect(s).To(Equal("False"))
		},
	}
}

func imageOnly() Test {
	image := func(t *T) string { return t.Inst.Registry + "/lampyr-conformance/handler-image@" + t.Snap.DigestStr() }
	return Test{
		Name: "image-only", Feature: FeatureImageSnapshots, Labels: []string{LabelRouting},
		Description: "runs an image-only Service whose image is mapped to a snapshot (the controller seals its template)",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			Expect(ly.RegisterImageSnapshots(ctx, t.Ly, []*ly.ImageSnapshot{{Image: image(t), Snapshot: t.Snap.String()}})).To(Succeed())
			DeferCleanup(func(ctx SpecContext) {
				Expect(ly.UnregisterImageSnapshots(ctx, t.Ly, []string{t.Snap.DigestStr()})).To(Succeed())
			})
			return []*unstructured.Unstructured{t.Service(ctx, "imageonly", nil, func(ts, a map[string]any) {
				delete(a, contract.SnapshotArtifactAnnotation)
				delete(a, contract.FiberdTemplateAnnotation)
				container(ts)["image"] = image(t)
			})}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "imageonly", 4*time.Minute)
			g, err := t.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(t.Namespace).Get(ctx, "imageonly-00001", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			tmpl, _, _ := unstructured.NestedString(g.Object, "spec", "template")
			Expect(tmpl).To(HavePrefix(t.Inst.TemplateRepository+"@sha256:"), "the template the controller sealed and pushed")
		},
	}
}

// maxMemoryPerFiber is the installation's max-memory-per-fiber, read as the
// grant controller reads config-lampyr.
func maxMemoryPerFiber(ctx context.Context, t *T) resource.Quantity {
	cm, err := t.Clients.Kube.CoreV1().ConfigMaps(SystemNamespace).Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	cfg, err := grantconfig.FromConfigMap(cm)
	Expect(err).NotTo(HaveOccurred())
	return cfg.MaxMemoryPerFiber
}

// tooBig: merged with clusters/e2e/lampyr's "surfaces a refused grant in
// ResourcesAvailable" (which also wanted the limit, 2Gi, in the message).
func tooBig() Test {
	return Test{
		Name: "too-big", Feature: FeatureCapacity, Labels: []string{LabelCapacity, LabelReadiness, LabelRefusal},
		Description: "keeps a refused grant's Revision not Ready with ResourcesAvailable=False naming the limit",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			// More memory per fiber than max-memory-per-fiber (2Gi by
			// default: 3Gi).
			over := maxMemoryPerFiber(ctx, t)
			over.Add(resource.MustParse("1Gi"))
			return []*unstructured.Unstructured{t.Service(ctx, "too-big", func(p *ly.Project) { p.Memory = over.String() }, nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			limit := maxMemoryPerFiber(ctx, t)
			reason, msg := t.WaitCondition(ctx, "too-big-00001", "ResourcesAvailable", "False", 2*time.Minute)
			Logf("too-big: ResourcesAvailable=False %s: %s", reason, msg)
			Expect(reason).NotTo(BeEmpty())
			Expect(msg).To(ContainSubstring("max-memory-per-fiber"))
			Expect(msg).To(ContainSubstring(limit.String()))
			s, _, _, err := t.Condition(ctx, "too-big-00001", "Ready")
			Expect(err).NotTo(HaveOccurred())
			Expect(s).To(Equal("False"))
		},
	}
}

func homeless() Test {
	return Test{
		Name: "template-mismatch", Feature: FeatureReadiness, Labels: []string{LabelReadiness, LabelKeys},
		Description: "keeps a Revision whose Home cannot load its template not Ready, with the Home's reason",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			// Sealed for another Revision: fiberd refuses it (TemplateMismatch).
			p := *t.Project
			p.Name = "homeless"
			two := int32(2)
			p.MaxScale = &two
			return []*unstructured.Unstructured{t.Manifest(ctx, &p, "someone-else-00001", nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			var reason, msg string
			Eventually(func() (string, error) {
				s, r, m, err := t.Condition(ctx, "homeless-00001", "ContainerHealthy")
				reason, msg = r, m
				return s + "/" + r, err
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal("False/TemplateMismatch"), "fiberd's own reason, through the grant")
			Logf("homeless: ContainerHealthy=False %s: %s", reason, msg)
			Expect(msg).To(ContainSubstring(`sealed for Revision "someone-else-00001"`))
			Consistently(func() (string, error) {
				s, _, _, err := t.Condition(ctx, "homeless-00001", "Ready")
				return s, err
			}).WithTimeout(20 * time.Second).WithPolling(2 * time.Second).ShouldNot(Equal("True"))
		},
	}
}

func mended() Test {
	return Test{
		Name: "repair", Feature: FeatureRepair, Labels: []string{LabelReadiness, LabelRouting},
		Description: "restores a deleted backend Service and router metadata, and serves again",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{t.Service(ctx, "mended", nil, nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "mended", 4*time.Minute)
			rev := "mended-00001"
			zero := int64(0)
			Expect(t.Clients.Kube.CoreV1().Services(t.Namespace).Delete(ctx, rev, metav1.DeleteOptions{GracePeriodSeconds: &zero})).To(Succeed())
			Expect(t.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Delete(ctx, e2eutil.RouterMetadataName(t.Namespace, rev), metav1.DeleteOptions{})).To(Succeed())
			Eventually(func() error {
				if _, err := t.Clients.Kube.CoreV1().Services(t.Namespace).Get(ctx, rev, metav1.GetOptions{}); err != nil {
					return err
				}
				_, err := t.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Get(ctx, e2eutil.RouterMetadataName(t.Namespace, rev), metav1.GetOptions{})
				return err
			}).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
			t.WaitServing(ctx, "mended", 2*time.Minute)
		},
	}
}

// state asks the fixture's /state: "<process instance> <requests it served>".
func state(ctx context.Context, t *T, svc string) (string, int, error) {
	code, body, _, err := t.Get(ctx, svc, "/state")
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d: %s", code, body)
	}
	if err != nil {
		return "", 0, err
	}
	var proc string
	var n int
	if _, err := fmt.Sscan(body, &proc, &n); err != nil {
		return "", 0, fmt.Errorf("/state answered %q: %w", body, err)
	}
	return proc, n, nil
}

func fresh() Test {
	return Test{
		Name: "fresh", Feature: FeatureFresh, Labels: []string{LabelExecution},
		Description: "fresh: every request gets a process of its own",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{t.Service(ctx, "fresh", nil, nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "fresh", 4*time.Minute)
			seen := map[string]bool{}
			for range 5 {
				inst, n, err := state(ctx, t, "fresh")
				Expect(err).NotTo(HaveOccurred())
				Expect(n).To(Equal(1), "fresh fiber %s had served a request before", inst)
				Expect(seen).NotTo(HaveKey(inst))
				seen[inst] = true
			}
		},
	}
}

// reuse: merged with clusters/e2e/lampyr's "serves a reuse-mode Service
// from live fibers kept between requests, over fiberd tunnels".
func reuse() Test {
	return Test{
		Name: "reuse", Feature: FeatureReuse, Labels: []string{LabelExecution, LabelRouting},
		Description: "reuse: requests share live fibers over fiberd tunnels until a fiber has been idle for idleTimeout",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			// Every fiber-router replica leases a fiber of its own: allow
			// as many fibers as there are replicas.
			d, err := t.Clients.Kube.AppsV1().Deployments(SystemNamespace).Get(ctx, "fiber-router", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			fibers := max(*d.Spec.Replicas, 2)
			return []*unstructured.Unstructured{t.Service(ctx, "reuse", func(p *ly.Project) {
				p.MaxScale = &fibers
				p.Execution = ly.Execution{Mode: "reuse", IdleTimeout: "4s", IdleAction: "release"}
			}, nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "reuse", 4*time.Minute)
			// Every fiber-router replica leases its own fiber; each fiber's
			// process must count on from request to request.
			last := map[string]int{}
			for i := range 30 {
				proc, n, err := state(ctx, t, "reuse")
				Expect(err).NotTo(HaveOccurred(), "request %d", i)
				if prev, ok := last[proc]; ok {
					Expect(n).To(BeNumerically(">", prev), "process %s answered request %d after %d", proc, n, prev)
				}
				last[proc] = n
			}
			Logf("reuse: 30 sequential requests, fiber processes and their last request numbers: %v", last)
			d, err := t.Clients.Kube.AppsV1().Deployments(SystemNamespace).Get(ctx, "fiber-router", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(len(last)).To(BeNumerically("<=", int(*d.Spec.Replicas)), "30 sequential requests ran in %d fiber processes: %v", len(last), last)
			most := 0
			for _, n := range last {
				most = max(most, n)
			}
			Expect(most).To(BeNumerically(">", 1), "no fiber served a second request")
			// fiberd says how it carried them: tunnels, joined in the
			// kernel where BPF sockmaps are allowed.
			pods, err := e2eutil.HomePods(ctx, t.Clients, t.Namespace, "reuse-00001")
			Expect(err).NotTo(HaveOccurred())
			Expect(pods.Items).NotTo(BeEmpty())
			var splice []string
			for _, pod := range pods.Items {
				logs, err := t.Clients.Kube.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "fiberd"}).DoRaw(ctx)
				Expect(err).NotTo(HaveOccurred())
				for _, line := range strings.Split(string(logs), "\n") {
					if strings.Contains(line, "tunnels are spliced in the kernel") || strings.Contains(line, "tunnels copy bytes in user space") {
						splice = append(splice, pod.Name+": "+line)
					}
				}
			}
			Expect(splice).NotTo(BeEmpty(), "fiberd logs no tunnel: reuse-mode requests did not take the tunnel path")
			Logf("fiberd: %s", strings.Join(splice, "; "))
			By("idling longer than idleTimeout (4s): the fibers are released")
			time.Sleep(10 * time.Second)
			proc, n, err := state(ctx, t, "reuse")
			Expect(err).NotTo(HaveOccurred())
			Expect(last).NotTo(HaveKey(proc), "a fiber idle for more than idleTimeout served again")
			Expect(n).To(Equal(1))
		},
	}
}

// killPods deletes, with no grace, every Pod of the system namespace
// matching selector.
func killPods(ctx context.Context, t *T, selector string) {
	pods, err := t.Clients.Kube.CoreV1().Pods(SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	Expect(err).NotTo(HaveOccurred())
	Expect(pods.Items).NotTo(BeEmpty(), selector)
	zero := int64(0)
	for _, p := range pods.Items {
		Expect(t.Clients.Kube.CoreV1().Pods(SystemNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})).To(Succeed())
	}
}

func restarts() []Test {
	out := []Test{controllerChurn()}
	for _, comp := range []struct{ label, what string }{
		{"app=lampyr-grant-controller", "the grant controller"},
		{"app=fiber-router", "fiber-router"},
	} {
		svc := "restart-" + strings.TrimPrefix(strings.TrimPrefix(comp.label, "app="), "lampyr-")
		out = append(out, Test{
			Name: svc, Feature: FeatureRestart, Labels: []string{LabelRestart},
			Description: "makes a Service Ready and serves it while " + comp.what + " is killed mid-operation",
			Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{t.Service(ctx, svc, nil, nil)}
			},
			Assert: func(ctx context.Context, t *T) {
				killPods(ctx, t, comp.label)
				_, err := t.Clients.WaitReady(ctx, e2eutil.KServices, t.Namespace, svc, 4*time.Minute)
				Expect(err).NotTo(HaveOccurred())
				Eventually(func() (int, error) {
					code, _, _, err := t.Get(ctx, svc, "/")
					return code, err
				}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Equal(200))
			},
		})
	}
	return out
}

// controllerChurn merges conformance/lampyr's "makes a Service Ready and
// serves it while the controller is killed mid-operation" with
// clusters/e2e/lampyr's "converges with no orphans while the controller pod
// is killed 10 times mid-reconcile".
func controllerChurn() Test {
	names := []string{"churn-a", "churn-b", "churn-c"}
	return Test{
		Name: "restart-controller", Feature: FeatureRestart, Labels: []string{LabelRestart, LabelFinalization},
		Description: "makes Services Ready, serves them and leaves no orphans while the controller is killed 10 times mid-reconcile",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			var out []*unstructured.Unstructured
			for _, n := range names {
				out = append(out, t.Service(ctx, n, nil, nil))
			}
			return out
		},
		Assert: func(ctx context.Context, t *T) {
			const selector = "app=lampyr-controller"
			for i := range 10 {
				killPods(ctx, t, selector)
				if i == 4 {
					// Half way: delete one Service while the controller is
					// down, so finalization also happens across restarts.
					Expect(t.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(t.Namespace).Delete(ctx, "churn-c", metav1.DeleteOptions{})).To(Succeed())
				}
				// Wait for the replacement to run, then let it work a moment.
				Eventually(func() bool {
					pods, err := t.Clients.Kube.CoreV1().Pods(SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
					if err != nil {
						return false
					}
					for _, p := range pods.Items {
						if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
							return true
						}
					}
					return false
				}).WithTimeout(2*time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(), "kill %d: no replacement controller", i+1)
				time.Sleep(time.Duration(500+300*i) * time.Millisecond)
				Logf("killed the controller pod %d time(s)", i+1)
			}
			for _, n := range names[:2] {
				_, err := t.Clients.WaitReady(ctx, e2eutil.KServices, t.Namespace, n, 4*time.Minute)
				Expect(err).NotTo(HaveOccurred())
				Eventually(func() (int, error) {
					code, _, _, err := t.Get(ctx, n, "/")
					return code, err
				}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal(200), "Service %s through the gateway", n)
			}
			By("deleting every Service: nothing Lampyr made may remain")
			deleteServices(ctx, t)
			Eventually(func() []string { return t.Leftovers(ctx) }).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeEmpty(), "orphans after deleting every Service")
		},
	}
}

func deleteServices(ctx context.Context, t *T) int {
	svcs, err := t.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(t.Namespace).List(ctx, metav1.ListOptions{})
	Expect(err).NotTo(HaveOccurred())
	for _, s := range svcs.Items {
		Expect(t.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(t.Namespace).Delete(ctx, s.GetName(), metav1.DeleteOptions{})).To(Succeed())
	}
	return len(svcs.Items)
}

func rotation() Test {
	return Test{
		Name: "key-rotation", Feature: FeatureKeyRotation, Labels: []string{LabelKeys, LabelRestart},
		Description: "keeps a Revision sealed to the old key running through a Home restart, and runs new ones sealed to the new key",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{t.Service(ctx, "rotated", nil, nil)}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "rotated", 4*time.Minute)
			rot, err := ly.RotateFleetKey(ctx, t.Ly)
			Expect(err).NotTo(HaveOccurred())
			Logf("fleet key rotated: %s -> %s (old key kept as %s)", rot.OldKeyID[:16], rot.NewKeyID[:16], rot.RetiredAs)
			Eventually(func() (string, error) {
				in, err := t.Ly.Describe(ctx)
				if err != nil {
					return "", err
				}
				t.Inst = in
				return in.FleetKeyID, nil
			}).WithTimeout(time.Minute).Should(Equal(rot.NewKeyID), "the published fleet key follows the rotation")

			By("restarting the Home: the grant controller must open the template sealed to the retired key again")
			homes, err := e2eutil.HomePods(ctx, t.Clients, t.Namespace, "rotated-00001")
			Expect(err).NotTo(HaveOccurred())
			Expect(homes.Items).NotTo(BeEmpty())
			old := map[string]bool{}
			zero := int64(0)
			for _, p := range homes.Items {
				old[string(p.UID)] = true
				Expect(t.Clients.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})).To(Succeed())
			}
			Eventually(func() (string, error) {
				pods, err := e2eutil.HomePods(ctx, t.Clients, t.Namespace, "rotated-00001")
				if err != nil {
					return "", err
				}
				for _, p := range pods.Items {
					if old[string(p.UID)] {
						return "old Home " + p.Name + " still there", nil
					}
					for _, cond := range p.Status.Conditions {
						if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
							return "new Home ready", nil
						}
					}
				}
				return fmt.Sprintf("%d Home Pods, none new and ready", len(pods.Items)), nil
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal("new Home ready"), "a new Home for the Revision sealed to the retired key")
			Eventually(func() (int, error) {
				code, _, _, err := t.Get(ctx, "rotated", "/")
				return code, err
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal(200), "the Revision sealed to the retired key serves again after its Home restarted")
			s, r, m, err := t.Condition(ctx, "rotated-00001", "Ready")
			Expect(err).NotTo(HaveOccurred())
			Expect(s).To(Equal("True"), "Ready %s: %s", r, m)

			By("deploying a new Service: its template is sealed to the new key")
			t.DeployReady(ctx, t.Service(ctx, "after-rotation", nil, nil))
		},
	}
}

// finalization no longer depends on what earlier tests left: it makes its
// own Ready, refused and over-limit Services, checks Lampyr made something
// for them, deletes them, and wants nothing left.
func finalization() Test {
	return Test{
		Name: "finalization", Feature: FeatureFinalization, Labels: []string{LabelFinalization, LabelTenancy},
		Description: "deleting every Service removes everything Lampyr made for their Revisions",
		Manifests: func(ctx context.Context, t *T) []*unstructured.Unstructured {
			over := maxMemoryPerFiber(ctx, t)
			over.Add(resource.MustParse("1Gi"))
			return []*unstructured.Unstructured{
				t.Service(ctx, "served", nil, nil),
				t.Service(ctx, "reused", func(p *ly.Project) {
					p.Execution = ly.Execution{Mode: "reuse", IdleTimeout: "60s", IdleAction: "release"}
				}, nil),
				t.Service(ctx, "refused", nil, func(ts, _ map[string]any) { container(ts)["command"] = []any{"/handler"} }),
				t.Service(ctx, "over-limit", func(p *ly.Project) { p.Memory = over.String() }, nil),
			}
		},
		Assert: func(ctx context.Context, t *T) {
			t.WaitServing(ctx, "served", 4*time.Minute)
			t.WaitServing(ctx, "reused", 4*time.Minute)
			t.WaitCondition(ctx, "refused-00001", "Ready", "False", 2*time.Minute)
			t.WaitCondition(ctx, "over-limit-00001", "ResourcesAvailable", "False", 2*time.Minute)
			before := t.Leftovers(ctx)
			Logf("before deleting: %v", before)
			for _, want := range []string{"CapacityGrant/served-00001", "CapacityGrant/reused-00001", "Service/served-00001", "ConfigMap/" + contract.SystemNamespace + "/" + e2eutil.RouterMetadataName(t.Namespace, "served-00001")} {
				Expect(before).To(ContainElement(want), "what Lampyr makes for a Ready Revision")
			}
			Expect(before).To(ContainElement(HavePrefix("Pod/"+contract.HomesNamespace+"/")), "a Home")
			n := deleteServices(ctx, t)
			Eventually(func() []string { return t.Leftovers(ctx) }).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeEmpty(), "left after deleting %d Services", n)
		},
	}
}
