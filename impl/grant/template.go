package grant

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/trust/seal"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// TemplateFetcher fetches a sealed template by its digest-pinned reference.
type TemplateFetcher interface {
	Fetch(ctx context.Context, ref string, opts ...remote.Option) ([]byte, error)
}

// RegistryTemplates fetches templates from their registry (verifying the
// artifact's digests).
type RegistryTemplates struct{}

// Fetch implements TemplateFetcher.
func (RegistryTemplates) Fetch(ctx context.Context, ref string, opts ...remote.Option) ([]byte, error) {
	b, _, err := artifact.FetchTemplate(ctx, ref, opts...)
	return b, err
}

// templateRetry is when a grant whose template could not be fetched is
// looked at again.
const templateRetry = 10 * time.Second

// templateBlobs remembers fetched templates by digest-pinned reference (the
// bytes behind a digest never change), so renewals and restarts of the
// reconcile loop do not ask the registry again. Bounded: templates are a
// few hundred bytes, and a full cache is simply cleared.
type templateBlobs struct {
	mu sync.Mutex
	m  map[string][]byte
}

const maxCachedTemplates = 4096

func (c *templateBlobs) get(ref string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[ref]
	return b, ok
}

func (c *templateBlobs) put(ref string, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedTemplates {
		c.m = map[string][]byte{}
	}
	c.m[ref] = b
}

// templateRefusal is why a grant's template cannot run, as a condition.
type templateRefusal struct {
	reason  contract.Reason
	message string
	// retry: the cause may go away by itself (the registry answers again).
	retry bool
}

// openTemplate fetches, authenticates, opens and checks g's template
// against g (docs/security.md §2) and returns what the Home needs of it.
func (r *Reconciler) openTemplate(ctx context.Context, g *v1alpha1.CapacityGrant, fleet []*seal.PrivateKey, trust *seal.Trust, opts []remote.Option) (signedgrant.Helper, *templateRefusal) {
	blob, ok := r.blobs.get(g.Spec.Template)
	if !ok {
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		b, err := r.templates.Fetch(fctx, g.Spec.Template, opts...)
		if err != nil {
			return signedgrant.Helper{}, &templateRefusal{contract.ReasonTemplateUnavailable,
				fmt.Sprintf("cannot fetch the sealed template %s: %v", g.Spec.Template, err), true}
		}
		r.blobs.put(g.Spec.Template, b)
		blob = b
	}
	opened, err := seal.Open(fleet, trust, blob)
	if err != nil {
		reason := contract.ReasonTemplateUnsealable
		switch {
		case errors.Is(err, seal.ErrUnsigned), errors.Is(err, seal.ErrUnknownSealer), errors.Is(err, seal.ErrBadSignature):
			reason = contract.ReasonTemplateUnauthenticated
		case errors.Is(err, seal.ErrNotAuthorized):
			reason = contract.ReasonTemplateNotAuthorized
		}
		return signedgrant.Helper{}, &templateRefusal{reason: reason, message: "sealed template " + g.Spec.Template + ": " + err.Error()}
	}
	snap, err := artifact.ParseDigestRef(g.Spec.SnapshotArtifact)
	if err != nil {
		return signedgrant.Helper{}, &templateRefusal{reason: contract.ReasonTemplateMismatch, message: "spec.snapshotArtifact: " + err.Error()}
	}
	want := seal.ExecutionPolicy{Mode: string(g.Spec.Execution.Mode)}
	if g.Spec.Execution.Mode == v1alpha1.ExecutionReuse {
		want.IdleTimeoutSeconds = g.Spec.Execution.IdleTimeoutSeconds
	}
	if err := opened.Matches(g.Namespace, g.Spec.RevisionName, snap.DigestStr(), want); err != nil {
		return signedgrant.Helper{}, &templateRefusal{reason: contract.ReasonTemplateMismatch, message: err.Error()}
	}
	// The Revision's containerPort and port name decide PORT and the
	// protocol, as on stock Knative (the Revision reconciler copies them
	// into the grant); the template's are what the build declared, kept
	// where the grant names none. Neither reaches outside the fiber.
	h := signedgrant.Helper{Port: opened.Helper.Port, Protocol: opened.Helper.Protocol}
	if g.Spec.Port > 0 {
		h.Port = g.Spec.Port
	}
	if g.Spec.Protocol != "" {
		h.Protocol = g.Spec.Protocol
	}
	return h, nil
}

// reconcileTemplate opens and checks g's sealed template. A template that
// cannot be trusted stops the Home (a revoked sealer, a replayed
// template); one the registry cannot give right now keeps a running Home on
// the facts of the grant it already holds for that template, and is asked
// for again shortly.
//
// run says whether the Home may run; when it may not, again says when to
// look again (0: when something changes).
func (r *Reconciler) reconcileTemplate(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) (helper signedgrant.Helper, run bool, again time.Duration, err error) {
	fleetSecret, err := r.fleetSecret()
	if err != nil {
		return helper, false, 0, fmt.Errorf("reading the fleet key Secret %s/%s: %w", r.systemNamespace, contract.FleetKeyName, err)
	}
	fleet, err := r.fleet.keysOf(fleetSecret)
	if err != nil {
		return helper, false, 0, err
	}
	mirrors, err := artifact.ParseMirrors(cfg.HomeRegistryMirrors)
	if err != nil {
		return helper, false, 0, err
	}
	opts := append([]remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}, mirrors.RemoteOptions()...)
	helper, refusal := r.openTemplate(ctx, g, fleet, r.trust(ctx), opts)
	if refusal == nil {
		return helper, true, 0, nil
	}
	if refusal.retry {
		if cur := r.currentGrantOf(g); cur != nil && cur.Template == g.Spec.Template {
			logging.FromContext(ctx).Warnw("Keeping the running Home on its current grant", "grant", g.Namespace+"/"+g.Name, "cause", refusal.message)
			return cur.Helper, true, 0, nil
		}
		g.Status.MarkHomeFailed(refusal.reason, "%s", refusal.message)
		return helper, false, templateRetry, nil
	}
	g.Status.MarkHomeFailed(refusal.reason, "%s", refusal.message)
	return helper, false, 0, r.deleteHome(ctx, g.Namespace, g.Name, "")
}

// trust is who may seal templates: the controller (every namespace) and the
// identities in lampyr-template-sealers. An entry that does not parse is
// left out and logged; the others still count.
func (r *Reconciler) trust(ctx context.Context) *seal.Trust {
	var sealers []seal.TrustedSealer
	if cm, err := r.sealersConfig(); err == nil && cm != nil {
		var perr error
		sealers, perr = seal.ParseSealers(cm.Data)
		if perr != nil {
			logging.FromContext(ctx).Errorw("Ignoring unusable entries of ConfigMap "+contract.SealersConfigMap, "error", perr)
		}
	} else if err != nil && !apierrs.IsNotFound(err) {
		logging.FromContext(ctx).Errorw("Reading ConfigMap "+contract.SealersConfigMap, "error", err)
	}
	sealers = append(sealers, seal.TrustedSealer{Name: contract.ControllerName, Key: r.keys.ControllerSealer, Namespaces: []string{seal.AllNamespaces}})
	return seal.NewTrust(sealers...)
}
