package revision

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"k8s.io/apimachinery/pkg/types"

	"lampyr.dev/serving/impl/internal/fetchq"
)

// ArtifactVerifier checks that a digest-pinned snapshot artifact exists.
// Verify returns an *ArtifactMissingError when the registry says it does
// not, and any other error when it could not tell (retried).
type ArtifactVerifier interface {
	Verify(ctx context.Context, ref string) error
}

// ArtifactChecks answers at once what is known of a Revision's snapshot
// artifact. The registry is the tenant's choice (the annotation names it),
// so the check itself never runs on a reconcile worker: a
// *fetchq.Queue[struct{}] from NewArtifactChecks runs it, one at a time per
// namespace, and re-enqueues the Revision when it ends.
type ArtifactChecks interface {
	Get(rev types.NamespacedName, ref string) fetchq.Result[struct{}]
}

// ArtifactCheckOptions bound the checks: a registry gets 20 s to answer a
// HEAD, and a reference whose check failed (no answer, or not found) is
// checked again after 5 s, doubling to 5 min.
var ArtifactCheckOptions = fetchq.Options{
	Timeout:    20 * time.Second,
	Backoff:    5 * time.Second,
	MaxBackoff: 5 * time.Minute,
}

// NewArtifactChecks runs v's checks off the reconcile workers (see
// ArtifactChecks) and calls enqueue with each Revision that asked once its
// check ends. Successes are kept (a digest names immutable content);
// failures, missing artifacts included, are tried again after a backoff.
func NewArtifactChecks(ctx context.Context, v ArtifactVerifier, enqueue func(types.NamespacedName), o fetchq.Options) *fetchq.Queue[struct{}] {
	return fetchq.New(ctx, func(ctx context.Context, ref string) (struct{}, error) {
		return struct{}{}, v.Verify(ctx, ref)
	}, enqueue, o)
}

// ArtifactMissingError says the registry does not hold the artifact.
type ArtifactMissingError struct {
	Ref    string
	Detail string
}

func (e *ArtifactMissingError) Error() string {
	return fmt.Sprintf("snapshot artifact %q: %s", e.Ref, e.Detail)
}

// RegistryVerifier HEADs the manifest with go-containerregistry. A digest
// names immutable content, so each success is remembered for the life of
// the process and re-reconciles cost nothing.
type RegistryVerifier struct {
	// Options are passed to remote.Head (transport, auth); the default is
	// the default keychain.
	Options []remote.Option

	mu       sync.Mutex
	verified map[string]bool
}

// Verify implements ArtifactVerifier.
func (v *RegistryVerifier) Verify(ctx context.Context, ref string) error {
	v.mu.Lock()
	ok := v.verified[ref]
	v.mu.Unlock()
	if ok {
		return nil
	}
	d, err := name.NewDigest(ref)
	if err != nil {
		return &ArtifactMissingError{Ref: ref, Detail: err.Error()}
	}
	opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, v.Options...)
	desc, err := remote.Head(d, opts...)
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
			return &ArtifactMissingError{Ref: ref, Detail: "not found in the registry"}
		}
		return fmt.Errorf("checking snapshot artifact %q: %w", ref, err)
	}
	if desc.Digest.String() != d.DigestStr() {
		return &ArtifactMissingError{Ref: ref, Detail: fmt.Sprintf("registry returned digest %s", desc.Digest)}
	}
	v.mu.Lock()
	if v.verified == nil {
		v.verified = map[string]bool{}
	}
	v.verified[ref] = true
	v.mu.Unlock()
	return nil
}
