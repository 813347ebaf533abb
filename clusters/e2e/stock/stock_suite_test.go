// The stock suite proves genuine upstream Knative Serving 1.23 runs offline
// on a Kind cluster built by this project, behind the offline networking
// provider: a digest-pinned helloworld Service answers through the gateway on
// 127.0.0.1, scales to zero and back, splits traffic 50/50 between two
// Revisions, and routes a tagged hostname to its Revision.
package stock

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/networking"
)

var suite = harness.New(harness.Config{
	Name:     "stock",
	Recipe:   "just test-stock",
	Clusters: []harness.Cluster{{Name: clusterName, Profile: clusters.ProfileStock}},
})

func TestStock(t *testing.T) { suite.Run(t) }

var _ = suite.Setup("publishing helloworld and the fixture handler, creating namespace "+ns, setupStock)

const (
	// helloBody is what knative.dev/serving/test/test_images/helloworld answers.
	helloBody   = "Hello World! How about some tasty noodles?\n"
	clusterName = "stock"
	ns          = "demo"
	helloPkg    = "knative.dev/serving/test/test_images/helloworld"
)

// stockRun is the suite's state: the cluster and the images it runs.
type stockRun struct {
	*harness.Target
	hello   string // digest-pinned helloworld image (Knative's test image)
	fixture string // digest-pinned fixtures/cmd/handler image (answers "Hello $TARGET!")
	// provider is the networking provider installed.
	provider networking.Provider
}

// the is the suite's state.
func the() *stockRun { return harness.State[*stockRun](suite) }

func setupStock(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	t, err := harness.TargetFrom(ctx, clusterName)
	if err != nil {
		return ctx, err
	}
	r := &stockRun{Target: t}
	if r.provider, err = networking.Get(t.Provider); err != nil {
		return ctx, err
	}
	env, err := harness.Env(ctx)
	if err != nil {
		return ctx, err
	}
	refs, err := env.Publisher().Publish(ctx, gobuild.Spec{Name: "knative-test-images", Module: knative.ServingModule, Version: knative.ServingVersion, Packages: []string{helloPkg}, LDFlags: "-s -w"},
		[]publish.Image{{Package: helloPkg, Repo: "knative-serving/test/helloworld"}})
	if err != nil {
		return ctx, err
	}
	r.hello = refs[helloPkg]
	if r.fixture, err = harness.Image(ctx, t, "lampyr.dev/serving/fixtures/cmd/handler"); err != nil {
		return ctx, err
	}
	_, err = t.Clients.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return ctx, err
	}
	return harness.With(ctx, r), nil
}

func ksvc(name, image string, annotations map[string]string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "serving.knative.dev/v1", "kind": "Service",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"template": map[string]any{
			"metadata": map[string]any{"annotations": toAny(annotations)},
			"spec":     map[string]any{"containers": []any{map[string]any{"image": image}}},
		}},
	}}
}

