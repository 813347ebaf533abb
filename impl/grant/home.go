// The Home: its images, Service and Pod, and what the Pod says.

package grant

import (
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
)

// reconcileImages marks the Home failed when its images cannot be used;
// false: they cannot.
func reconcileImages(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) bool {
	if reason, msg := checkImages(cfg); reason != "" {
		g.Status.MarkHomeFailed(reason, "%s", msg)
		return false
	}
	return true
}

// checkImages refuses Home images that are not pinned by digest: whoever
// can move a tag would otherwise choose what runs privileged in every Home.
func checkImages(cfg *lampyrconfig.Config) (reason contract.Reason, message string) {
	if cfg.HomeImage == "" {
		return contract.ReasonHomeImageMissing, fmt.Sprintf("no Home image configured: set %s in ConfigMap %s or %s on the grant controller", lampyrconfig.KeyHomeImage, contract.ConfigMapName, config.EnvGrantImage)
	}
	for key, img := range map[string]string{lampyrconfig.KeyHomeImage: cfg.HomeImage, lampyrconfig.KeyHelperImage: cfg.HelperImage} {
		if img == "" {
			continue
		}
		if _, err := artifact.ParseDigestRef(img); err != nil {
			return contract.ReasonHomeImageNotPinned, fmt.Sprintf("%s %q in ConfigMap %s is not pinned by digest (%v); use repository@sha256:<digest>", key, img, contract.ConfigMapName, err)
		}
	}
	return "", ""
}

