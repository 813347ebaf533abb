package revision

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
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
