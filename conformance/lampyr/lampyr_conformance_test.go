// Package lampyr is Lampyr's own conformance suite (issue #10 part 1), on a
// real Lampyr cluster: the Revision template subset (every refused field is
// Ready=False naming it; the supported fields reach the CapacityGrant),
// scaling translation (one request per fiber, max-scale caps concurrent
// fibers, timeoutSeconds ends requests, streams and WebSockets), readiness
// conditions, finalization, restart recovery of each Lampyr component, and
// the execution modes.
//
// Managed (default): it brings up the "lampyr" Kind cluster as `just
// cluster-up lampyr` does. Third-party: LAMPYR_CONFORMANCE_KUBECONFIG and
// LAMPYR_CONFORMANCE_GATEWAY (http://host:port of the Knative gateway) name
// an existing Lampyr installation; nothing is created but the suite's
// namespace, its Services and snapshot artifacts (pushed to the
// installation's registry, as `ly deploy` would).
package lampyr

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/gorilla/websocket"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/clusters/progress"
	"lampyr.dev/serving/impl/ly"
)

func TestLampyrConformance(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lampyr-conformance")
}

const (
	ns       = "lampyr-conformance"
	systemNS = "lampyr-system"
)

var (
	// sealer is this machine's ly identity, which signs the templates
	// (authorized by the lampyr install profile).
	sealer   *ly.Sealer
	enabled  = os.Getenv("LAMPYR_E2E") == "1"
	env      *clusters.Env
	c        *e2eutil.Clients
	lc       *ly.Cluster
	inst     *ly.Installation
	gateway  string
	registry string
	created  bool
	project  *ly.Project
	built    *ly.Built
	snap     name.Digest
	cluster  = "lampyr"
)

var _ = BeforeSuite(func(ctx SpecContext) {
	if !enabled {
		Skip("the Lampyr conformance suite needs a real Lampyr cluster: run it with `just test-lampyr-conformance` (sets LAMPYR_E2E=1)")
	}
	kubeconfig := os.Getenv("LAMPYR_CONFORMANCE_KUBECONFIG")
	if kubeconfig != "" {
		gateway = os.Getenv("LAMPYR_CONFORMANCE_GATEWAY")
		Expect(gateway).NotTo(BeEmpty(), "third-party mode: set LAMPYR_CONFORMANCE_GATEWAY to the Knative gateway's http://host:port")
		cluster = kubeconfig
	} else {
		env = clusters.NewEnv(progress.New(GinkgoWriter), environ.Clusters())
		infos, err := env.Up(ctx, []string{cluster}, os.Getenv("LAMPYR_KEEP") == "1")
		Expect(err).NotTo(HaveOccurred())
		created = infos[0].Created
		Expect(env.Install(ctx, infos[0], "lampyr", environ.Provider())).To(Succeed())
		kubeconfig, gateway = infos[0].Kubeconfig, infos[0].GatewayURL()
	}
	var err error
	c, err = e2eutil.NewClients(kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	lc, err = ly.Connect(kubeconfig, "")
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() error { inst, err = lc.Describe(ctx); return err }).WithTimeout(time.Minute).Should(Succeed())
	sealer, err = e2eutil.Sealer()
	Expect(err).NotTo(HaveOccurred())
	registry = inst.Registry
	Expect(c.FreshNamespace(ctx, ns, 3*time.Minute)).To(Succeed())
	// Tenant namespaces on Lampyr enforce Pod Security "restricted": no
	// Lampyr Pod runs in them (docs/security.md).
	Expect(e2eutil.RestrictPodSecurity(ctx, c, ns)).To(Succeed())

	By("building the fixture handler's snapshot artifact (ly build) and pushing it to " + registry)
	dir := filepath.Join(e2eutil.RepoRoot(), "fixtures/cmd/handler")
	project, err = ly.LoadProject(dir)
	Expect(err).NotTo(HaveOccurred())
	built, err = ly.Build(ctx, dir, project, ly.BuildOptions{ArtifactDir: filepath.Join(GinkgoT().TempDir(), "artifact")})
	Expect(err).NotTo(HaveOccurred())
	tag, err := ly.ParseImageTag(registry + "/lampyr-conformance/handler:conformance")
	Expect(err).NotTo(HaveOccurred())
	pushed, err := ly.Push(ctx, built, tag)
	Expect(err).NotTo(HaveOccurred())
	snap = pushed.Ref
}, NodeTimeout(60*time.Minute))

