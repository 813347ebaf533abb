package artifact

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Media and artifact types of a sealed-template artifact.
const (
	TemplateArtifactType    = "application/vnd.lampyr.fiberd-template.v1"
	TemplateConfigMediaType = "application/vnd.lampyr.fiberd-template.config.v1+json"
	TemplateLayerMediaType  = "application/vnd.lampyr.fiberd-template.v1.sealed"
)

// TemplateConfig is the clear-text config of a sealed-template artifact:
// only what an operator needs to tell templates apart, never template
// content.
type TemplateConfig struct {
	Namespace  string `json:"namespace,omitempty"`
	Revision   string `json:"revision"`
	FleetKeyID string `json:"fleetKeyID"`
}

// TemplateTag is the tag a Revision's template is pushed under:
// "<namespace>.<revision>" (both DNS labels, so it is a valid tag and two
// namespaces' Revisions of one name never share a tag).
func TemplateTag(namespace, revision string) string { return namespace + "." + revision }

// PushTemplate pushes a sealed template (from seal.Seal) to repository,
// tagged TemplateTag(namespace, revision), and returns its digest-pinned
// reference. The reference, not the tag, is what a Revision names.
func PushTemplate(ctx context.Context, sealed []byte, repository, namespace, revision, fleetKeyID string, opts ...remote.Option) (name.Digest, error) {
	repo, err := name.NewRepository(repository)
	if err != nil {
		return name.Digest{}, fmt.Errorf("template repository %q: %w", repository, err)
	}
	cfg, _ := json.Marshal(TemplateConfig{Namespace: namespace, Revision: revision, FleetKeyID: fleetKeyID})
	img, err := newImage(TemplateArtifactType, TemplateConfigMediaType, cfg, TemplateLayerMediaType, sealed, map[string]string{
		"org.opencontainers.image.title": "lampyr fiberd template " + namespace + "/" + revision,
	})
	if err != nil {
		return name.Digest{}, err
	}
	return Push(ctx, img, repo.Tag(TemplateTag(namespace, revision)).String(), opts...)
}

// FetchTemplate pulls a digest-pinned sealed-template artifact, verifies its
// digests and returns the sealed bytes (open them with seal.Open).
func FetchTemplate(ctx context.Context, ref string, opts ...remote.Option) ([]byte, TemplateConfig, error) {
	var tc TemplateConfig
	d, err := ParseDigestRef(ref)
	if err != nil {
		return nil, tc, err
	}
	// A sealed template is a few KiB: 1 MiB is plenty.
	_, cfg, sealed, err := fetchVerified(ctx, d, TemplateArtifactType, TemplateConfigMediaType, []string{TemplateLayerMediaType}, Limits{LayerBytes: 1 << 20}.withDefaults(), opts)
	if err != nil {
		return nil, tc, err
	}
	if err := json.Unmarshal(cfg, &tc); err != nil {
		return nil, tc, fmt.Errorf("template %s: config: %w", ref, err)
	}
	return sealed, tc, nil
}