// deleteHome deletes the Home objects of grant namespace/name (keep: a UID
// whose objects stay, "" for none). Only objects labelled as that grant's
// Home are touched.
func (r *Reconciler) deleteHome(ctx context.Context, namespace, name string, keepUID string) error {
	homeName := resources.HomeNameFor(namespace, name)
	mine := func(o metav1.Object) bool {
		ns, n, ok := resources.GrantKeyOf(o)
		return ok && ns == namespace && n == name && (keepUID == "" || o.GetLabels()[contract.GrantUIDLabel] != keepUID)
	}
	var errs []error
	if pods, err := r.pods.Pods(r.homesNamespace).List(homePodsOf(namespace, name)); err == nil {
		for _, p := range pods {
			if mine(p) && p.DeletionTimestamp == nil {
				errs = append(errs, ignoreNotFound(r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{})))
			}
		}
	}
	if s, err := r.services.Services(r.homesNamespace).Get(homeName); err == nil && mine(s) {
		errs = append(errs, ignoreNotFound(r.kube.CoreV1().Services(r.homesNamespace).Delete(ctx, homeName, metav1.DeleteOptions{})))
	}
	if s, err := r.secrets.Secrets(r.homesNamespace).Get(homeName); err == nil && mine(s) {
		errs = append(errs, ignoreNotFound(r.kube.CoreV1().Secrets(r.homesNamespace).Delete(ctx, homeName, metav1.DeleteOptions{})))
	}
	// A claimed spare's Secret has the spare's name (spare.go).
	if secrets, err := r.secrets.Secrets(r.homesNamespace).List(homePodsOf(namespace, name)); err == nil {
		for _, s := range secrets {
			if s.Name != homeName && mine(s) {
				errs = append(errs, ignoreNotFound(r.kube.CoreV1().Secrets(r.homesNamespace).Delete(ctx, s.Name, metav1.DeleteOptions{})))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deleting the Home of CapacityGrant %s/%s: %w", namespace, name, err)
	}
	return nil
}

func ignoreNotFound(err error) error {
	if apierrs.IsNotFound(err) {
		return nil
	}
	return err
}

// ownership of an existing Home object for g: ours, a leftover of an
// earlier grant of the same name (replaced), or someone else's (refused).
type ownership int

const (
	ownedByGrant ownership = iota
	leftover
	foreign
)

func ownershipOf(obj metav1.Object, g *v1alpha1.CapacityGrant) ownership {
	if resources.IsHomeOf(obj, g) {
		return ownedByGrant
	}
	if ns, name, ok := resources.GrantKeyOf(obj); ok && ns == g.Namespace && name == g.Name {
		return leftover
	}
	return foreign
}

// taken marks the grant's Home name taken by obj and stops the reconcile.
func (r *Reconciler) taken(g *v1alpha1.CapacityGrant, kind string, obj metav1.Object) error {
	g.Status.MarkHomeFailed(contract.ReasonHomeNameTaken, "%s %s/%s exists and was not made for this CapacityGrant; delete it", kind, r.homesNamespace, obj.GetName())
	return errHomeNameTaken
}

func (r *Reconciler) reconcileService(ctx context.Context, g *v1alpha1.CapacityGrant) error {
	want := resources.MakeHomeService(g, r.homesNamespace)
	have, err := r.services.Services(r.homesNamespace).Get(want.Name)
	if apierrs.IsNotFound(err) {
		if _, err := r.kube.CoreV1().Services(r.homesNamespace).Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating Service %s/%s: %w", r.homesNamespace, want.Name, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if ownershipOf(have, g) == foreign {
		return r.taken(g, "Service", have)
	}
	if equality.Semantic.DeepEqual(have.Spec.Selector, want.Spec.Selector) && equality.Semantic.DeepEqual(have.Spec.Ports, want.Spec.Ports) && equality.Semantic.DeepEqual(have.Labels, want.Labels) {
		return nil
	}
	upd := have.DeepCopy()
	upd.Labels, upd.Spec.Selector, upd.Spec.Ports = want.Labels, want.Spec.Selector, want.Spec.Ports
	_, err = r.kube.CoreV1().Services(r.homesNamespace).Update(ctx, upd, metav1.UpdateOptions{})
	return err
}

// reconcilePod runs the Home Pod and returns it once it is this grant's
// and current (nil while it is being created or replaced).
//
// A Home Pod being deleted (by hand, by an eviction or a node drain, or
// here because it failed or runs an outdated image) hands over, then
// drains: fiberd serves on, new fibers included, while it stays Ready
// (at most 60 s, server.Handover), then lets the requests under way finish
// within its grace period. Its replacement is created at once under the
// next free name (HomePodName); the Pod being deleted stays the Home while
// it is Ready and the replacement is not, so the Revision is served
// throughout, and fiber-router holds requests if there is a gap.
func (r *Reconciler) reconcilePod(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) (*corev1.Pod, error) {
	pods, err := r.pods.Pods(r.homesNamespace).List(homePodsOf(g.Namespace, g.Name))
	if err != nil {
		return nil, err
	}
	if pods, err = r.claimedPod(ctx, g, pods); err != nil {
		return nil, err
	}
	var live []*corev1.Pod
	draining := ""
	var handingOver *corev1.Pod
	for _, p := range pods {
		switch {
		case ownershipOf(p, g) == leftover:
			if p.DeletionTimestamp == nil {
				if err := r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrs.IsNotFound(err) {
					return nil, fmt.Errorf("replacing a leftover Home Pod %s/%s: %w", r.homesNamespace, p.Name, err)
				}
			}
			g.Status.MarkHomeNotReady(contract.ReasonHomePending, "Home Pod %s/%s of an earlier grant of this name is being replaced.", r.homesNamespace, p.Name)
			return nil, nil
		case p.DeletionTimestamp != nil:
			draining = p.Name
			// fiberd serves on after SIGTERM while it stays Ready
			// (server.Handover): it serves until its replacement is
			// Ready, the newest of them if several.
			if podReady(p) && (handingOver == nil || handingOver.CreationTimestamp.Before(&p.CreationTimestamp)) {
				handingOver = p
			}
		default:
			live = append(live, p)
		}
	}
	want := resources.MakeHomePod(g, cfg, r.homesNamespace, 0)
	image := want.Spec.Containers[0].Image
	// The Home's own name (HomePodName 0) is preferred: a replacement
	// under another name moves back to it once it is free.
	canonical, err := r.pods.Pods(r.homesNamespace).Get(resources.HomeName(g))
	if err != nil && !apierrs.IsNotFound(err) {
		return nil, err
	}
	canonicalFree := canonical == nil || apierrs.IsNotFound(err)
	canonicalServes := !canonicalFree && ownershipOf(canonical, g) == ownedByGrant && canonical.DeletionTimestamp == nil &&
		canonical.Spec.Containers[0].Image == image && canonical.Status.Phase != corev1.PodFailed && canonical.Status.Phase != corev1.PodSucceeded
	var current, outdated []*corev1.Pod
	for _, p := range live {
		switch {
		case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
			// Pods are immutable where it matters: a Home that ended is
			// replaced (its replacement next, once the cache shows it
			// terminating).
			if err := r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrs.IsNotFound(err) {
				return nil, fmt.Errorf("replacing Home Pod %s/%s: %w", r.homesNamespace, p.Name, err)
			}
			g.Status.MarkHomeFailed(contract.ReasonHomeFailed, "Home Pod %s/%s is %s; replacing it. %s", r.homesNamespace, p.Name, p.Status.Phase, p.Status.Message)
			return nil, nil
		case p.Spec.Containers[0].Image != image:
			outdated = append(outdated, p)
		case p.Name != resources.HomeName(g) && !resources.IsClaimedSpare(p) && (canonicalFree || canonicalServes):
			// (A claimed spare keeps its own name: it is the Home.)
			// A replacement that outlived its predecessor goes back to
			// the Home's own name the same way (make before break): an
			// earlier grant controller, after a downgrade, knows only
			// that name, and would start a second Home beside this one.
			outdated = append(outdated, p)
		default:
			current = append(current, p)
		}
	}
	oldestFirst(current)
	oldestFirst(outdated)
	if len(current) == 0 {
		// No Home runs the configured image: start one. A Home of an
		// outdated image (an upgrade) keeps serving until it is Ready:
		// make before break.
		next, err := r.newHomePod(ctx, g, cfg)
		if err != nil {
			return nil, ignoreTaken(err)
		}
		if _, err := r.kube.CoreV1().Pods(r.homesNamespace).Create(ctx, next, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating Home Pod %s/%s: %w", r.homesNamespace, next.Name, err)
		}
		switch {
		case len(outdated) > 0 && podReady(outdated[0]):
			markHome(g, outdated[0])
			return outdated[0], nil
		case handingOver != nil:
			markHome(g, handingOver)
			return handingOver, nil
		case draining != "":
			g.Status.MarkHomeNotReady(contract.ReasonHomePending, "Home Pod %s/%s is being deleted and drains its requests; its replacement %s created.", r.homesNamespace, draining, next.Name)
		default:
			g.Status.MarkHomeNotReady(contract.ReasonHomePending, "Home Pod %s/%s created.", r.homesNamespace, next.Name)
		}
		return nil, nil
	}
	// More than one Home of the configured image (a create the cache had
	// not shown yet): keep the oldest.
	have := current[0]
	for _, extra := range current[1:] {
		if err := r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, extra.Name, metav1.DeleteOptions{}); err != nil && !apierrs.IsNotFound(err) {
			return nil, fmt.Errorf("deleting a second Home Pod %s/%s: %w", r.homesNamespace, extra.Name, err)
		}
	}
	if !podReady(have) {
		// The new Home is starting: an outdated one that is Ready serves
		// until then.
		for _, o := range outdated {
			if podReady(o) {
				markHome(g, o)
				return o, nil
			}
		}
		if handingOver != nil {
			markHome(g, handingOver)
			return handingOver, nil
		}
	} else {
		// The new Home is Ready (and the router metadata names it from
		// this reconcile on): the outdated ones drain and go.
		for _, o := range outdated {
			if err := r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, o.Name, metav1.DeleteOptions{}); err != nil && !apierrs.IsNotFound(err) {
				return nil, fmt.Errorf("deleting outdated Home Pod %s/%s: %w", r.homesNamespace, o.Name, err)
			}
		}
	}
	markHome(g, have)
	return have, nil
}

