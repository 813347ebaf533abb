package grant

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/internal/fetchq"
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

// SnapshotChecker checks that a snapshot artifact exists and is one (its
// manifest and config), before any capacity is booked for it.
type SnapshotChecker interface {
	Check(ctx context.Context, ref string, opts ...remote.Option) error
}

// RegistrySnapshots checks snapshots in their registry.
type RegistrySnapshots struct{}

// Check implements SnapshotChecker.
func (RegistrySnapshots) Check(ctx context.Context, ref string, opts ...remote.Option) error {
	_, err := artifact.FetchConfig(ctx, ref, opts...)
	return err
}

// Fetches runs the registry reads a grant needs (its sealed template, and
// its snapshot artifact's manifest and config) off the reconcile workers:
// the registry is whatever the tenant's annotations name, and one that
// never answers must delay only that tenant (impl/internal/fetchq: one read
// at a time per namespace, each bounded, failures backed off, answers
// cached by digest). The grant is enqueued again when its read ends.
type Fetches interface {
	Get(grant types.NamespacedName, key string) fetchq.Result[[]byte]
}

// templateRetry is the first wait before a failed read is tried again.
const templateRetry = 5 * time.Second

// FetchOptions bound the template and snapshot reads.
var FetchOptions = fetchq.Options{Timeout: 20 * time.Second, Backoff: templateRetry, MaxBackoff: 5 * time.Minute}

// fetchKey is what a grant's reads are cached by: both digest-pinned
// references (the bytes behind them never change).
func fetchKey(g *v1alpha1.CapacityGrant) string {
	return g.Spec.Template + " " + g.Spec.SnapshotArtifact
}

// NewFetches makes the grant controller's Fetches: the template's bytes,
// once the snapshot checked too. opts gives the registry options (mirrors)
// at the time of each read.
func NewFetches(ctx context.Context, t TemplateFetcher, s SnapshotChecker, opts func() []remote.Option, enqueue func(types.NamespacedName)) *fetchq.Queue[[]byte] {
	return fetchq.New(ctx, func(ctx context.Context, key string) ([]byte, error) {
		tmpl, snap, _ := strings.Cut(key, " ")
		o := opts()
		b, err := t.Fetch(ctx, tmpl, o...)
		if err != nil {
			return nil, fmt.Errorf("the sealed template %s: %w", tmpl, err)
		}
		if err := s.Check(ctx, snap, o...); err != nil {
			return nil, fmt.Errorf("the snapshot artifact %s: %w", snap, err)
		}
		return b, nil
	}, enqueue, FetchOptions)
}

// templateRefusal is why a grant's template cannot run, as a condition.
type templateRefusal struct {
	reason  contract.Reason
	message string
	// retry: the cause may go away by itself (the registry answers again),
	// no earlier than retryAt; pending: the read is under way.
	retry, pending bool
	retryAt        time.Time
}

// openTemplate authenticates, opens and checks g's template against g
// (docs/security.md §2), once it and the snapshot have been read, and
// returns what the Home needs of it.
func (r *Reconciler) openTemplate(g *v1alpha1.CapacityGrant, fleet []*seal.PrivateKey, trust *seal.Trust) (signedgrant.Helper, *templateRefusal) {
	res := r.fetches.Get(types.NamespacedName{Namespace: g.Namespace, Name: g.Name}, fetchKey(g))
	switch res.State {
	case fetchq.Pending:
		msg := fmt.Sprintf("Reading the sealed template %s and the snapshot artifact %s.", g.Spec.Template, g.Spec.SnapshotArtifact)
		if res.Ahead > 0 {
			msg += fmt.Sprintf(" %d reads of this namespace are ahead of it (one at a time per namespace).", res.Ahead)
		}
		return signedgrant.Helper{}, &templateRefusal{reason: contract.ReasonTemplatePending, message: msg, retry: true, pending: true}
	case fetchq.Failed:
		return signedgrant.Helper{}, &templateRefusal{reason: contract.ReasonTemplateUnavailable,
			message: fmt.Sprintf("cannot read %v", res.Err), retry: true, retryAt: res.RetryAt}
	}
	blob := res.Value
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
	r.registryOptions.Store(&opts)
	helper, refusal := r.openTemplate(g, fleet, r.trust(ctx))
	if refusal == nil {
		return helper, true, 0, nil
	}
	if refusal.retry {
		// A running Home keeps running (and its grant is renewed) on the
		// facts of the grant it holds for this template while the template
		// is read again: renewals never wait for a registry.
		if cur := r.currentGrantOf(g); cur != nil && cur.Template == g.Spec.Template {
			if !refusal.pending {
				logging.FromContext(ctx).Warnw("Keeping the running Home on its current grant", "grant", g.Namespace+"/"+g.Name, "cause", refusal.message)
			}
			return cur.Helper, true, 0, nil
		}
		if refusal.pending {
			// Enqueued again when the read ends.
			g.Status.MarkHomeNotReady(refusal.reason, "%s", refusal.message)
			return helper, false, 0, nil
		}
		g.Status.MarkHomeFailed(refusal.reason, "%s", refusal.message)
		return helper, false, max(refusal.retryAt.Sub(r.now()), time.Second), nil
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
