package revision

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"knative.dev/pkg/logging"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/internal/fetchq"
	"lampyr.dev/serving/impl/reconciler/revision/config"
	"lampyr.dev/serving/impl/reconciler/revision/resources"
)

// verifyArtifact asks whether the snapshot artifact exists in its registry
// when the installation wants to know (config-lampyr verify-artifacts).
// Validation already proved the reference is well-formed and
// digest-pinned. The answer comes from ArtifactChecks at once; while the
// check runs (off this worker) the Revision waits with ContainerHealthy
// Unknown VerifyingArtifact and is re-enqueued when it ends. The other
// steps go on meanwhile, as for a missing artifact: the Revision is not
// routed until verified.
func (r *Reconciler) verifyArtifact(_ context.Context, rev *v1.Revision, p *progress) error {
	if !p.cfg.VerifyArtifacts || r.artifacts == nil {
		return nil
	}
	ref := p.tmpl.SnapshotArtifact
	res := r.artifacts.Get(types.NamespacedName{Namespace: rev.Namespace, Name: rev.Name}, ref)
	if res.State == fetchq.Failed {
		// Look again when the backoff lets the check run again (missing
		// artifacts too: one may be pushed after the Revision was made).
		p.requeueAfter = minPositive(p.requeueAfter, max(time.Until(res.RetryAt), time.Second))
	}
	var missing *ArtifactMissingError
	switch {
	case res.State == fetchq.Done:
		return nil
	case errors.As(res.Err, &missing):
		// Missing, or missing last time and being checked again: either
		// way not there as far as anyone knows, and the status holds still.
		p.artifactMissing = v1.RevisionContainerMissingMessage(ref, missing.Detail)
		return nil
	case rev.Status.GetCondition(v1.RevisionConditionContainerHealthy).IsTrue():
		// Healthy before: its artifact was verified then (a Revision's spec
		// cannot change). A check still running after a restart, or a
		// registry briefly away, must not take it out of routing.
		return nil
	}
	p.artifactUnverified = artifactCheckMessage(ref, res)
	return nil
}

// artifactCheckMessage says what the check of ref is doing, in words that
// do not change while it waits (each change is a status write).
func artifactCheckMessage(ref string, res fetchq.Result[struct{}]) string {
	switch {
	case res.Err != nil:
		return fmt.Sprintf("Could not check snapshot artifact %q in its registry: %v; checking again.", ref, res.Err)
	case res.Ahead > 0:
		return fmt.Sprintf("Checking snapshot artifact %q in its registry, after other checks of this namespace.", ref)
	default:
		return fmt.Sprintf("Checking snapshot artifact %q in its registry.", ref)
	}
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || b < a {
		return b
	}
	return a
}

// sealTemplate gives an image-mapped Revision (config-lampyr
// image-snapshots) its fiberd template: the one its grant already records
// for the same snapshot and policy, or a new one sealed to the fleet key and
// pushed. Revisions deployed by `ly deploy` carry theirs in an annotation.
func (r *Reconciler) sealTemplate(ctx context.Context, rev *v1.Revision, p *progress) error {
	if !p.tmpl.SealByController {
		return nil
	}
	req := SealRequest{
		Namespace:         p.cfg.RouterNamespace,
		RevisionNamespace: rev.Namespace,
		Revision:          rev.Name,
		Snapshot:          p.tmpl.SnapshotArtifact,
		Execution:         p.tmpl.Execution,
		Repository:        p.cfg.TemplateRepository,
		Mirrors:           p.cfg.RegistryMirrors,
	}
	if g, err := r.grants.Get(rev.Namespace, rev.Name); err == nil && metav1.IsControlledBy(g, rev) &&
		g.Spec.Template != "" && g.Spec.SnapshotArtifact == req.Snapshot && equality.Semantic.DeepEqual(g.Spec.Execution, req.Execution) {
		p.tmpl.FiberdTemplate = g.Spec.Template
		return nil
	}
	key := r.sealed.key(rev, req)
	if ref, ok := r.sealed.get(key); ok {
		p.tmpl.FiberdTemplate = ref
		return nil
	}
	if r.sealer == nil {
		return errors.New("this controller has no template sealer: image-mapped Revisions cannot run")
	}
	ref, err := r.sealer.Seal(ctx, req)
	var missing *ArtifactMissingError
	switch {
	case errors.As(err, &missing):
		p.artifactMissing = v1.RevisionContainerMissingMessage(p.tmpl.SnapshotArtifact, missing.Detail)
		return nil
	case err != nil:
		return fmt.Errorf("sealing the fiberd template of image-mapped Revision %s: %w", rev.Name, err)
	}
	r.sealed.put(key, ref)
	logWrite(ctx, "Sealed", "fiberd template", ref)
	recordEvent(ctx, rev, corev1.EventTypeNormal, "TemplateSealed", "Sealed the fiberd template of image %s: %s", p.tmpl.Image, ref)
	p.tmpl.FiberdTemplate = ref
	return nil
}

