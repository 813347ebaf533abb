package ly

import (
	"context"
	"encoding/json"
	"fmt"
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
	"lampyr.dev/serving/impl/fiberd/seal"
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
	Pushed     bool   `json:"pushed"`
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

// SealTemplate seals the fiberd template of revision for a snapshot to the
// installation's fleet key and pushes it to the template repository tagged
// with the Revision's name; it returns the digest reference.
func SealTemplate(ctx context.Context, in *Installation, revision string, snapshot name.Digest, cfg artifact.Config, policy seal.ExecutionPolicy, opts ...remote.Option) (name.Digest, error) {
	sealed, err := seal.Seal(in.fleet, seal.NewTemplate(revision, snapshot.DigestStr(), policy, cfg))
	if err != nil {
		return name.Digest{}, err
	}
	ref, err := artifact.PushTemplate(ctx, sealed, in.TemplateRepository, revision, in.FleetKeyID, opts...)
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
	for _, w := range CheckAdapter(dir) {
		pr.Warn("%s", w)
	}
	ws, wsPath, err := FindWorkspace(dir)
	if err != nil {
		return nil, err
	}
	res := &DeployResult{Service: p.Name, Namespace: o.Namespace, Visibility: VisibilityClusterLocal}
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
		if built, err = LoadArtifact(ad); err != nil {
			return err
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
		ph.Detail("revision %s, fleet key %s, execution %s", res.Revision, shortID(inst.FleetKeyID), p.Execution.Mode)
		if tmpl, err = SealTemplate(ctx, inst, res.Revision, pushed.Ref, built.Config, p.Policy(), o.Remote...); err != nil {
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
// the error carries the Revision's ResourcesAvailable reason.
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
