package tenancy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"lampyr.dev/serving/clusters/e2eutil"
)

// stockPodSecurityMu guards stock.podSecurity: both tenants' victims are
// deployed at once.
var stockPodSecurityMu sync.Mutex

// stockBody is what the stock victim of ns answers: TARGET names the
// tenant, so a reference answer shows whose handler it came from.
func stockBody(ns string) string { return "Hello " + ns + "!\n" }

// stockService is the stock victim: the fixture handler's runnable image,
// with what Pod Security "restricted" asks of a container (Knative's
// queue-proxy sets the same), one Pod kept (min-scale 1) so the reference
// probes have a Pod to call.
func stockService(ns, image string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "serving.knative.dev/v1", "kind": "Service",
		"metadata": map[string]any{"name": victim, "namespace": ns},
		"spec": map[string]any{"template": map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{"autoscaling.knative.dev/min-scale": "1"}},
			"spec": map[string]any{"containers": []any{map[string]any{
				"image": image,
				"ports": []any{map[string]any{"containerPort": int64(8080)}},
				"env":   []any{map[string]any{"name": "TARGET", "value": ns}},
				"securityContext": map[string]any{
					"runAsNonRoot":             true,
					"allowPrivilegeEscalation": false,
					"capabilities":             map[string]any{"drop": []any{"ALL"}},
					"seccompProfile":           map[string]any{"type": "RuntimeDefault"},
				},
			}}},
		}},
	}}
}

// deployStockVictim deploys t's victim on stock as t. Stock Knative runs the
// Service's Pods in the tenant namespace: if "restricted" refuses them, the
// namespace falls back to "baseline" and the table records why.
func deployStockVictim(ctx context.Context, s *side, t *tenant) error {
	if err := t.c.Apply(ctx, e2eutil.KServices, stockService(t.ns, t.runnable), fieldManager); err != nil {
		return err
	}
	refusal, err := waitStockVictim(ctx, s, t, time.Now().Add(-time.Minute), 4*time.Minute)
	if err == nil {
		return nil
	}
	if refusal == "" {
		return err
	}
	fmt.Fprintf(GinkgoWriter, "stock: Pod Security restricted refused %s's Pods (%s): falling back to baseline\n", t.ns, refusal)
	stockPodSecurityMu.Lock()
	s.podSecurity[t.ns] = "baseline (restricted refused Knative's Pods: " + short(refusal, 160) + ")"
	stockPodSecurityMu.Unlock()
	if err := setPodSecurity(ctx, s.admin, t.ns, "baseline"); err != nil {
		return err
	}
	// The ReplicaSet controller backs off after refused creations: start
	// over rather than wait for its next try.
	if err := t.c.Dynamic.Resource(e2eutil.KServices).Namespace(t.ns).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := t.c.Dynamic.Resource(e2eutil.Revisions).Namespace(t.ns).Get(ctx, victimRev, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		return fmt.Errorf("waiting 2m for stock Revision %s/%s to be deleted: %w", t.ns, victimRev, err)
	}
	again := time.Now()
	if err := t.c.Apply(ctx, e2eutil.KServices, stockService(t.ns, t.runnable), fieldManager); err != nil {
		return err
	}
	_, err = waitStockVictim(ctx, s, t, again, 4*time.Minute)
	return err
}

// waitStockVictim waits for t's stock victim to answer through the gateway,
// or for Pod Security to refuse its Pods (an event after since, returned as
// refusal).
func waitStockVictim(ctx context.Context, s *side, t *tenant, since time.Time, timeout time.Duration) (refusal string, err error) {
	var last string
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		if ev, err := s.admin.Kube.CoreV1().Events(t.ns).List(ctx, metav1.ListOptions{}); err == nil {
			for _, e := range ev.Items {
				at := e.LastTimestamp.Time
				if at.IsZero() {
					at = e.EventTime.Time
				}
				if at.After(since) && strings.Contains(e.Message, "violates PodSecurity") {
					refusal = e.Message
					return true, nil
				}
			}
		}
		u, err := t.c.Dynamic.Resource(e2eutil.KServices).Namespace(t.ns).Get(ctx, victim, metav1.GetOptions{})
		if err != nil || !e2eutil.IsReady(u) {
			if u != nil {
				st, r, m := e2eutil.Condition(u, "Ready")
				last = fmt.Sprintf("Ready=%s %s %s", st, r, m)
			}
			return false, nil
		}
		code, body, _, err := e2eutil.Get(ctx, s.gateway, host(victim, t.ns), "/")
		last = fmt.Sprintf("gateway: %d %q %v", code, body, err)
		return err == nil && code == 200 && body == stockBody(t.ns), nil
	})
	if refusal != "" {
		return refusal, fmt.Errorf("stock: Pod Security refused the Pods of %s/%s: %s", t.ns, victim, refusal)
	}
	if err != nil {
		return "", fmt.Errorf("waiting %s for stock Service %s/%s to answer through the gateway (last: %s): %w", timeout, t.ns, victim, last, err)
	}
	return "", nil
}
