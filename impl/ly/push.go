package ly

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// ParseImageTag parses --image: a registry repository with an explicit tag.
func ParseImageTag(image string) (name.Tag, error) {
	if image == "" {
		return name.Tag{}, errors.New("--image is required: REGISTRY/REPOSITORY:TAG, e.g. localhost:5002/demo-app:v1")
	}
	tag, err := name.NewTag(image, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("--image %q: want REGISTRY/REPOSITORY:TAG with an explicit tag, e.g. localhost:5002/demo-app:v1 (%v)", image, err)
	}
	return tag, nil
}

// PushResult says what Push did.
type PushResult struct {
	Ref    name.Digest // repository@digest
	Pushed bool        // false: the registry already had the artifact
}

// Push publishes the artifact under tag only if the registry lacks it, then
// resolves the tag and checks it names the local artifact's digest.
func Push(ctx context.Context, b *Built, tag name.Tag, opts ...remote.Option) (*PushResult, error) {
	opts = append([]remote.Option{remote.WithContext(ctx)}, opts...)
	ref := tag.Context().Digest(b.Digest.String())
	res := &PushResult{Ref: ref}
	_, err := remote.Head(ref, opts...)
	switch {
	case err == nil:
		// Present by digest: make sure the tag points at it (a manifest PUT,
		// no blob is uploaded).
		if err := remote.Tag(tag, b.Image, opts...); err != nil {
			return nil, registryErr(tag.RegistryStr(), "tagging", err)
		}
	case isNotFound(err):
		if err := remote.Write(tag, b.Image, opts...); err != nil {
			return nil, registryErr(tag.RegistryStr(), "pushing", err)
		}
		res.Pushed = true
	default:
		return nil, registryErr(tag.RegistryStr(), "checking", err)
	}
	desc, err := remote.Head(tag, opts...)
	if err != nil {
		return nil, registryErr(tag.RegistryStr(), "resolving "+tag.String(), err)
	}
	if desc.Digest != b.Digest {
		return nil, fmt.Errorf("artifact digest mismatch: %s resolves to %s but the local artifact is %s; another push raced this one, run ly push again", tag, desc.Digest, b.Digest)
	}
	return res, nil
}

func isNotFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
}

func registryErr(registry, what string, err error) error {
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return fmt.Errorf("registry %s unreachable while %s: %w (is it running? for the Kind installation: docker start lampyr-registry)", registry, what, err)
	}
	return fmt.Errorf("registry %s, %s: %w", registry, what, err)
}