func notOwnedMessage(kind, name string) string { return v1.ResourceNotOwnedMessage(kind, name) }

// notOwnedBy records that an object we did not make holds the name we
// need: the Revision cannot become ready, and a person must act.
func (p *progress) notOwnedBy(ctx context.Context, rev *v1.Revision, kind, name string) {
	msg := notOwnedMessage(kind, name)
	p.notOwned = append(p.notOwned, msg)
	recordEvent(ctx, rev, corev1.EventTypeWarning, v1.ReasonNotOwned, "%s", msg)
}

// grantKind reads CapacityGrants from the cache and writes them through
// the grant store.
func (r *Reconciler) grantKind() ownedKind[*fiberdv1alpha1.CapacityGrant] {
	return ownedKind[*fiberdv1alpha1.CapacityGrant]{
		kind: contract.CapacityGrantKind,
		get:  r.grants.Get,
		create: func(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) (*fiberdv1alpha1.CapacityGrant, error) {
			return g, r.grants.Create(ctx, g)
		},
		update: func(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) (*fiberdv1alpha1.CapacityGrant, error) {
			return g, r.grants.Update(ctx, g)
		},
		matches: func(got, want *fiberdv1alpha1.CapacityGrant) bool {
			return equality.Semantic.DeepEqual(got.Spec, want.Spec) && labelsContain(got.Labels, want.Labels)
		},
		merge: func(got, want *fiberdv1alpha1.CapacityGrant) *fiberdv1alpha1.CapacityGrant {
			u := got.DeepCopy()
			u.Spec = want.Spec
			u.Labels = mergeLabels(got.Labels, want.Labels)
			return u
		},
	}
}

// reconcileGrant creates the Revision's CapacityGrant or brings its spec
// back to what the Revision says; the grant controller owns its status.
func (r *Reconciler) reconcileGrant(ctx context.Context, rev *v1.Revision, p *progress) error {
	if p.tmpl.FiberdTemplate == "" {
		// An image-mapped snapshot the registry does not hold: nothing to
		// seal, so no grant; the Revision says why (artifactMissing).
		return nil
	}
	want := resources.MakeCapacityGrant(rev, p.tmpl, p.cfg)
	got, did, err := ensure(ctx, rev, r.grantKind(), want)
	var invalid *apierrs.StatusError
	switch {
	case errors.As(err, &invalid) && apierrs.IsInvalid(invalid):
		// The CRD refused what validation let through: retrying cannot
		// help, so report it on the Revision.
		p.grantInvalid = invalid.Error()
		return nil
	case err != nil:
		return err
	case did == foreign:
		p.notOwnedBy(ctx, rev, contract.CapacityGrantKind, want.Name)
		return nil
	case did == created:
		recordEvent(ctx, rev, corev1.EventTypeNormal, "CapacityGrantCreated", "Created CapacityGrant %s", want.Name)
	case did == updated:
		recordEvent(ctx, rev, corev1.EventTypeNormal, "CapacityGrantUpdated", "Updated the spec of CapacityGrant %s to the Revision's", want.Name)
	}
	p.grant, p.grantSpecWritten = got, did != unchanged
	return nil
}

