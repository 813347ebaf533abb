package ly

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	"knative.dev/pkg/kmeta"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/seal"
)

// FieldManager is ly's server-side apply identity.
const FieldManager = "ly"

// DefaultDeployTimeout is how long deploy waits for the Revision (and its
// grant), the Route and visibility (seed 002: at most 4 minutes).
const DefaultDeployTimeout = 4 * time.Minute

// DeployOptions are ly deploy's flags.
type DeployOptions struct {
	Image       name.Tag
	ArtifactDir string
	Namespace   string
	Traffic     []TrafficTarget
	Timeout     time.Duration
	// Sealer is this ly's identity, which signs the template (LoadSealer).
	Sealer *Sealer
	// Remote options for the registry (tests; mirrors).
	Remote []remote.Option
	// Poll is the status polling interval (default 1s).
	Poll time.Duration
}

// DeployResult is what deploy prints (and --output json carries).
type DeployResult struct {
	Service    string `json:"service"`
	Namespace  string `json:"namespace"`
	Revision   string `json:"revision"`
	URL        string `json:"url"`
	Visibility string `json:"visibility"`
	Snapshot   string `json:"snapshot"`
	Template   string `json:"template"`
	// SealerKeyID is the identity that signed the template.
	SealerKeyID string `json:"sealerKeyID"`
	Pushed      bool   `json:"pushed"`
}

// NextRevisionName is the name Knative's Configuration reconciler will give
// the Service's next Revision: <config>-<generation, 5 digits>
// (knative.dev/serving pkg/reconciler/configuration/resources/revision.go).
func NextRevisionName(ctx context.Context, c *Cluster, ns, service string) (string, error) {
	cfg, err := c.Serving.ServingV1().Configurations(ns).Get(ctx, service, metav1.GetOptions{})
	gen := int64(1)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return "", err
	default:
		gen = cfg.Generation + 1
	}
	return kmeta.ChildName(service, fmt.Sprintf("-%05d", gen)), nil
}

// SealTemplate seals the fiberd template of namespace/revision for a
// snapshot to the installation's fleet key, signed by sealer (this ly's
// identity, which the cluster must authorize for namespace), and pushes it
// to the template repository tagged <namespace>.<revision>; it returns the
// digest reference.
func SealTemplate(ctx context.Context, in *Installation, sealer *seal.SealerKey, namespace, revision string, snapshot name.Digest, cfg artifact.Config, policy seal.ExecutionPolicy, opts ...remote.Option) (name.Digest, error) {
	sealed, err := seal.Seal(in.fleet, sealer, seal.NewTemplate(namespace, revision, snapshot.DigestStr(), policy, cfg))
	if err != nil {
		return name.Digest{}, err
	}
	ref, err := artifact.PushTemplate(ctx, sealed, in.TemplateRepository, namespace, revision, in.FleetKeyID, opts...)
	if err != nil {
		return name.Digest{}, registryErr(in.Registry, "pushing the template to "+in.TemplateRepository, err)
	}
	return ref, nil
}

