package grant

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
)

// A namespace's egress objects (resources.MakeEgress*), kept by the egress
// API when a Home asks. They are read and written with the API client, not
// through informers: the grant controller watches no tenant namespace for
// them, and a Home asks only on its fibers' first outbound connection or
// after its proxy failed. Owner references to every admitted grant of the
// namespace let the garbage collector remove them with the last one.

// egressError is a refusal with the HTTP status the Home is answered.
type egressError struct {
	code int
	msg  string
}

func (e *egressError) Error() string { return e.msg }

// ensureEgress makes the namespace's egress NetworkPolicy, Service and Pod
// what they should be and waits, until ctx ends, for the Pod to be Ready;
// it returns the Pod's ip:port.
func (a *EgressAPI) ensureEgress(ctx context.Context, ns string, cfg *lampyrconfig.Config) (string, error) {
	owners, err := a.admittedGrants(ns)
	if err != nil {
		return "", err
	}
	// The policy first: the Pod is of no use to the Homes without it.
	if err := a.ensureEgressPolicy(ctx, resources.MakeEgressNetworkPolicy(ns, a.homesNamespace, owners)); err != nil {
		return "", err
	}
	if err := a.ensureEgressService(ctx, resources.MakeEgressService(ns, owners)); err != nil {
		return "", err
	}
	want := resources.MakeEgressPod(ns, owners, cfg, a.keyPEM)
	for {
		p, err := a.ensureEgressPod(ctx, want)
		if err != nil {
			return "", err
		}
		if p != nil && p.Status.PodIP != "" && podIsReady(p) {
			// The Pod's own address, not the Service's: no wait for
			// kube-proxy, and a tenant cannot re-point it (a Service's
			// endpoints it can).
			return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(contract.EgressProxyPort)), nil
		}
		select {
		case <-ctx.Done():
			return "", &egressError{http.StatusGatewayTimeout, fmt.Sprintf("egress Pod %s/%s is not Ready after %s: %s", ns, want.Name, a.readyTimeout, podSummary(p))}
		case <-time.After(a.pollEvery):
		}
	}
}

// admittedGrants are the namespace's admitted, not deleted grants: the
// egress objects' owners.
func (a *EgressAPI) admittedGrants(ns string) ([]*v1alpha1.CapacityGrant, error) {
	all, err := a.grants.CapacityGrants(ns).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var out []*v1alpha1.CapacityGrant
	for _, g := range all {
		if g.DeletionTimestamp == nil && g.Status.IsAdmitted() {
			out = append(out, g)
		}
	}
	return out, nil
}

func foreignEgress(kind string, obj metav1.Object) error {
	return &egressError{http.StatusConflict, fmt.Sprintf("%s %s/%s exists and is not Lampyr's egress %s; delete or rename it so fibers of this namespace can call out", kind, obj.GetNamespace(), obj.GetName(), kind)}
}