// serviceKind reads Services from the cache and writes them with the
// Kubernetes client.
func (r *Reconciler) serviceKind() ownedKind[*corev1.Service] {
	return ownedKind[*corev1.Service]{
		kind: "Service",
		get: func(ns, name string) (*corev1.Service, error) {
			return r.serviceLister.Services(ns).Get(name)
		},
		create: func(ctx context.Context, s *corev1.Service) (*corev1.Service, error) {
			return r.kubeclient.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		},
		update: func(ctx context.Context, s *corev1.Service) (*corev1.Service, error) {
			return r.kubeclient.CoreV1().Services(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
		},
		matches: serviceMatches,
		merge: func(got, want *corev1.Service) *corev1.Service {
			u := got.DeepCopy()
			u.Labels = mergeLabels(got.Labels, want.Labels)
			if u.Spec.Type != want.Spec.Type {
				// Switching strategy: the API server rejects cluster IP
				// fields on an ExternalName Service and allocates them
				// afresh for ClusterIP.
				u.Spec.ClusterIP, u.Spec.ClusterIPs = "", nil
				u.Spec.IPFamilies, u.Spec.IPFamilyPolicy = nil, nil
				u.Spec.InternalTrafficPolicy = nil
				u.Spec.SessionAffinity = ""
			}
			u.Spec.Type = want.Spec.Type
			u.Spec.ExternalName = want.Spec.ExternalName
			u.Spec.Ports = want.Spec.Ports
			u.Spec.Selector = nil
			return u
		},
	}
}

// reconcileBackendService creates or repairs the Service the Route reconciler
// routes to. Only the fields we decide are compared, so values the API
// server fills in (clusterIP, ipFamilies, sessionAffinity) cause no updates.
func (r *Reconciler) reconcileBackendService(ctx context.Context, rev *v1.Revision, p *progress) error {
	want := resources.MakeService(rev, p.tmpl, p.cfg)
	got, did, err := ensure(ctx, rev, r.serviceKind(), want)
	switch {
	case err != nil:
		return err
	case did == foreign:
		p.notOwnedBy(ctx, rev, "Service", want.Name)
		return nil
	case did == created:
		recordEvent(ctx, rev, corev1.EventTypeNormal, "BackendServiceCreated", "Created backend Service %s (%s)", want.Name, want.Spec.Type)
	}
	p.serviceReady = true
	p.recordBackend(got)
	return nil
}

// recordBackend keeps the Service's address for probeBackend.
func (p *progress) recordBackend(s *corev1.Service) {
	if s == nil || len(s.Spec.Ports) == 0 {
		return
	}
	p.clusterIP, p.servicePort = s.Spec.ClusterIP, s.Spec.Ports[0].Port
}

func serviceMatches(got, want *corev1.Service) bool {
	if got.Spec.Type != want.Spec.Type || got.Spec.ExternalName != want.Spec.ExternalName ||
		len(got.Spec.Selector) != 0 || len(got.Spec.Ports) != len(want.Spec.Ports) ||
		!labelsContain(got.Labels, want.Labels) {
		return false
	}
	for i, w := range want.Spec.Ports {
		g := got.Spec.Ports[i]
		if g.Name != w.Name || g.Port != w.Port || g.TargetPort != w.TargetPort ||
			g.Protocol != w.Protocol || !equality.Semantic.DeepEqual(g.AppProtocol, w.AppProtocol) {
			return false
		}
	}
	return true
}

// sliceKind reads the mirrored EndpointSlices from the cache and writes
// them with the Kubernetes client.
func (r *Reconciler) sliceKind() ownedKind[*discoveryv1.EndpointSlice] {
	slices := func(ns string) discoveryclient.EndpointSliceInterface {
		return r.kubeclient.DiscoveryV1().EndpointSlices(ns)
	}
	return ownedKind[*discoveryv1.EndpointSlice]{
		kind: "EndpointSlice",
		get: func(ns, name string) (*discoveryv1.EndpointSlice, error) {
			return r.mirrorSliceLister.EndpointSlices(ns).Get(name)
		},
		create: func(ctx context.Context, s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
			return slices(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		},
		update: func(ctx context.Context, s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
			return slices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
		},
		matches: func(got, want *discoveryv1.EndpointSlice) bool {
			return got.AddressType == want.AddressType && labelsContain(got.Labels, want.Labels) &&
				// Semantic equality also treats nil and empty endpoint lists alike.
				equality.Semantic.DeepEqual(got.Endpoints, want.Endpoints) && equality.Semantic.DeepEqual(got.Ports, want.Ports)
		},
		merge: func(got, want *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
			u := got.DeepCopy()
			u.Labels = mergeLabels(got.Labels, want.Labels)
			u.Endpoints = want.Endpoints
			u.Ports = want.Ports
			return u
		},
		// addressType is immutable: replace the slice.
		replace: func(got, want *discoveryv1.EndpointSlice) bool { return got.AddressType != want.AddressType },
		del: func(ctx context.Context, s *discoveryv1.EndpointSlice) error {
			return slices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{})
		},
	}
}

// reconcileEndpointSlice keeps the mirror of fiber-router's ready endpoints
// in the endpointslice strategy, and removes it in the externalname one
// (after a strategy switch).
func (r *Reconciler) reconcileEndpointSlice(ctx context.Context, rev *v1.Revision, p *progress) error {
	if p.cfg.BackendStrategy != lampyrconfig.BackendEndpointSlice {
		p.sliceReady = true
		return r.deleteEndpointSlice(ctx, rev)
	}
	routerSlices, err := r.routerSliceLister.EndpointSlices(p.cfg.RouterNamespace).List(
		labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: p.cfg.RouterService}))
	if err != nil {
		return fmt.Errorf("listing %s/%s EndpointSlices: %w", p.cfg.RouterNamespace, p.cfg.RouterService, err)
	}
	want := resources.MakeEndpointSlice(rev, p.tmpl, routerSlices)
	_, did, err := ensure(ctx, rev, r.sliceKind(), want)
	switch {
	case err != nil:
		return err
	case did == foreign:
		p.notOwnedBy(ctx, rev, "EndpointSlice", want.Name)
		return nil
	}
	p.sliceReady = true
	return nil
}