func toAny(m map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func applyKsvc(ctx context.Context, u *unstructured.Unstructured) {
	u.SetNamespace(ns)
	Expect(the().Clients.Apply(ctx, e2eutil.KServices, u, "stock-suite")).To(Succeed())
}

func host(name string) string { return name + "." + ns + "." + clusters.Domain }

var _ = Describe("stock Knative Serving on Kind, offline", Label("cluster", "stock"), Ordered, func() {
	It("serves a digest-pinned helloworld through the gateway on 127.0.0.1", Label("routing"), func(ctx SpecContext) {
		Expect(the().hello).To(ContainSubstring("@sha256:"))
		// A short stable window so the scale-to-zero check below takes
		// under a minute; the grace period is upstream's default.
		start := time.Now()
		applyKsvc(ctx, ksvc("hello", the().hello, map[string]string{"autoscaling.knative.dev/window": "6s"}))
		_, err := the().Clients.WaitReady(ctx, e2eutil.KServices, ns, "hello", 3*time.Minute)
		Expect(err).NotTo(HaveOccurred())
		ready := time.Since(start)
		// The first request the moment the Service is Ready: a KIngress
		// implementation that probes the data plane before Ready
		// (gateway-api) must already serve it.
		code, body, _, err := e2eutil.Get(ctx, the().Gateway, host("hello"), "/")
		first := fmt.Sprintf("%d %q", code, strings.TrimSpace(body))
		if err != nil {
			first = err.Error()
		}
		msg := fmt.Sprintf("%s: apply -> Ready %s; first request after Ready: %s", the().provider.Name(), ready.Round(100*time.Millisecond), first)
		AddReportEntry("helloworld apply -> Ready", msg)
		fmt.Fprintln(GinkgoWriter, msg)
		if the().provider.Name() == networking.GatewayAPIName {
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200), "net-gateway-api reported Ready only after probing the data plane, so the first request must be served: %s", msg)
		}
		Eventually(func() (string, error) {
			code, body, _, err := e2eutil.Get(ctx, the().Gateway, host("hello"), "/")
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d: %s", code, body)
			}
			return body, err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(helloBody))
	})

	It("scales to zero and serves the next request from zero", Label("scaling"), func(ctx SpecContext) {
		sel := "serving.knative.dev/service=hello"
		Eventually(func() (int, error) {
			pods, err := the().Clients.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				return -1, err
			}
			return len(pods.Items), nil
		}).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(BeZero(), "pods of hello still exist after the stable window")
		start := time.Now()
		code, body, _, err := e2eutil.Get(ctx, the().Gateway, host("hello"), "/")
		cold := time.Since(start)
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(200), body)
		Expect(body).To(Equal(helloBody))
		AddReportEntry("cold request latency (stock, scale from zero)", cold.String())
		fmt.Fprintf(GinkgoWriter, "cold request latency: %s\n", cold)
	})

	It("splits traffic 50/50 between two Revisions and routes a tag to its Revision", Label("routing", "traffic"), func(ctx SpecContext) {
		split := func(target string) *unstructured.Unstructured {
			u := ksvc("split", the().fixture, nil)
			tmpl := u.Object["spec"].(map[string]any)["template"].(map[string]any)
			tmpl["metadata"].(map[string]any)["name"] = "split-" + target
			tmpl["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["env"] = []any{map[string]any{"name": "TARGET", "value": target}}
			return u
		}
		applyKsvc(ctx, split("a"))
		_, err := the().Clients.WaitReady(ctx, e2eutil.KServices, ns, "split", 3*time.Minute)
		Expect(err).NotTo(HaveOccurred())
		u := split("b")
		u.Object["spec"].(map[string]any)["traffic"] = []any{
			map[string]any{"revisionName": "split-a", "percent": int64(50), "tag": "a"},
			map[string]any{"revisionName": "split-b", "percent": int64(50), "tag": "b"},
		}
		applyKsvc(ctx, u)
		Eventually(func() (bool, error) {
			s, err := the().Clients.WaitReady(ctx, e2eutil.KServices, ns, "split", 3*time.Minute)
			if err != nil {
				return false, err
			}
			traffic, _, _ := unstructured.NestedSlice(s.Object, "status", "traffic")
			return len(traffic) == 2, nil
		}).WithTimeout(3 * time.Minute).Should(BeTrue())
		// Wait until both Revisions have answered once (cold starts).
		Eventually(func() (int, error) {
			seen := map[string]bool{}
			for i := 0; i < 20; i++ {
				_, body, _, err := e2eutil.Get(ctx, the().Gateway, host("split"), "/")
				if err != nil {
					return 0, err
				}
				seen[body] = true
			}
			return len(seen), nil
		}).WithTimeout(2 * time.Minute).Should(Equal(2))
		counts := map[string]int{}
		const n = 200
		for i := 0; i < n; i++ {
			code, body, _, err := e2eutil.Get(ctx, the().Gateway, host("split"), "/")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200), body)
			counts[body]++
		}
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		report := ""
		for _, k := range keys {
			report += fmt.Sprintf("%q=%d ", k, counts[k])
		}
		AddReportEntry("50/50 split over 200 requests", report)
		fmt.Fprintf(GinkgoWriter, "split: %s\n", report)
		for _, want := range []string{"Hello a!\n", "Hello b!\n"} {
			Expect(counts[want]).To(BeNumerically(">=", 70), "split %s", report)
			Expect(counts[want]).To(BeNumerically("<=", 130), "split %s", report)
		}
		for i := 0; i < 20; i++ {
			code, body, _, err := e2eutil.Get(ctx, the().Gateway, "a-split."+ns+".example.com", "/")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200))
			Expect(body).To(Equal("Hello a!\n"), "the tag host a-split must always reach split-a")
		}
	})

	// DomainMapping, measured per provider rather than assumed: the
	// gateway-api provider serves it (Traefik reports the internal Service's
	// ClusterIP as the local Gateway's address, so the Route's placeholder
	// is a headless Service Traefik follows; docs/networking.md); Traefik's
	// Knative provider has no host rewrite and leaves it unserved. Either
	// changing fails here, so docs/networking.md is updated.
	It("measures DomainMapping through the networking layer", Label("routing", "networking-limits"), func(ctx SpecContext) {
		const domain = "hello.example.org"
		cdc := schema.GroupVersionResource{Group: "networking.internal.knative.dev", Version: "v1alpha1", Resource: "clusterdomainclaims"}
		dm := schema.GroupVersionResource{Group: "serving.knative.dev", Version: "v1beta1", Resource: "domainmappings"}
		_, err := the().Clients.Dynamic.Resource(cdc).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "networking.internal.knative.dev/v1alpha1", "kind": "ClusterDomainClaim",
			"metadata": map[string]any{"name": domain}, "spec": map[string]any{"namespace": ns},
		}}, metav1.CreateOptions{})
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			Expect(err).NotTo(HaveOccurred())
		}
		created := time.Now()
		_, err = the().Clients.Dynamic.Resource(dm).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "serving.knative.dev/v1beta1", "kind": "DomainMapping",
			"metadata": map[string]any{"name": domain, "namespace": ns},
			"spec":     map[string]any{"ref": map[string]any{"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "hello"}},
		}}, metav1.CreateOptions{})
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			Expect(err).NotTo(HaveOccurred())
		}
		readiness := ""
		if u, err := the().Clients.WaitReady(ctx, dm, ns, domain, 2*time.Minute); err == nil {
			readiness = "Ready after " + time.Since(created).Round(100*time.Millisecond).String()
		} else {
			st, r, m := "", "", ""
			if u != nil {
				st, r, m = e2eutil.Condition(u, "Ready")
			}
			readiness = fmt.Sprintf("not Ready after 2m (Ready=%s %s: %s)", st, r, m)
		}
		// Bounded sampling: 20 s of requests to the mapped domain.
		codes := map[int]int{}
		var lastBody string
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
			code, body, _, err := e2eutil.Get(ctx, the().Gateway, domain, "/")
			if err != nil {
				codes[-1]++
				continue
			}
			codes[code]++
			lastBody = body
		}
		msg := fmt.Sprintf("%s: DomainMapping %s %s; 20 s of requests through the gateway: status counts %v (last body %q)", the().provider.Name(), domain, readiness, codes, strings.TrimSpace(lastBody))
		AddReportEntry("DomainMapping", msg)
		fmt.Fprintln(GinkgoWriter, msg)
		if the().provider.Name() == networking.GatewayAPIName {
			Expect(codes).To(HaveLen(1), "every request to the mapped domain must answer 200 behind %s\n%s", the().provider.Name(), msg)
			Expect(codes[200]).To(BeNumerically(">", 0), "%s serves DomainMappings (docs/networking.md)\n%s", the().provider.Name(), msg)
			return
		}
		Expect(codes[200]).To(BeZero(), "%s now serves DomainMappings: update docs/networking.md and this expectation\n%s", the().provider.Name(), msg)
	})
})
