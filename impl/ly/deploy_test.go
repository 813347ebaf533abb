package ly

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingfake "knative.dev/serving/pkg/client/clientset/versioned/fake"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/trust/seal"
)

// TestSealTemplate seals as ly deploy does and opens the pushed template as
// the grant controller does: signed by this ly's identity, bound to the
// namespace, tagged <namespace>.<revision>.
func TestSealTemplate(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	fleet, err := seal.GenerateFleetKey()
	if err != nil {
		t.Fatal(err)
	}
	in := &Installation{TemplateRepository: host + "/lampyr/templates", Registry: host, FleetKeyID: fleet.Public().KeyID(), fleet: fleet.Public()}
	sealer := newSealerKey(t)
	snap, _ := name.NewDigest(host + "/hello@sha256:" + strings.Repeat("c", 64))
	cfg := artifact.Config{Port: 8080, Protocol: "h2c", Runtime: artifact.Runtime{Name: "go"}}
	policy := seal.ExecutionPolicy{Mode: "reuse", IdleTimeoutSeconds: 30, IdleAction: "release"}

	if _, err := SealTemplate(ctx, in, nil, "team-a", "hello-00001", snap, cfg, policy); err == nil || !strings.Contains(err.Error(), "sealer identity") {
		t.Errorf("sealing without a sealer: %v", err)
	}
	ref, err := SealTemplate(ctx, in, sealer, "team-a", "hello-00001", snap, cfg, policy)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(host + "/lampyr/templates:team-a.hello-00001")
	if desc, err := remote.Head(tag); err != nil || desc.Digest.String() != ref.DigestStr() {
		t.Errorf("tag %s: %v %v, want %s", tag, desc, err, ref.DigestStr())
	}
	sealed, tc, err := artifact.FetchTemplate(ctx, ref.String())
	if err != nil {
		t.Fatal(err)
	}
	if tc.Namespace != "team-a" || tc.Revision != "hello-00001" || tc.FleetKeyID != fleet.Public().KeyID() {
		t.Errorf("template config %+v", tc)
	}
	h, err := seal.Inspect(sealed)
	if err != nil || h.SealerKeyID != sealer.KeyID() || h.FleetKeyID != fleet.Public().KeyID() {
		t.Errorf("header %+v %v, want sealer %s", h, err, sealer.KeyID())
	}
	trustFor := func(ns ...string) *seal.Trust {
		return seal.NewTrust(seal.TrustedSealer{Name: "me", Key: sealer.Public(), Namespaces: ns})
	}
	o, err := seal.Open([]*seal.PrivateKey{fleet}, trustFor("team-a"), sealed)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Matches("team-a", "hello-00001", snap.DigestStr(), policy); err != nil || o.Helper.Protocol != "h2c" {
		t.Errorf("opened %+v: %v", o.Template, err)
	}
	if _, err := seal.Open([]*seal.PrivateKey{fleet}, trustFor("team-b"), sealed); !errors.Is(err, seal.ErrNotAuthorized) {
		t.Errorf("opened with a sealer authorized elsewhere: %v, want ErrNotAuthorized", err)
	}
	if _, err := seal.Open([]*seal.PrivateKey{fleet}, seal.NewTrust(), sealed); !errors.Is(err, seal.ErrUnknownSealer) {
		t.Errorf("opened without trusting the sealer: %v, want ErrUnknownSealer", err)
	}
}

func TestDeployNeedsASealer(t *testing.T) {
	_, err := Deploy(context.Background(), &Cluster{}, t.TempDir(), &Project{Name: "hello"}, DeployOptions{}, NewProgress(new(strings.Builder), OutputPlain, nil))
	if err == nil || !strings.Contains(err.Error(), "sealer identity") {
		t.Errorf("Deploy without a sealer: %v", err)
	}
}