// metadataKind reads router metadata from the cache (which sees only
// ConfigMaps labelled as router metadata) and writes it with the
// Kubernetes client.
func (r *Reconciler) metadataKind(rev *v1.Revision) ownedKind[*corev1.ConfigMap] {
	return ownedKind[*corev1.ConfigMap]{
		kind: "ConfigMap",
		get: func(ns, name string) (*corev1.ConfigMap, error) {
			return r.routerMetadataLister.ConfigMaps(ns).Get(name)
		},
		create: func(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
			return r.kubeclient.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		},
		update: func(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
			return r.kubeclient.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
		},
		// It lives in the Lampyr namespace, where rev cannot own it.
		ours: func(got *corev1.ConfigMap) bool { return resources.IsRouterMetadataOf(got, rev) },
		matches: func(got, want *corev1.ConfigMap) bool {
			return equality.Semantic.DeepEqual(got.Data, want.Data) && labelsContain(got.Labels, want.Labels)
		},
		merge: func(got, want *corev1.ConfigMap) *corev1.ConfigMap {
			u := got.DeepCopy()
			u.Labels = mergeLabels(got.Labels, want.Labels)
			u.Data = want.Data
			return u
		},
	}
}

// publishRouterMetadata writes route.<namespace>.<revision> in the Lampyr
// namespace, with ready=true only when everything else is ready, so
// fiber-router never routes to a Revision whose Home or backend is missing.
func (r *Reconciler) publishRouterMetadata(ctx context.Context, rev *v1.Revision, p *progress) error {
	p.routerReady = p.readyForRouting()
	ns := p.cfg.RouterNamespace
	want := resources.MakeRouterMetadata(rev, p.tmpl, ns, p.home(), p.routerReady)
	_, did, err := ensure(ctx, rev, r.metadataKind(rev), want)
	switch {
	case err != nil:
		return err
	case did == foreign:
		p.notOwnedBy(ctx, rev, "ConfigMap", ns+"/"+want.Name)
		p.routerReady = false
		return nil
	}
	p.published = true
	return nil
}