// Deploy is `ly deploy`: push if needed, seal the template, apply the
// Service and wait for its Revision, Route and visibility.
func Deploy(ctx context.Context, c *Cluster, dir string, p *Project, o DeployOptions, pr *Progress) (*DeployResult, error) {
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultDeployTimeout
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	if o.Sealer == nil {
		return nil, errors.New("deploying needs a sealer identity to sign the template (ly: --sealer-key, $" + SealerKeyEnv + " or ~/.config/lampyr/sealer.pem)")
	}
	for _, w := range CheckAdapter(dir) {
		pr.Warn("%s", w)
	}
	ws, wsPath, err := FindWorkspace(dir)
	if err != nil {
		return nil, err
	}
	res := &DeployResult{Service: p.Name, Namespace: o.Namespace, Visibility: VisibilityClusterLocal, SealerKeyID: o.Sealer.KeyID()}
	if ws.Public(p.Name) {
		res.Visibility = "external"
	}
	var built *Built
	var pushed *PushResult
	if err := pr.Phase("Artifact verification", func(ph *Phase) (err error) {
		ad := o.ArtifactDir
		if ad == "" {
			ad = dir + "/" + ArtifactDir
		}
		var fresh bool
		if built, fresh, err = EnsureArtifact(ctx, dir, p, ad); err != nil {
			return err
		}
		if fresh {
			ph.Detail("there was no artifact in %s: built it (ly build)", ad)
		}
		ph.Detail("local artifact %s (%s, port %d, %s)", built.Digest, built.Config.Runtime.Name, built.Config.Port, built.Config.Protocol)
		if pushed, err = Push(ctx, built, o.Image, o.Remote...); err != nil {
			return err
		}
		if pushed.Pushed {
			ph.Detail("pushed %s", o.Image)
		} else {
			ph.Detail("registry already has it; %s points at it", o.Image)
		}
		ph.Detail("%s", pushed.Ref)
		return nil
	}); err != nil {
		return nil, err
	}
	res.Snapshot, res.Pushed = pushed.Ref.String(), pushed.Pushed
	var tmpl name.Digest
	if err := pr.Phase("Template sealing", func(ph *Phase) (err error) {
		inst, err := c.Describe(ctx)
		if err != nil {
			return err
		}
		if res.Revision, err = NextRevisionName(ctx, c, o.Namespace, p.Name); err != nil {
			return err
		}
		ph.Detail("revision %s, fleet key %s, sealer %s, execution %s", res.Revision, shortID(inst.FleetKeyID), shortID(o.Sealer.KeyID()), p.Execution.Mode)
		// Only an administrator can read the authorized sealers; when this
		// ly can, a refusal is told now rather than by the grant controller.
		if sr, err := DescribeSealers(ctx, c, o.Sealer); err == nil {
			if ok, known := sr.Authorized(o.Namespace); known && !ok {
				pr.Warn("this ly's sealer identity (key %s) is not authorized for namespace %s in %s/%s: the cluster will refuse the template; run: %s",
					shortID(o.Sealer.KeyID()), o.Namespace, c.LampyrNamespace, contract.SealersConfigMap, o.Sealer.AuthorizeCommand(DefaultSealerName(), o.Namespace))
			}
		}
		if tmpl, err = SealTemplate(ctx, inst, o.Sealer.Key, o.Namespace, res.Revision, pushed.Ref, built.Config, p.Policy(), o.Remote...); err != nil {
			return err
		}
		ph.Detail("%s", tmpl)
		return nil
	}); err != nil {
		return nil, err
	}
	res.Template = tmpl.String()
	err = pr.Phase("Service configuration", func(ph *Phase) error {
		if wsPath == "" {
			ph.Detail("no %s: visibility cluster-local", WorkspaceFile)
		} else {
			ph.Detail("visibility %s (%s)", res.Visibility, wsPath)
		}
		svc := ServiceManifest(p, ServiceInputs{Namespace: o.Namespace, Image: pushed.Ref.String(), Snapshot: pushed.Ref.String(), Template: tmpl.String(), Public: res.Visibility == "external", Traffic: o.Traffic})
		body, err := json.Marshal(svc.Object)
		if err != nil {
			return err
		}
		force := true
		applied, err := c.Serving.ServingV1().Services(o.Namespace).Patch(ctx, p.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
		if err != nil {
			return fmt.Errorf("applying Service %s/%s: %w", o.Namespace, p.Name, err)
		}
		ph.Detail("applied Service %s/%s (generation %d)", o.Namespace, p.Name, applied.Generation)
		url, err := WaitService(ctx, c, o.Namespace, p.Name, applied.Generation, res.Revision, res.Visibility == "external", o.Timeout, o.Poll, ph.Detail)
		res.URL = url
		var refused *TemplateRefusedError
		if errors.As(err, &refused) {
			refused.Sealer = o.Sealer
		}
		return err
	})
	if err != nil {
		return res, err
	}
	return res, nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// WaitService waits until the Service at generation is Ready with revision
// as its latest ready Revision and a URL of the wanted visibility, and
// reports each change of the Revision's and Route's conditions. On timeout
// the error carries the Revision's ResourcesAvailable reason. A template
// the cluster refuses (ContainerHealthy=False for one of TemplateReasons)
// cannot get better by waiting: WaitService returns a *TemplateRefusedError
// at once.
func WaitService(ctx context.Context, c *Cluster, ns, svcName string, gen int64, revision string, public bool, timeout, poll time.Duration, detail func(string, ...any)) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := map[string]string{}
	report := func(key, val string) {
		if last[key] != val {
			last[key] = val
			detail("%s: %s", key, val)
		}
	}
	var lastRev *servingv1.Revision
	for {
		svc, err := c.Serving.ServingV1().Services(ns).Get(ctx, svcName, metav1.GetOptions{})
		if err == nil && svc.Status.ObservedGeneration >= gen {
			if lc := svc.Status.LatestCreatedRevisionName; lc != "" && lc != revision {
				return "", fmt.Errorf("the Service's new Revision is %s, not %s as sealed: it was changed concurrently; run ly deploy again", lc, revision)
			}
		}
		if rev, err := c.Serving.ServingV1().Revisions(ns).Get(ctx, revision, metav1.GetOptions{}); err == nil {
			lastRev = rev
			report("Revision "+revision, conditionsSummary(rev.Status.Conditions, servingv1.RevisionConditionReady, servingv1.RevisionConditionResourcesAvailable, servingv1.RevisionConditionContainerHealthy))
			if ch := rev.Status.GetCondition(servingv1.RevisionConditionContainerHealthy); ch.IsFalse() && slices.Contains(TemplateReasons, ch.Reason) {
				return "", &TemplateRefusedError{Namespace: ns, Revision: revision, Reason: ch.Reason, Message: ch.Message}
			}
		}
		if rt, err := c.Serving.ServingV1().Routes(ns).Get(ctx, svcName, metav1.GetOptions{}); err == nil && rt.Status.ObservedGeneration > 0 {
			report("Route "+svcName, conditionsSummary(rt.Status.Conditions, apis.ConditionReady, servingv1.RouteConditionAllTrafficAssigned, servingv1.RouteConditionIngressReady))
		}
		if err == nil && svc.Status.ObservedGeneration >= gen && svc.IsReady() && svc.Status.URL != nil {
			url := svc.Status.URL.String()
			local := strings.HasSuffix(svc.Status.URL.Host, ".svc.cluster.local") || strings.HasSuffix(svc.Status.URL.Host, ".svc")
			if local != public && svc.Status.LatestReadyRevisionName == revision {
				return url, nil
			}
			report("Service "+svcName, "ready at "+url+", waiting for visibility and Revision "+revision)
		}
		select {
		case <-ctx.Done():
			why := "the Revision was never created"
			if lastRev != nil {
				why = "Revision " + revision + " " + conditionsSummary(lastRev.Status.Conditions, servingv1.RevisionConditionResourcesAvailable, servingv1.RevisionConditionContainerHealthy)
			}
			return "", fmt.Errorf("not ready after %s: %s", timeout, why)
		case <-time.After(poll):
		}
	}
}

// Reasons of a Revision's ContainerHealthy=False when the grant controller
// refuses its sealed template (docs/security.md §2; defined for the
// CapacityGrant in impl/apis/fiberd/v1alpha1 and copied to the Revision).
const (
	ReasonTemplateUnauthenticated = "TemplateUnauthenticated"
	ReasonTemplateNotAuthorized   = "TemplateNotAuthorized"
	ReasonTemplateMismatch        = "TemplateMismatch"
	ReasonTemplateUnsealable      = "TemplateUnsealable"
)

// TemplateReasons are the terminal template refusals WaitService stops on.
var TemplateReasons = []string{ReasonTemplateUnauthenticated, ReasonTemplateNotAuthorized, ReasonTemplateMismatch, ReasonTemplateUnsealable}

// TemplateRefusedError is a Revision whose sealed template the cluster
// refused; its message says what to do.
type TemplateRefusedError struct {
	Namespace, Revision string
	Reason, Message     string
	// Sealer is the identity that sealed the template, for the exact
	// authorize-sealer command; nil: a placeholder is printed.
	Sealer *Sealer
}

func (e *TemplateRefusedError) Error() string {
	msg := fmt.Sprintf("the cluster refused the template of Revision %s/%s: %s: %s", e.Namespace, e.Revision, e.Reason, e.Message)
	return msg + "; " + e.Fix()
}

// Fix is what to do about the refusal.
func (e *TemplateRefusedError) Fix() string {
	key, id := "<your public key: ly sealer show>", ""
	if e.Sealer != nil {
		key, id = e.Sealer.PublicKey(), " (key "+shortID(e.Sealer.KeyID())+")"
	}
	cmd := fmt.Sprintf("ly cluster authorize-sealer %s --public-key %s --namespaces %s", DefaultSealerName(), key, e.Namespace)
	switch e.Reason {
	case ReasonTemplateUnauthenticated:
		return fmt.Sprintf("this ly's sealer identity%s is not one the cluster trusts: ask an administrator: %s; then run ly deploy again", id, cmd)
	case ReasonTemplateNotAuthorized:
		return fmt.Sprintf("this ly's sealer identity%s is not authorized for namespace %s: ask an administrator: %s (listing its other namespaces too); then run ly deploy again", id, e.Namespace, cmd)
	case ReasonTemplateMismatch:
		return "the template does not fit the Revision it is attached to (the message names the difference): run ly deploy again; if it recurs, something else changes the Service concurrently"
	case ReasonTemplateUnsealable:
		return "no fleet key of the cluster opens the template (sealed to another cluster's or a deleted fleet key, or altered): run ly deploy again to seal to the current key (ly cluster describe shows its id)"
	}
	return "see ly event " + e.Revision
}

func conditionsSummary(cs duckConditions, types ...apis.ConditionType) string {
	var parts []string
	for _, t := range types {
		for _, c := range cs {
			if c.Type != t {
				continue
			}
			s := fmt.Sprintf("%s=%s", t, c.Status)
			if c.Reason != "" {
				s += " " + c.Reason
			}
			if c.Message != "" && c.Status != "True" {
				s += " (" + c.Message + ")"
			}
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return "no conditions yet"
	}
	return strings.Join(parts, ", ")
}

type duckConditions = duckv1.Conditions

// EnsureArtifact loads the snapshot artifact in ad, building it from dir
// first when there is none (seed 000: ly deploy builds and publishes the
// artifact). One already built is used as it is: ly build makes a new one.
func EnsureArtifact(ctx context.Context, dir string, p *Project, ad string) (b *Built, built bool, err error) {
	if _, serr := os.Stat(filepath.Join(ad, "index.json")); errors.Is(serr, fs.ErrNotExist) {
		if b, err = Build(ctx, dir, p, BuildOptions{ArtifactDir: ad}); err != nil {
			return nil, false, fmt.Errorf("building the artifact into %s: %w", ad, err)
		}
		return b, true, nil
	}
	b, err = LoadArtifact(ad)
	return b, false, err
}