var _ = AfterSuite(func(ctx SpecContext) {
	if c != nil && os.Getenv("LAMPYR_KEEP") != "1" {
		_ = c.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	}
	if env == nil || !created {
		return
	}
	if os.Getenv("LAMPYR_KEEP") == "1" {
		fmt.Fprintf(GinkgoWriter, "LAMPYR_KEEP=1: cluster %s left running (just cluster-down %s)\n", cluster, cluster)
		return
	}
	Expect(env.Manager().Delete(cluster)).To(Succeed())
})

var _ = ReportAfterEach(func(ctx SpecContext, r SpecReport) {
	if r.Failed() && c != nil {
		dir := filepath.Join(environ.ArtifactsDir(), "lampyr-conformance", strings.ReplaceAll(r.LeafNodeText, " ", "_"))
		_ = e2eutil.Dump(ctx, c, dir)
	}
})

// service returns the Service `ly deploy` would apply for svc's first
// Revision: pre changes the project before its template is sealed (the
// execution policy is sealed in), post edits the manifest's template spec
// and annotations after.
func service(ctx context.Context, svc string, pre func(p *ly.Project), post func(tspec, ann map[string]any)) *unstructured.Unstructured {
	p := *project
	p.Name = svc
	// Small grants: the suite keeps a dozen Services at once, and each
	// reserves max-scale x memory of the installation's fiber capacity
	// (8Gi by default); the fixture's own 10 x 128Mi would exhaust it.
	two := int32(2)
	p.MaxScale = &two
	if pre != nil {
		pre(&p)
	}
	tmpl, err := ly.SealTemplate(ctx, inst, sealer.Key, ns, svc+"-00001", snap, built.Config, p.Policy())
	Expect(err).NotTo(HaveOccurred())
	u := ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: snap.String(), Snapshot: snap.String(), Template: tmpl.String(), Public: true})
	if post != nil {
		tspec, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec")
		ann, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "metadata", "annotations")
		if ann == nil {
			ann = map[string]any{}
		}
		post(tspec, ann)
		Expect(unstructured.SetNestedMap(u.Object, tspec, "spec", "template", "spec")).To(Succeed())
		Expect(unstructured.SetNestedMap(u.Object, ann, "spec", "template", "metadata", "annotations")).To(Succeed())
	}
	return u
}

func apply(ctx context.Context, u *unstructured.Unstructured) {
	u.SetNamespace(ns)
	Expect(c.Apply(ctx, e2eutil.KServices, u, "lampyr-conformance")).To(Succeed())
}

func deployReady(ctx context.Context, u *unstructured.Unstructured) {
	apply(ctx, u)
	_, err := c.WaitReady(ctx, e2eutil.KServices, ns, u.GetName(), 4*time.Minute)
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() (int, error) {
		code, _, _, err := e2eutil.Get(ctx, gateway, host(u.GetName()), "/")
		return code, err
	}).WithTimeout(time.Minute).WithPolling(500*time.Millisecond).Should(Equal(200), "Service %s through the gateway", u.GetName())
}

func host(svc string) string { return svc + "." + ns + "." + clusters.Domain }

func container(tspec map[string]any) map[string]any {
	return tspec["containers"].([]any)[0].(map[string]any)
}

// condition reads one condition of a Revision.
func condition(ctx context.Context, rev, typ string) (string, string, string, error) {
	u, err := c.Dynamic.Resource(e2eutil.Revisions).Namespace(ns).Get(ctx, rev, metav1.GetOptions{})
	if err != nil {
		return "", "", "", err
	}
	s, r, m := e2eutil.Condition(u, typ)
	return s, r, m, nil
}

