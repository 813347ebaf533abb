package lampyr

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/ly"
)

// Fixture is the fixture handler (fixtures/cmd/handler) built once per run:
// its project, its snapshot artifact in the installation's registry, and
// this machine's ly identity that seals its templates.
type Fixture struct {
	Project *ly.Project
	Built   *ly.Built
	Snap    name.Digest
	Sealer  *ly.Sealer
}

// BuildFixture builds the fixture handler's snapshot artifact (ly build) and
// pushes it to the installation's registry, as `ly deploy` would.
func BuildFixture(ctx context.Context, inst *ly.Installation, artifactDir string) (*Fixture, error) {
	f := &Fixture{}
	var err error
	if f.Sealer, err = e2eutil.Sealer(); err != nil {
		return nil, err
	}
	dir := filepath.Join(e2eutil.RepoRoot(), "fixtures/cmd/handler")
	if f.Project, err = ly.LoadProject(dir); err != nil {
		return nil, err
	}
	if f.Built, err = ly.Build(ctx, dir, f.Project, ly.BuildOptions{ArtifactDir: artifactDir}); err != nil {
		return nil, err
	}
	tag, err := ly.ParseImageTag(inst.Registry + "/lampyr-conformance/handler:conformance")
	if err != nil {
		return nil, err
	}
	pushed, err := ly.Push(ctx, f.Built, tag)
	if err != nil {
		return nil, err
	}
	f.Snap = pushed.Ref
	return f, nil
}

// T is what one test's Manifests and Assert work with: the harness's
// target (clients, gateway, registry, the Lampyr installation and ly's
// connection to it, profile, provider), the fixture, the installation as
// the test started and the test's own namespace.
type T struct {
	*harness.Target
	*Fixture
	// Inst is the installation as described when the test started (a
	// test that rotates the fleet key updates it).
	Inst      *ly.Installation
	Namespace string
}

// NewT prepares a test's namespace (fresh, under Pod Security
// "restricted": no Lampyr Pod runs in a tenant's namespace,
// docs/security.md) and reads the installation.
func NewT(ctx context.Context, tgt *harness.Target, fx *Fixture, test Test) (*T, error) {
	t := &T{Target: tgt, Fixture: fx, Namespace: NamespacePrefix + test.Name}
	var err error
	if t.Inst, err = tgt.Ly.Describe(ctx); err != nil {
		return nil, err
	}
	if err := tgt.Clients.FreshNamespace(ctx, t.Namespace, 3*time.Minute); err != nil {
		return nil, err
	}
	if err := e2eutil.RestrictPodSecurity(ctx, tgt.Clients, t.Namespace); err != nil {
		return nil, err
	}
	return t, nil
}

// Service returns the Service `ly deploy` would apply for svc's first
// Revision: pre changes the project before its template is sealed (the
// execution policy is sealed in), post edits the manifest's template spec
// and annotations after.
func (t *T) Service(ctx context.Context, svc string, pre func(p *ly.Project), post func(tspec, ann map[string]any)) *unstructured.Unstructured {
	p := *t.Project
	p.Name = svc
	// Small grants: each reserves max-scale x memory of the installation's
	// fiber capacity (8Gi by default), and namespaces of finished tests
	// are still being deleted; the fixture's own 10 x 128Mi is more than
	// a test needs.
	two := int32(2)
	p.MaxScale = &two
	if pre != nil {
		pre(&p)
	}
	return t.Manifest(ctx, &p, svc+"-00001", post)
}