// oldestFirst sorts Pods by creation, then name.
func oldestFirst(pods []*corev1.Pod) {
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp) ||
			(pods[i].CreationTimestamp.Equal(&pods[j].CreationTimestamp) && pods[i].Name < pods[j].Name)
	})
}

// homePodsOf selects the Home Pods labelled as grant namespace/name's, of
// any UID.
func homePodsOf(namespace, name string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{resources.ComponentKey: resources.Component, contract.GrantNamespaceLabel: namespace, contract.GrantLabel: name})
}

// newHomePod is g's next Home Pod under the first name no Pod holds. A Pod
// of someone else under the Home's own name stops the grant (HomeNameTaken),
// as a Service or Secret does.
func (r *Reconciler) newHomePod(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) (*corev1.Pod, error) {
	// The Home Secret of a claimed spare has the spare's name: a Pod that
	// replaces that spare mounts it (the same Home key, so the grant and
	// everything fiber-router pinned stay valid).
	secret, err := r.homeSecret(ctx, g)
	if err != nil {
		return nil, err
	}
	for n := 0; ; n++ {
		want := resources.MakeHomePod(g, cfg, r.homesNamespace, n)
		if secret != nil {
			resources.MountSecret(want, secret.Name)
		}
		have, err := r.pods.Pods(r.homesNamespace).Get(want.Name)
		switch {
		case apierrs.IsNotFound(err):
			return want, nil
		case err != nil:
			return nil, err
		case n == 0 && ownershipOf(have, g) == foreign:
			return nil, r.taken(g, "Pod", have)
		}
	}
}

// ignoreTaken: a taken name is reported in the condition, not retried.
func ignoreTaken(err error) error {
	if errors.Is(err, errHomeNameTaken) {
		return nil
	}
	return err
}

// markHome translates the Home Pod's status into HomeReady.
func markHome(g *v1alpha1.CapacityGrant, p *corev1.Pod) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			g.Status.MarkHomeReady()
			return
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			g.Status.MarkHomeNotReady(contract.ReasonHomePending, "Home Pod %s/%s is not scheduled: %s", p.Namespace, p.Name, c.Message)
			return
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			g.Status.MarkHomeNotReady(contract.ReasonHomeNotReady, "Home Pod %s container %s: %s %s", p.Name, cs.Name, w.Reason, w.Message)
			return
		}
		if t := cs.LastTerminationState.Terminated; t != nil && cs.RestartCount > 0 {
			g.Status.MarkHomeNotReady(contract.ReasonHomeNotReady, "Home Pod %s container %s restarted %d times, last exit %d (%s); see its logs", p.Name, cs.Name, cs.RestartCount, t.ExitCode, t.Reason)
			return
		}
	}
	g.Status.MarkHomeNotReady(contract.ReasonHomeNotReady, "Home Pod %s is %s and not ready yet (fiberd /readyz: valid grant, template opened, snapshot verified, pool warm).", p.Name, p.Status.Phase)
}