// waitCondition waits for a Revision condition to reach status and returns
// its reason and message.
func waitCondition(ctx context.Context, rev, typ, status string, timeout time.Duration) (string, string) {
	var reason, msg string
	Eventually(func() (string, error) {
		s, r, m, err := condition(ctx, rev, typ)
		reason, msg = r, m
		return s, err
	}).WithTimeout(timeout).WithPolling(500*time.Millisecond).Should(Equal(status), "Revision %s condition %s", rev, typ)
	return reason, msg
}

// timedGet sends one request and returns its status, body and duration.
func timedGet(ctx context.Context, svc, path string) (int, string, time.Duration, error) {
	start := time.Now()
	code, body, _, err := e2eutil.Get(ctx, gateway, host(svc), path)
	return code, body, time.Since(start), err
}

var _ = Describe("Lampyr conformance", Label("cluster", "lampyr", "conformance"), Ordered, ContinueOnFailure, func() {

	Context("template subset", func() {
		type refusal struct {
			name, reason, field string
			post                func(tspec, ann map[string]any)
		}
		other := "localhost:5002/elsewhere@sha256:" + strings.Repeat("e", 64)
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
			{"tag", "UnsupportedImage", "image", func(t, _ map[string]any) {
				container(t)["image"] = registry + "/lampyr-conformance/handler:conformance"
			}},
			{"concurrency", "UnsupportedContainerConcurrency", "containerConcurrency", func(t, _ map[string]any) { t["containerConcurrency"] = int64(0) }},
			{"responsestart", "UnsupportedResponseStartTimeoutSeconds", "responseStartTimeoutSeconds", func(t, _ map[string]any) {
				t["responseStartTimeoutSeconds"] = int64(5)
			}},
			{"minscale", "UnsupportedMinScale", "min-scale", func(_, a map[string]any) { a["autoscaling.knative.dev/min-scale"] = "1" }},
			{"target", "UnsupportedAutoscalingAnnotation", "autoscaling.knative.dev/target", func(_, a map[string]any) {
				a["autoscaling.knative.dev/target"] = "10"
			}},
			{"metric", "UnsupportedAutoscalingMetric", "metric", func(_, a map[string]any) { a["autoscaling.knative.dev/metric"] = "rps" }},
			{"notemplate", "MissingFiberdTemplate", ly.AnnotationFiberdTemplate, func(_, a map[string]any) { delete(a, ly.AnnotationFiberdTemplate) }},
			{"park", "UnsupportedExecutionMode", ly.AnnotationExecutionMode, func(_, a map[string]any) { a[ly.AnnotationExecutionMode] = "park" }},
		} {
			It("refuses "+tc.field+" with Ready=False "+tc.reason+", and creates no grant", func(ctx SpecContext) {
				svc := "refuse-" + tc.name
				apply(ctx, service(ctx, svc, nil, tc.post))
				reason, msg := waitCondition(ctx, svc+"-00001", "Ready", "False", 2*time.Minute)
				fmt.Fprintf(GinkgoWriter, "%s: Ready=False %s: %s\n", svc, reason, msg)
				Expect(reason).To(Equal(tc.reason), "message: %s", msg)
				Expect(msg).To(ContainSubstring(tc.field))
				_, err := c.Dynamic.Resource(ly.GrantResource).Namespace(ns).Get(ctx, svc+"-00001", metav1.GetOptions{})
				Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a refused Revision gets no CapacityGrant")
			})
		}

		It("accepts the supported fields and carries each into the CapacityGrant", func(ctx SpecContext) {
			maxScale, timeout := int32(3), int64(45)
			u := service(ctx, "supported", func(p *ly.Project) {
				p.Memory, p.MaxScale, p.TimeoutSeconds = "96Mi", &maxScale, &timeout
				p.Execution = ly.Execution{Mode: "reuse", IdleTimeout: "20s", IdleAction: "release"}
			}, func(t, _ map[string]any) {
				// The webhook's own default probe, written out, is accepted.
				container(t)["readinessProbe"] = map[string]any{"tcpSocket": map[string]any{}, "successThreshold": int64(1)}
				container(t)["imagePullPolicy"] = "IfNotPresent"
			})
			deployReady(ctx, u)
			g, err := c.Dynamic.Resource(ly.GrantResource).Namespace(ns).Get(ctx, "supported-00001", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			spec := g.Object["spec"].(map[string]any)
			Expect(spec["memoryPerFiber"]).To(Equal("96Mi"))
			Expect(spec["maxFibers"]).To(BeNumerically("==", 3))
			Expect(spec["maxRequestSeconds"]).To(BeNumerically("==", 45))
			Expect(spec["execution"]).To(HaveKeyWithValue("mode", "reuse"))
			Expect(spec["execution"]).To(HaveKeyWithValue("idleTimeoutSeconds", BeNumerically("==", 20)))
			Expect(spec["snapshotArtifact"]).To(Equal(snap.String()))
		})
	})

	Context("scaling translation", func() {
		It("serves one request per fiber and never more than max-scale fibers at once", func(ctx SpecContext) {
			maxScale := int32(2)
			deployReady(ctx, service(ctx, "capped", func(p *ly.Project) { p.MaxScale = &maxScale }, nil))
			// Four 2 s requests on at most two fibers, one request each:
			// at least two rounds. (Without either rule they would all end
			// in about 2 s.)
			const n, sleep = 4, 2 * time.Second
			var wg sync.WaitGroup
			codes := make([]int, n)
			errs := make([]error, n)
			start := time.Now()
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes[i], _, _, errs[i] = timedGet(ctx, "capped", fmt.Sprintf("/sleep?ms=%d", sleep.Milliseconds()))
				}()
			}
			wg.Wait()
			took := time.Since(start)
			fmt.Fprintf(GinkgoWriter, "4 concurrent 2 s requests, max-scale 2: %v, statuses %v, errors %v\n", took, codes, errs)
			Expect(errs).To(HaveEach(BeNil()))
			Expect(codes).To(HaveEach(200))
			Expect(took).To(BeNumerically(">=", 2*sleep), "4 requests finished in %v: more than 2 ran at once", took)
		})

		It("ends a request, a stream and a WebSocket at timeoutSeconds", func(ctx SpecContext) {
			timeout := int64(3)
			deployReady(ctx, service(ctx, "bounded", func(p *ly.Project) { p.TimeoutSeconds = &timeout }, nil))

			code, body, took, err := timedGet(ctx, "bounded", "/sleep?ms=12000")
			fmt.Fprintf(GinkgoWriter, "request sleeping 12 s, timeoutSeconds 3: %d after %v: %q %v\n", code, took, body, err)
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(http.StatusGatewayTimeout))
			Expect(took).To(BeNumerically("<", 9*time.Second))

			// 40 chunks 250 ms apart would take 10 s.
			code, body, took, err = timedGet(ctx, "bounded", "/stream?n=40&delayms=250")
			chunks := strings.Count(body, "chunk-")
			fmt.Fprintf(GinkgoWriter, "10 s stream, timeoutSeconds 3: %d, %d chunks, %v, err %v\n", code, chunks, took, err)
			Expect(chunks).To(BeNumerically(">", 0), "the stream started")
			Expect(chunks).To(BeNumerically("<", 40), "the stream was cut")
			Expect(took).To(BeNumerically("<", 9*time.Second))

			h := http.Header{"Host": []string{host("bounded")}}
			d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
			var conn *websocket.Conn
			Eventually(func() error {
				var err error
				conn, _, err = d.DialContext(ctx, strings.Replace(gateway, "http://", "ws://", 1)+"/ws", h)
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
			fmt.Fprintf(GinkgoWriter, "WebSocket, timeoutSeconds 3: closed after %v: %v\n", closed, err)
			Expect(err).To(HaveOccurred(), "the WebSocket outlived timeoutSeconds")
			Expect(closed).To(BeNumerically("<", 10*time.Second), "closed by the read deadline, not by timeoutSeconds")
		})
	})

	Context("readiness conditions", func() {
		It("is ContainerMissing when the image's mapped snapshot is not in the registry", func(ctx SpecContext) {
			image := registry + "/lampyr-conformance/absent@sha256:" + strings.Repeat("a", 64)
			missing := registry + "/lampyr-conformance/absent-snapshot@sha256:" + strings.Repeat("b", 64)
			Expect(ly.RegisterImageSnapshots(ctx, lc, []*ly.ImageSnapshot{{Image: image, Snapshot: missing}})).To(Succeed())
			DeferCleanup(func(ctx SpecContext) {
				Expect(ly.UnregisterImageSnapshots(ctx, lc, []string{"sha256:" + strings.Repeat("a", 64)})).To(Succeed())
			})
			apply(ctx, service(ctx, "unbuilt", nil, func(t, a map[string]any) {
				delete(a, ly.AnnotationSnapshotArtifact)
				delete(a, ly.AnnotationFiberdTemplate)
				container(t)["image"] = image
			}))
			reason, msg := waitCondition(ctx, "unbuilt-00001", "ContainerHealthy", "False", 2*time.Minute)
			fmt.Fprintf(GinkgoWriter, "unbuilt: ContainerHealthy=False %s: %s\n", reason, msg)
			Expect(reason).To(Equal("ContainerMissing"))
			Expect(msg).To(ContainSubstring(missing))
			s, _, _, err := condition(ctx, "unbuilt-00001", "Ready")
			Expect(err).NotTo(HaveOccurred())
			Expect(s).To(Equal("False"))
		})

		It("runs an image-only Service whose image is mapped to a snapshot (the controller seals its template)", func(ctx SpecContext) {
			img := registry + "/lampyr-conformance/handler-image@" + snap.DigestStr()
			Expect(ly.RegisterImageSnapshots(ctx, lc, []*ly.ImageSnapshot{{Image: img, Snapshot: snap.String()}})).To(Succeed())
			DeferCleanup(func(ctx SpecContext) {
				Expect(ly.UnregisterImageSnapshots(ctx, lc, []string{snap.DigestStr()})).To(Succeed())
			})
			deployReady(ctx, service(ctx, "imageonly", nil, func(t, a map[string]any) {
				delete(a, ly.AnnotationSnapshotArtifact)
				delete(a, ly.AnnotationFiberdTemplate)
				container(t)["image"] = img
			}))
			g, err := c.Dynamic.Resource(ly.GrantResource).Namespace(ns).Get(ctx, "imageonly-00001", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			tmpl, _, _ := unstructured.NestedString(g.Object, "spec", "template")
			Expect(tmpl).To(HavePrefix(inst.TemplateRepository+"@sha256:"), "the template the controller sealed and pushed")
		})

		It("keeps a refused grant's Revision not Ready with ResourcesAvailable=False naming the limit", func(ctx SpecContext) {
			apply(ctx, service(ctx, "too-big", func(p *ly.Project) { p.Memory = "3Gi" }, nil))
			reason, msg := waitCondition(ctx, "too-big-00001", "ResourcesAvailable", "False", 2*time.Minute)
			fmt.Fprintf(GinkgoWriter, "too-big: ResourcesAvailable=False %s: %s\n", reason, msg)
			Expect(msg).To(ContainSubstring("max-memory-per-fiber"))
			s, _, _, err := condition(ctx, "too-big-00001", "Ready")
			Expect(err).NotTo(HaveOccurred())
			Expect(s).To(Equal("False"))
		})

		It("keeps a Revision whose Home cannot load its template not Ready, with the Home's reason", func(ctx SpecContext) {
			// Sealed for another Revision: fiberd refuses it (TemplateMismatch).
			p := *project
			p.Name = "homeless"
			two := int32(2)
			p.MaxScale = &two
			tmpl, err := ly.SealTemplate(ctx, inst, sealer.Key, ns, "someone-else-00001", snap, built.Config, p.Policy())
			Expect(err).NotTo(HaveOccurred())
			apply(ctx, ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: snap.String(), Snapshot: snap.String(), Template: tmpl.String(), Public: true}))
			var reason, msg string
			Eventually(func() (string, error) {
				s, r, m, err := condition(ctx, "homeless-00001", "ContainerHealthy")
				reason, msg = r, m
				return s + "/" + r, err
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal("False/TemplateMismatch"), "fiberd's own reason, through the grant")
			fmt.Fprintf(GinkgoWriter, "homeless: ContainerHealthy=False %s: %s\n", reason, msg)
			Expect(msg).To(ContainSubstring(`sealed for Revision "someone-else-00001"`))
			Consistently(func() (string, error) {
				s, _, _, err := condition(ctx, "homeless-00001", "Ready")
				return s, err
			}).WithTimeout(20 * time.Second).WithPolling(2 * time.Second).ShouldNot(Equal("True"))
		})

		It("restores a deleted backend Service and router metadata, and serves again", func(ctx SpecContext) {
			deployReady(ctx, service(ctx, "mended", nil, nil))
			rev := "mended-00001"
			zero := int64(0)
			Expect(c.Kube.CoreV1().Services(ns).Delete(ctx, rev, metav1.DeleteOptions{GracePeriodSeconds: &zero})).To(Succeed())
			Expect(c.Kube.CoreV1().ConfigMaps(e2eutil.LampyrSystemNamespace).Delete(ctx, e2eutil.RouterMetadataName(ns, rev), metav1.DeleteOptions{})).To(Succeed())
			Eventually(func() error {
				if _, err := c.Kube.CoreV1().Services(ns).Get(ctx, rev, metav1.GetOptions{}); err != nil {
					return err
				}
				_, err := c.Kube.CoreV1().ConfigMaps(e2eutil.LampyrSystemNamespace).Get(ctx, e2eutil.RouterMetadataName(ns, rev), metav1.GetOptions{})
				return err
			}).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
			_, err := c.WaitReady(ctx, e2eutil.KServices, ns, "mended", 2*time.Minute)
			Expect(err).NotTo(HaveOccurred())
			Eventually(func() (int, error) {
				code, _, _, err := e2eutil.Get(ctx, gateway, host("mended"), "/")
				return code, err
			}).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Equal(200))
		})
	})

	Context("execution modes", func() {
		// /state answers "<process instance> <requests it served>".
		state := func(ctx context.Context, svc string) (string, int) {
			code, body, _, err := e2eutil.Get(ctx, gateway, host(svc), "/state")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200), body)
			f := strings.Fields(body)
			Expect(f).To(HaveLen(2), body)
			n, err := strconv.Atoi(f[1])
			Expect(err).NotTo(HaveOccurred())
			return f[0], n
		}

		It("fresh: every request gets a process of its own", func(ctx SpecContext) {
			deployReady(ctx, service(ctx, "fresh", nil, nil))
			seen := map[string]bool{}
			for range 5 {
				inst, n := state(ctx, "fresh")
				Expect(n).To(Equal(1), "fresh fiber %s had served a request before", inst)
				Expect(seen).NotTo(HaveKey(inst))
				seen[inst] = true
			}
		})

		It("reuse: requests share a fiber until it has been idle for idleTimeout", func(ctx SpecContext) {
			deployReady(ctx, service(ctx, "reuse", func(p *ly.Project) {
				p.Execution = ly.Execution{Mode: "reuse", IdleTimeout: "4s", IdleAction: "release"}
			}, nil))
			seen := map[string]int{}
			for range 8 {
				inst, n := state(ctx, "reuse")
				seen[inst] = max(seen[inst], n)
			}
			fmt.Fprintf(GinkgoWriter, "reuse: 8 sequential requests served by %v\n", seen)
			var most int
			for _, n := range seen {
				most = max(most, n)
			}
			Expect(most).To(BeNumerically(">", 1), "no fiber served a second request")
			time.Sleep(10 * time.Second)
			inst, n := state(ctx, "reuse")
			Expect(seen).NotTo(HaveKey(inst), "a fiber idle for more than idleTimeout served again")
			Expect(n).To(Equal(1))
		})
	})

	Context("restart recovery", func() {
		for _, comp := range []struct{ label, what string }{
			{"app=lampyr-controller", "the controller"},
			{"app=lampyr-grant-controller", "the grant controller"},
			{"app=fiber-router", "fiber-router"},
		} {
			It("makes a Service Ready and serves it while "+comp.what+" is killed mid-operation", func(ctx SpecContext) {
				svc := "restart-" + strings.TrimPrefix(strings.TrimPrefix(comp.label, "app="), "lampyr-")
				apply(ctx, service(ctx, svc, nil, nil))
				pods, err := c.Kube.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: comp.label})
				Expect(err).NotTo(HaveOccurred())
				Expect(pods.Items).NotTo(BeEmpty(), comp.label)
				zero := int64(0)
				for _, p := range pods.Items {
					Expect(c.Kube.CoreV1().Pods(systemNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})).To(Succeed())
				}
				_, err = c.WaitReady(ctx, e2eutil.KServices, ns, svc, 4*time.Minute)
				Expect(err).NotTo(HaveOccurred())
				Eventually(func() (int, error) {
					code, _, _, err := e2eutil.Get(ctx, gateway, host(svc), "/")
					return code, err
				}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Equal(200))
			})
		}
	})

	Context("fleet key rotation", func() {
		It("keeps a Revision sealed to the old key running through a Home restart, and runs new ones sealed to the new key", func(ctx SpecContext) {
			deployReady(ctx, service(ctx, "rotated", nil, nil))
			rot, err := ly.RotateFleetKey(ctx, lc)
			Expect(err).NotTo(HaveOccurred())
			fmt.Fprintf(GinkgoWriter, "fleet key rotated: %s -> %s (old key kept as %s)\n", rot.OldKeyID[:16], rot.NewKeyID[:16], rot.RetiredAs)
			Eventually(func() (string, error) {
				in, err := lc.Describe(ctx)
				if err != nil {
					return "", err
				}
				inst = in
				return in.FleetKeyID, nil
			}).WithTimeout(time.Minute).Should(Equal(rot.NewKeyID), "the published fleet key follows the rotation")

			By("restarting the Home: the grant controller must open the template sealed to the retired key again")
			homes, err := e2eutil.HomePods(ctx, c, ns, "rotated-00001")
			Expect(err).NotTo(HaveOccurred())
			Expect(homes.Items).NotTo(BeEmpty())
			old := map[string]bool{}
			zero := int64(0)
			for _, p := range homes.Items {
				old[string(p.UID)] = true
				Expect(c.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})).To(Succeed())
			}
			Eventually(func() (string, error) {
				pods, err := e2eutil.HomePods(ctx, c, ns, "rotated-00001")
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
				code, _, _, err := e2eutil.Get(ctx, gateway, host("rotated"), "/")
				return code, err
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal(200), "the Revision sealed to the retired key serves again after its Home restarted")
			s, r, m, err := condition(ctx, "rotated-00001", "Ready")
			Expect(err).NotTo(HaveOccurred())
			Expect(s).To(Equal("True"), "Ready %s: %s", r, m)

			By("deploying a new Service: its template is sealed to the new key")
			deployReady(ctx, service(ctx, "after-rotation", nil, nil))
		})
	})

	Context("finalization", func() {
		It("deleting every Service removes everything Lampyr made for their Revisions", func(ctx SpecContext) {
			svcs, err := c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).List(ctx, metav1.ListOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(svcs.Items).NotTo(BeEmpty())
			for _, s := range svcs.Items {
				Expect(c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, s.GetName(), metav1.DeleteOptions{})).To(Succeed())
			}
			Eventually(func() []string { return leftovers(ctx) }).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeEmpty(), "left after deleting %d Services", len(svcs.Items))
		})
	})
})

// leftovers lists what Knative or Lampyr left in the suite's namespace.
func leftovers(ctx context.Context) []string { return e2eutil.Leftovers(ctx, c, ns) }
