// Package revision is the Lampyr Revision reconciler: it runs a Knative
// Revision in fibers instead of Pods. Per Revision it validates the template
// subset, verifies the snapshot artifact, creates a CapacityGrant (the grant
// controller runs the Home), the backend Service (and, in the endpointslice
// strategy, its EndpointSlice), publishes router metadata for fiber-router
// and reports the standard Revision conditions the upstream Route,
// Configuration, kubectl and kn read.
package revision

import (
	"context"

	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"knative.dev/pkg/controller"
	pkgreconciler "knative.dev/pkg/reconciler"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	revisionreconciler "knative.dev/serving/pkg/client/injection/reconciler/serving/v1/revision"

	"lampyr.dev/serving/impl/reconciler/revision/config"
)

// Reconciler implements revisionreconciler.Interface and Finalizer.
type Reconciler struct {
	kubeclient kubernetes.Interface
	grants     grantStore

	serviceLister corev1listers.ServiceLister
	// routerMetadataLister sees only ConfigMaps labelled as router metadata.
	routerMetadataLister corev1listers.ConfigMapLister
	// mirrorSliceLister sees only the EndpointSlices this reconciler writes.
	mirrorSliceLister discoverylisters.EndpointSliceLister
	// routerSliceLister sees fiber-router's EndpointSlices (mirror source).
	routerSliceLister discoverylisters.EndpointSliceLister

	// artifacts is consulted only when config-lampyr verify-artifacts is on.
	artifacts ArtifactChecks
	// sealer seals the templates of image-mapped Revisions; sealed remembers
	// them until their grant is cached.
	sealer TemplateSealer
	sealed sealedTemplates
	// prober checks a new backend Service's cluster IP answers before the
	// Revision is routable (endpointslice strategy); nil: not checked.
	prober    BackendProber
	reachable reachableBackends
}

var (
	_ revisionreconciler.Interface = (*Reconciler)(nil)
	_ revisionreconciler.Finalizer = (*Reconciler)(nil)
)

// ReconcileKind converges one Revision. Every step is idempotent and reads
// what exists before writing, so a restarted controller picks up where the
// last one stopped; only the Revision's status is written back (by the
// generated reconciler), never its metadata or spec.
func (r *Reconciler) ReconcileKind(ctx context.Context, rev *v1.Revision) pkgreconciler.Event {
	ctx, cancel := context.WithTimeout(ctx, pkgreconciler.DefaultTimeout)
	defer cancel()
	cfg := config.FromContext(ctx)
	before := conditionsBefore(&rev.Status)

	tmpl, rejection := Validate(rev, cfg)
	if rejection != nil {
		markRejected(&rev.Status, rejection)
		recordRefusals(ctx, rev, before)
		return r.withdrawRouterMetadata(ctx, rev, cfg.Lampyr.RouterNamespace)
	}
	recordContainerStatus(&rev.Status, tmpl)

	p := &progress{tmpl: tmpl, cfg: cfg.Lampyr}
	for _, step := range []func(context.Context, *v1.Revision, *progress) error{
		r.verifyArtifact,
		r.sealTemplate,
		r.reconcileGrant,
		r.reconcileBackendService,
		r.reconcileEndpointSlice,
		r.probeBackend,
		r.publishRouterMetadata,
	} {
		if err := step(ctx, rev, p); err != nil {
			return err
		}
	}
	p.markConditions(&rev.Status)
	recordRefusals(ctx, rev, before)
	if p.requeueAfter > 0 {
		return controller.NewRequeueAfter(p.requeueAfter)
	}
	return nil
}

// FinalizeKind removes what the Revision owns, router metadata first so
// fiber-router stops routing before the backend and the grant disappear.
// Owner references would collect the same objects; doing it here makes
// `kubectl delete revision` return only once the fibers' grant is gone.
func (r *Reconciler) FinalizeKind(ctx context.Context, rev *v1.Revision) pkgreconciler.Event {
	ctx, cancel := context.WithTimeout(ctx, pkgreconciler.DefaultTimeout)
	defer cancel()
	defer r.sealed.forget(rev)
	defer r.reachable.forget(rev)
	for _, del := range []func(context.Context, *v1.Revision) error{
		r.deleteRouterMetadata,
		r.deleteEndpointSlice,
		r.deleteBackendService,
		r.deleteGrant,
	} {
		if err := del(ctx, rev); err != nil {
			return err
		}
	}
	return nil
}