// TestWaitServiceStopsOnTemplateRefusal: a refused template ends the wait
// at once, with the fix; any other unhealthy state waits out the timeout.
func TestWaitServiceStopsOnTemplateRefusal(t *testing.T) {
	sealer := &Sealer{Key: newSealerKey(t), Path: filepath.Join(t.TempDir(), "sealer.pem")}
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name         string
		status       corev1.ConditionStatus
		reason       string
		sealer       *Sealer
		wantRefusal  bool
		wantInErrors []string
	}{
		{name: "unauthenticated", status: corev1.ConditionFalse, reason: ReasonTemplateUnauthenticated, sealer: sealer, wantRefusal: true,
			wantInErrors: []string{"TemplateUnauthenticated: the message", "ask an administrator: ly cluster authorize-sealer ", "--public-key " + sealer.PublicKey() + " --namespaces team-a"}},
		{name: "not authorized", status: corev1.ConditionFalse, reason: ReasonTemplateNotAuthorized, sealer: sealer, wantRefusal: true,
			wantInErrors: []string{"not authorized for namespace team-a", "ask an administrator: ly cluster authorize-sealer ", "--public-key " + sealer.PublicKey()}},
		{name: "not authorized, sealer unknown", status: corev1.ConditionFalse, reason: ReasonTemplateNotAuthorized, wantRefusal: true,
			wantInErrors: []string{"--public-key <your public key: ly sealer show>"}},
		{name: "mismatch", status: corev1.ConditionFalse, reason: ReasonTemplateMismatch, wantRefusal: true, wantInErrors: []string{"run ly deploy again"}},
		{name: "unsealable", status: corev1.ConditionFalse, reason: ReasonTemplateUnsealable, wantRefusal: true, wantInErrors: []string{"seal to the current key"}},
		{name: "another failure waits", status: corev1.ConditionFalse, reason: "SnapshotUnavailable", wantInErrors: []string{"not ready after", "SnapshotUnavailable"}},
		{name: "a refusal reason that is not False yet waits", status: corev1.ConditionUnknown, reason: ReasonTemplateMismatch, wantInErrors: []string{"not ready after"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rev := &servingv1.Revision{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "hello-00001"}}
			rev.Status.Conditions = duckv1.Conditions{
				{Type: servingv1.RevisionConditionContainerHealthy, Status: tc.status, Reason: tc.reason, Message: "the message"},
				{Type: apis.ConditionReady, Status: tc.status, Reason: tc.reason},
			}
			svc := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "hello", Generation: 1}}
			svc.Status.ObservedGeneration = 1
			svc.Status.LatestCreatedRevisionName = "hello-00001"
			c := &Cluster{Serving: servingfake.NewSimpleClientset(rev, svc)}
			var details []string
			start := time.Now()
			_, err := WaitService(context.Background(), c, "team-a", "hello", 1, "hello-00001", false, timeout, 10*time.Millisecond, func(f string, a ...any) {
				details = append(details, f)
			})
			var refused *TemplateRefusedError
			if got := errors.As(err, &refused); got != tc.wantRefusal {
				t.Fatalf("WaitService = %v; refusal %v, want %v", err, got, tc.wantRefusal)
			}
			if tc.wantRefusal {
				if el := time.Since(start); el > timeout/2 {
					t.Errorf("a refusal took %s to be reported", el)
				}
				if refused.Reason != tc.reason || refused.Revision != "hello-00001" || refused.Namespace != "team-a" {
					t.Errorf("refusal %+v", refused)
				}
				refused.Sealer = tc.sealer // as Deploy does
			}
			for _, w := range tc.wantInErrors {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if len(details) == 0 {
				t.Error("the Revision's conditions were not reported")
			}
		})
	}
}

// ly deploy builds the artifact when there is none, and uses one already
// built as it is.
func TestEnsureArtifactBuildsWhenMissing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	dir := filepath.Join(t.TempDir(), "hello")
	if _, err := Scaffold(dir, "hello", false); err != nil {
		t.Fatal(err)
	}
	p, err := LoadProject(dir)
	if err != nil {
		t.Fatal(err)
	}
	ad := filepath.Join(dir, ArtifactDir)
	b1, built, err := EnsureArtifact(context.Background(), dir, p, ad)
	if err != nil || !built {
		t.Fatalf("no artifact yet: built %v, err %v; want it built", built, err)
	}
	b2, built, err := EnsureArtifact(context.Background(), dir, p, ad)
	if err != nil || built || b2.Digest != b1.Digest {
		t.Fatalf("artifact present: built %v, err %v, digest %s vs %s; want it loaded as it is", built, err, b2.Digest, b1.Digest)
	}
}