// Manifest is Service's manifest for project p with a template sealed for
// Revision rev (another Revision's, to test a mismatch).
func (t *T) Manifest(ctx context.Context, p *ly.Project, rev string, post func(tspec, ann map[string]any)) *unstructured.Unstructured {
	tmpl, err := ly.SealTemplate(ctx, t.Inst, t.Sealer.Key, t.Namespace, rev, t.Snap, t.Built.Config, p.Policy())
	Expect(err).NotTo(HaveOccurred())
	u := ly.ServiceManifest(p, ly.ServiceInputs{Namespace: t.Namespace, Image: t.Snap.String(), Snapshot: t.Snap.String(), Template: tmpl.String(), Public: true})
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

// Apply applies a Knative Service in the test's namespace.
func (t *T) Apply(ctx context.Context, u *unstructured.Unstructured) {
	u.SetNamespace(t.Namespace)
	Expect(t.Clients.Apply(ctx, e2eutil.KServices, u, "lampyr-conformance")).To(Succeed(), "applying Service %s", u.GetName())
}

// DeployReady applies a Service and waits until it is Ready and answers
// through the gateway.
func (t *T) DeployReady(ctx context.Context, u *unstructured.Unstructured) {
	t.Apply(ctx, u)
	t.WaitServing(ctx, u.GetName(), 4*time.Minute)
}

// WaitServing waits until Service svc is Ready and answers 200 through the
// gateway.
func (t *T) WaitServing(ctx context.Context, svc string, ready time.Duration) {
	_, err := t.Clients.WaitReady(ctx, e2eutil.KServices, t.Namespace, svc, ready)
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() (int, error) {
		code, _, _, err := e2eutil.Get(ctx, t.Gateway, t.Host(svc), "/")
		return code, err
	}).WithTimeout(time.Minute).WithPolling(500*time.Millisecond).Should(Equal(200), "Service %s through the gateway", svc)
}

// Host is Service svc's host name.
func (t *T) Host(svc string) string { return svc + "." + t.Namespace + "." + clusters.Domain }

// Get sends one request to Service svc through the gateway and returns its
// status, body and duration.
func (t *T) Get(ctx context.Context, svc, path string) (int, string, time.Duration, error) {
	start := time.Now()
	code, body, _, err := e2eutil.Get(ctx, t.Gateway, t.Host(svc), path)
	return code, body, time.Since(start), err
}

// Condition reads one condition of a Revision.
func (t *T) Condition(ctx context.Context, rev, typ string) (status, reason, message string, err error) {
	u, err := t.Clients.Dynamic.Resource(e2eutil.Revisions).Namespace(t.Namespace).Get(ctx, rev, metav1.GetOptions{})
	if err != nil {
		return "", "", "", err
	}
	s, r, m := e2eutil.Condition(u, typ)
	return s, r, m, nil
}

// WaitCondition waits for a Revision condition to reach status and
// returns its reason and message.
func (t *T) WaitCondition(ctx context.Context, rev, typ, status string, timeout time.Duration) (string, string) {
	var reason, msg string
	Eventually(func() (string, error) {
		s, r, m, err := t.Condition(ctx, rev, typ)
		reason, msg = r, m
		return s, err
	}).WithTimeout(timeout).WithPolling(500*time.Millisecond).Should(Equal(status), "Revision %s condition %s", rev, typ)
	return reason, msg
}

// NetworkingProvider is the networking provider installed: the one the
// harness installed, else (an external installation) the one
// knative-serving/config-network's ingress class names.
func (t *T) NetworkingProvider(ctx context.Context) networking.Provider {
	if t.Provider != "" {
		p, err := networking.Get(t.Provider)
		Expect(err).NotTo(HaveOccurred())
		return p
	}
	p, err := install.InstalledProvider(ctx, t.Clients.Install())
	Expect(err).NotTo(HaveOccurred())
	Expect(p).NotTo(BeNil(), "knative-serving/config-network names no ingress class of a known networking provider (%s)", strings.Join(networking.Names(), ", "))
	return p
}

// Leftovers lists what Knative or Lampyr left for the test's namespace.
func (t *T) Leftovers(ctx context.Context) []string {
	return e2eutil.Leftovers(ctx, t.Clients, t.Namespace)
}

// Logf writes to the spec's output.
func Logf(format string, args ...any) { fmt.Fprintf(GinkgoWriter, format+"\n", args...) }

func container(tspec map[string]any) map[string]any {
	return tspec["containers"].([]any)[0].(map[string]any)
}
