package revision

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// ArtifactVerifier checks that a digest-pinned snapshot artifact exists.
// Verify returns an *ArtifactMissingError when the registry says it does
// not, and any other error when it could not tell (retried).
type ArtifactVerifier interface {
	Verify(ctx context.Context, ref string) error
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