// routerMetadataOf returns rev's router metadata ConfigMap if it exists and
// was written for rev.
func (r *Reconciler) routerMetadataOf(rev *v1.Revision, ns string) (*corev1.ConfigMap, error) {
	got, err := r.routerMetadataLister.ConfigMaps(ns).Get(routermeta.Name(rev.Namespace, rev.Name))
	if err != nil {
		return nil, err
	}
	if !resources.IsRouterMetadataOf(got, rev) {
		return nil, apierrs.NewNotFound(corev1.Resource("configmaps"), got.Name)
	}
	return got, nil
}

// withdrawRouterMetadata marks existing metadata not ready when the
// Revision is rejected (e.g. after an upgrade narrowed the subset), so
// fiber-router stops routing to it. Nothing else is torn down: the
// Revision may still be deleted or the controller downgraded.
func (r *Reconciler) withdrawRouterMetadata(ctx context.Context, rev *v1.Revision, ns string) error {
	got, err := r.routerMetadataOf(rev, ns)
	if apierrs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if got.Data["ready"] != "true" {
		return nil
	}
	updated := got.DeepCopy()
	updated.Data["ready"] = "false"
	_, err = r.kubeclient.CoreV1().ConfigMaps(ns).Update(ctx, updated, metav1.UpdateOptions{})
	return err
}

// The delete* functions remove an object only if the cache shows it exists
// and is controlled by rev, so finalizing is idempotent and never deletes
// an object someone else created under our name.

func (r *Reconciler) deleteRouterMetadata(ctx context.Context, rev *v1.Revision) error {
	ns := config.FromContext(ctx).Lampyr.RouterNamespace
	got, err := r.routerMetadataOf(rev, ns)
	if apierrs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	return ignoreNotFound(r.kubeclient.CoreV1().ConfigMaps(ns).Delete(ctx, got.Name, metav1.DeleteOptions{}))
}

func (r *Reconciler) deleteEndpointSlice(ctx context.Context, rev *v1.Revision) error {
	got, err := r.mirrorSliceLister.EndpointSlices(rev.Namespace).Get(resources.EndpointSliceName(rev))
	if skip, err := skipDelete(ctx, got, err, rev); skip {
		return err
	}
	return ignoreNotFound(r.kubeclient.DiscoveryV1().EndpointSlices(rev.Namespace).Delete(ctx, got.Name, metav1.DeleteOptions{}))
}

func (r *Reconciler) deleteBackendService(ctx context.Context, rev *v1.Revision) error {
	got, err := r.serviceLister.Services(rev.Namespace).Get(rev.Name)
	if skip, err := skipDelete(ctx, got, err, rev); skip {
		return err
	}
	return ignoreNotFound(r.kubeclient.CoreV1().Services(rev.Namespace).Delete(ctx, got.Name, metav1.DeleteOptions{}))
}

func (r *Reconciler) deleteGrant(ctx context.Context, rev *v1.Revision) error {
	got, err := r.grants.Get(rev.Namespace, rev.Name)
	if skip, err := skipDelete(ctx, got, err, rev); skip {
		return err
	}
	return ignoreNotFound(r.grants.Delete(ctx, rev.Namespace, rev.Name))
}

// skipDelete says whether to skip deleting obj, and with which error.
func skipDelete[T metav1.Object](ctx context.Context, obj T, err error, rev *v1.Revision) (bool, error) {
	switch {
	case apierrs.IsNotFound(err):
		return true, nil
	case err != nil:
		return true, err
	case !metav1.IsControlledBy(obj, rev):
		logging.FromContext(ctx).Infof("Not deleting %s: not controlled by Revision %s", obj.GetName(), rev.Name)
		return true, nil
	}
	return false, nil
}

// logWrite records each write at info level: what the reconciler changed is
// what an operator looks for first.
func logWrite(ctx context.Context, verb, kind, name string) {
	logging.FromContext(ctx).Infof("%s %s %s", verb, kind, name)
}

func ignoreNotFound(err error) error {
	if apierrs.IsNotFound(err) {
		return nil
	}
	return err
}

// labelsContain: every label we set is present with our value; labels
// others added are left alone.
func labelsContain(got, want map[string]string) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func mergeLabels(got, want map[string]string) map[string]string {
	out := make(map[string]string, len(got)+len(want))
	for k, v := range got {
		out[k] = v
	}
	for k, v := range want {
		out[k] = v
	}
	return out
}
