package revision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"k8s.io/apimachinery/pkg/types"

	"lampyr.dev/serving/impl/internal/fetchq"
)

// TestRegistryVerifier runs the real verifier against an in-process OCI
// registry: a pushed artifact verifies, an unknown digest is missing, and a
// dead registry is a retryable error, not a missing artifact.
func TestRegistryVerifier(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(host + "/hello-snapshot:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	present := host + "/hello-snapshot@" + d.String()
	absent := host + "/hello-snapshot@sha256:" + strings.Repeat("0", 64)

	v := &RegistryVerifier{}
	ctx := context.Background()
	if err := v.Verify(ctx, present); err != nil {
		t.Errorf("Verify(present) = %v", err)
	}
	var missing *ArtifactMissingError
	if err := v.Verify(ctx, absent); !errors.As(err, &missing) {
		t.Errorf("Verify(absent) = %v, want ArtifactMissingError", err)
	}

	// Once verified, a digest is never looked up again (digests are immutable).
	srv.Close()
	if err := v.Verify(ctx, present); err != nil {
		t.Errorf("Verify(present) after the registry went away = %v, want the cached success", err)
	}
	err = v.Verify(ctx, absent)
	if err == nil || errors.As(err, &missing) {
		t.Errorf("Verify against a dead registry = %v, want a retryable error", err)
	}
}

// TestArtifactChecksATarpitDelaysOnlyItsNamespace runs the controller's
// artifact checks (NewArtifactChecks over the real RegistryVerifier)
// against two in-process registries: namespace "tarpit" names one that
// accepts connections and never answers, namespace "good" a real one. The
// good namespace's Revision is verified at once, while the tarpit holds at
// most one request at a time and each of its checks ends at the timeout.
func TestArtifactChecksATarpitDelaysOnlyItsNamespace(t *testing.T) {
	good := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(good.Close)
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	goodHost := strings.TrimPrefix(good.URL, "http://")
	tag, _ := name.NewTag(goodHost + "/hello-snapshot:v1")
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	present := goodHost + "/hello-snapshot@" + d.String()
	absent := goodHost + "/hello-snapshot@sha256:" + strings.Repeat("0", 64)

	var inFlight, most atomic.Int32
	hung := make(chan struct{})
	tarpit := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-r.Context().Done():
		case <-hung:
		}
	}))
	t.Cleanup(tarpit.Close)
	t.Cleanup(func() { close(hung) })
	tarpitHost := strings.TrimPrefix(tarpit.URL, "http://")

	enqueued := make(chan types.NamespacedName, 16)
	const timeout = 400 * time.Millisecond
	checks := NewArtifactChecks(t.Context(), &RegistryVerifier{}, func(k types.NamespacedName) { enqueued <- k },
		fetchq.Options{Timeout: timeout, Backoff: time.Minute})

	start := time.Now()
	var tarpitRevs []types.NamespacedName
	for i := range 3 {
		rev := types.NamespacedName{Namespace: "tarpit", Name: fmt.Sprintf("hog-%05d", i)}
		tarpitRevs = append(tarpitRevs, rev)
		if r := checks.Get(rev, fmt.Sprintf("%s/snap@sha256:%064d", tarpitHost, i)); r.State != fetchq.Pending {
			t.Fatalf("tarpit check %d: %+v, want Pending", i, r)
		}
	}
	goodRev := types.NamespacedName{Namespace: "good", Name: "hello-00001"}
	missingRev := types.NamespacedName{Namespace: "good", Name: "hello-00002"}
	checks.Get(goodRev, present)
	checks.Get(missingRev, absent)

	// The good namespace's Revisions are re-enqueued long before the
	// tarpit's first timeout.
	waitFor := func(want types.NamespacedName, within time.Duration) time.Duration {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case got := <-enqueued:
				if got == want {
					return time.Since(start)
				}
			case <-deadline:
				t.Fatalf("%s was not re-enqueued within %s", want, within)
			}
		}
	}
	took := waitFor(goodRev, timeout/2)
	if r := checks.Get(goodRev, present); r.State != fetchq.Done {
		t.Fatalf("the good namespace's artifact after %s: %+v, want Done", took, r)
	}
	waitFor(missingRev, timeout/2)
	var missing *ArtifactMissingError
	if r := checks.Get(missingRev, absent); r.State != fetchq.Failed || !errors.As(r.Err, &missing) {
		t.Fatalf("the good namespace's absent artifact: %+v, want Failed with ArtifactMissingError", r)
	}
	t.Logf("good namespace verified in %s beside a tarpit", took)

	// The tarpit's checks end one after the other, each at the timeout.
	for i, rev := range tarpitRevs {
		at := waitFor(rev, 3*timeout)
		r := checks.Get(rev, fmt.Sprintf("%s/snap@sha256:%064d", tarpitHost, i))
		var te *fetchq.TimeoutError
		if r.State != fetchq.Failed || !errors.As(r.Err, &te) {
			t.Fatalf("tarpit check %d: %+v, want Failed with a timeout", i, r)
		}
		if min := time.Duration(i+1) * timeout; at < min {
			t.Errorf("tarpit check %d ended after %s, before %s: checks of one namespace ran side by side", i, at, min)
		}
	}
	if m := most.Load(); m != 1 {
		t.Errorf("the tarpit saw %d requests at once, want 1 (one check per namespace)", m)
	}
}
