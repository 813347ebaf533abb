package revision

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/seal"
)

// SealRequest is one image-mapped Revision's template to seal.
type SealRequest struct {
	// Namespace is the Lampyr namespace, where the fleet key is published.
	Namespace string
	// RevisionNamespace and Revision name the Revision the template is
	// bound to.
	RevisionNamespace string
	Revision          string
	// Snapshot is the digest-pinned snapshot artifact.
	Snapshot   string
	Execution  fiberdv1alpha1.ExecutionPolicy
	Repository string
	Mirrors    []string
}

// TemplateSealer seals a Revision's fiberd template to the fleet key and
// pushes it, returning the template's digest-pinned reference. It returns an
// *ArtifactMissingError when the registry does not hold the snapshot.
type TemplateSealer interface {
	Seal(ctx context.Context, req SealRequest) (string, error)
}

// RegistrySealer is the TemplateSealer of a running controller: it reads the
// snapshot's config from the registry (not its files), the fleet public key
// from its ConfigMap, seals as `ly deploy` does, signed with the
// controller's sealer key (which the grant controller trusts for every
// namespace), and pushes to the template repository.
type RegistrySealer struct {
	Kube kubernetes.Interface

	mu     sync.Mutex
	sealer *seal.SealerKey
}

// sealerKey reads the controller's sealer key once.
func (s *RegistrySealer) sealerKey(ctx context.Context, ns string) (*seal.SealerKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sealer != nil {
		return s.sealer, nil
	}
	sec, err := s.Kube.CoreV1().Secrets(ns).Get(ctx, contract.ControllerSealerName, metav1.GetOptions{})
	if apierrs.IsNotFound(err) {
		return nil, fmt.Errorf("the controller's sealer key is not created yet (Secret %s/%s): is lampyr-grant-controller running?", ns, contract.ControllerSealerName)
	} else if err != nil {
		return nil, fmt.Errorf("reading the controller's sealer key (Secret %s/%s): %w", ns, contract.ControllerSealerName, err)
	}
	k, err := seal.ParseSealerKeyPEM(sec.Data[contract.PrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("Secret %s/%s key %s: %w", ns, contract.ControllerSealerName, contract.PrivateKeyKey, err)
	}
	s.sealer = k
	return k, nil
}

// Seal implements TemplateSealer.
func (s *RegistrySealer) Seal(ctx context.Context, req SealRequest) (string, error) {
	mirrors, err := artifact.ParseMirrors(req.Mirrors)
	if err != nil {
		return "", err
	}
	opts := append([]remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}, mirrors.RemoteOptions()...)
	cfg, err := artifact.FetchConfig(ctx, req.Snapshot, opts...)
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
			return "", &ArtifactMissingError{Ref: req.Snapshot, Detail: "not found in the registry (config-lampyr image-snapshots maps the image to it)"}
		}
		return "", fmt.Errorf("reading the snapshot artifact %s to seal its template: %w", req.Snapshot, err)
	}
	cm, err := s.Kube.CoreV1().ConfigMaps(req.Namespace).Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
	if apierrs.IsNotFound(err) {
		return "", fmt.Errorf("the fleet public key is not published yet (ConfigMap %s/%s): is lampyr-grant-controller running?", req.Namespace, contract.FleetKeyName)
	} else if err != nil {
		return "", fmt.Errorf("reading the fleet public key: %w", err)
	}
	fleet, err := seal.ParsePublicKeyPEM([]byte(cm.Data[contract.FleetPublicKeyKey]))
	if err != nil {
		return "", fmt.Errorf("ConfigMap %s/%s %s: %w", req.Namespace, contract.FleetKeyName, contract.FleetPublicKeyKey, err)
	}
	sealer, err := s.sealerKey(ctx, req.Namespace)
	if err != nil {
		return "", err
	}
	snap, _ := artifact.ParseDigestRef(req.Snapshot)
	sealed, err := seal.Seal(fleet, sealer, seal.NewTemplate(req.RevisionNamespace, req.Revision, snap.DigestStr(), policyOf(req.Execution), cfg))
	if err != nil {
		return "", err
	}
	ref, err := artifact.PushTemplate(ctx, sealed, req.Repository, req.RevisionNamespace, req.Revision, fleet.KeyID(), opts...)
	if err != nil {
		return "", fmt.Errorf("pushing the sealed template to %s (config-lampyr template-repository; the controller reaches the registry through registry-mirrors or home-registry-mirrors): %w", req.Repository, err)
	}
	return ref.String(), nil
}

// policyOf is the grant's execution policy as a sealed template states it
// (the idle fields only in reuse mode, as impl/ly.Project.Policy writes them).
func policyOf(e fiberdv1alpha1.ExecutionPolicy) seal.ExecutionPolicy {
	p := seal.ExecutionPolicy{Mode: string(e.Mode)}
	if e.Mode == fiberdv1alpha1.ExecutionReuse {
		p.IdleTimeoutSeconds = e.IdleTimeoutSeconds
		p.IdleAction = string(e.IdleAction)
	}
	return p
}

// sealedTemplates remembers templates sealed by this process until the
// grant that records them is in the informer cache, so a re-reconcile in
// between does not seal (and push) a second, different template.
type sealedTemplates struct {
	mu sync.Mutex
	m  map[string]string
}

func (c *sealedTemplates) key(rev *v1.Revision, req SealRequest) string {
	return fmt.Sprintf("%s/%s/%s/%s/%s/%s/%d", rev.UID, req.RevisionNamespace, req.Revision, req.Snapshot, req.Repository, req.Execution.Mode, req.Execution.IdleTimeoutSeconds)
}

func (c *sealedTemplates) get(k string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *sealedTemplates) put(k, v string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]string{}
	}
	c.m[k] = v
}

func (c *sealedTemplates) forget(rev *v1.Revision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	prefix := string(rev.UID) + "/"
	for k := range c.m {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			delete(c.m, k)
		}
	}
}