// apiRefusal carries the API server's own words (a ResourceQuota or
// LimitRange refusal reads as it would for the tenant's Pod).
func apiRefusal(what string, err error) error {
	if apierrs.IsForbidden(err) || apierrs.IsInvalid(err) {
		return &egressError{http.StatusForbidden, what + ": " + err.Error()}
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (a *EgressAPI) ensureEgressPolicy(ctx context.Context, want *networkingv1.NetworkPolicy) error {
	c := a.kube.NetworkingV1().NetworkPolicies(want.Namespace)
	have, err := c.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrs.IsNotFound(err) {
		if _, err := c.Create(ctx, want, metav1.CreateOptions{}); err != nil && !apierrs.IsAlreadyExists(err) {
			return apiRefusal("creating NetworkPolicy "+want.Namespace+"/"+want.Name, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if !resources.IsEgressObject(have) {
		return foreignEgress("NetworkPolicy", have)
	}
	if equality.Semantic.DeepEqual(have.Spec, want.Spec) && equality.Semantic.DeepEqual(have.OwnerReferences, want.OwnerReferences) && equality.Semantic.DeepEqual(have.Labels, want.Labels) {
		return nil
	}
	upd := have.DeepCopy()
	upd.Spec, upd.OwnerReferences, upd.Labels = want.Spec, want.OwnerReferences, want.Labels
	if _, err := c.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return apiRefusal("updating NetworkPolicy "+want.Namespace+"/"+want.Name, err)
	}
	return nil
}

func (a *EgressAPI) ensureEgressService(ctx context.Context, want *corev1.Service) error {
	c := a.kube.CoreV1().Services(want.Namespace)
	have, err := c.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrs.IsNotFound(err) {
		if _, err := c.Create(ctx, want, metav1.CreateOptions{}); err != nil && !apierrs.IsAlreadyExists(err) {
			return apiRefusal("creating Service "+want.Namespace+"/"+want.Name, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if !resources.IsEgressObject(have) {
		return foreignEgress("Service", have)
	}
	if equality.Semantic.DeepEqual(have.Spec.Selector, want.Spec.Selector) && equality.Semantic.DeepEqual(have.Spec.Ports, want.Spec.Ports) &&
		equality.Semantic.DeepEqual(have.OwnerReferences, want.OwnerReferences) && equality.Semantic.DeepEqual(have.Labels, want.Labels) {
		return nil
	}
	upd := have.DeepCopy()
	upd.Spec.Selector, upd.Spec.Ports, upd.OwnerReferences, upd.Labels = want.Spec.Selector, want.Spec.Ports, want.OwnerReferences, want.Labels
	if _, err := c.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return apiRefusal("updating Service "+want.Namespace+"/"+want.Name, err)
	}
	return nil
}

// ensureEgressPod returns the egress Pod, nil while it is being created or
// replaced. A Pod that ended, or whose container is not what the grant
// controller would run (an older Home image, or edited), is replaced:
// Homes send it their signed grants.
func (a *EgressAPI) ensureEgressPod(ctx context.Context, want *corev1.Pod) (*corev1.Pod, error) {
	c := a.kube.CoreV1().Pods(want.Namespace)
	have, err := c.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrs.IsNotFound(err) {
		p, err := c.Create(ctx, want, metav1.CreateOptions{})
		if apierrs.IsAlreadyExists(err) {
			return nil, nil
		}
		if err != nil {
			return nil, apiRefusal("creating egress Pod "+want.Namespace+"/"+want.Name, err)
		}
		return p, nil
	}
	if err != nil {
		return nil, err
	}
	if !resources.IsEgressObject(have) {
		return nil, foreignEgress("Pod", have)
	}
	if have.DeletionTimestamp != nil {
		return nil, nil
	}
	if have.Status.Phase == corev1.PodFailed || have.Status.Phase == corev1.PodSucceeded || !sameEgressContainer(have, want) {
		if err := c.Delete(ctx, have.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &have.UID}}); err != nil && !apierrs.IsNotFound(err) && !apierrs.IsConflict(err) {
			return nil, fmt.Errorf("replacing egress Pod %s/%s: %w", have.Namespace, have.Name, err)
		}
		return nil, nil
	}
	if !equality.Semantic.DeepEqual(have.OwnerReferences, want.OwnerReferences) {
		upd := have.DeepCopy()
		upd.OwnerReferences = want.OwnerReferences
		if p, err := c.Update(ctx, upd, metav1.UpdateOptions{}); err == nil {
			have = p
		} else if !apierrs.IsConflict(err) {
			return nil, fmt.Errorf("updating the owners of egress Pod %s/%s: %w", have.Namespace, have.Name, err)
		}
	}
	return have, nil
}

// sameEgressContainer compares what a Pod runs, and as whom, with what the
// grant controller would run.
func sameEgressContainer(have, want *corev1.Pod) bool {
	if len(have.Spec.Containers) != 1 || len(have.Spec.InitContainers) != 0 || len(have.Spec.EphemeralContainers) != 0 {
		return false
	}
	h, w := have.Spec.Containers[0], want.Spec.Containers[0]
	return h.Image == w.Image &&
		equality.Semantic.DeepEqual(h.Command, w.Command) &&
		equality.Semantic.DeepEqual(h.Args, w.Args) &&
		equality.Semantic.DeepEqual(h.Env, w.Env) &&
		equality.Semantic.DeepEqual(h.SecurityContext, w.SecurityContext) &&
		equality.Semantic.DeepEqual(have.Spec.SecurityContext, want.Spec.SecurityContext)
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podSummary says why a Pod is not Ready, for the Home's log.
func podSummary(p *corev1.Pod) string {
	if p == nil {
		return "being created or replaced"
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "not scheduled: " + c.Message
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			return fmt.Sprintf("container %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
	}
	return "phase " + string(p.Status.Phase)
}
