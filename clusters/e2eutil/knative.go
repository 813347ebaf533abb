package e2eutil

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Knative Serving resources.
var (
	KServices = schema.GroupVersionResource{Group: "serving.knative.dev", Version: "v1", Resource: "services"}
	Revisions = schema.GroupVersionResource{Group: "serving.knative.dev", Version: "v1", Resource: "revisions"}
	Routes    = schema.GroupVersionResource{Group: "serving.knative.dev", Version: "v1", Resource: "routes"}
	Ingresses = schema.GroupVersionResource{Group: "networking.internal.knative.dev", Version: "v1alpha1", Resource: "ingresses"}
	// DomainMappings and ClusterDomainClaims: custom domains.
	DomainMappings      = schema.GroupVersionResource{Group: "serving.knative.dev", Version: "v1beta1", Resource: "domainmappings"}
	ClusterDomainClaims = schema.GroupVersionResource{Group: "networking.internal.knative.dev", Version: "v1alpha1", Resource: "clusterdomainclaims"}
)

// Condition returns status, reason and message of a condition type in
// status.conditions, or "" when absent.
func Condition(u *unstructured.Unstructured, typ string) (status, reason, message string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			s, _ := m["status"].(string)
			r, _ := m["reason"].(string)
			msg, _ := m["message"].(string)
			return s, r, msg
		}
	}
	return "", "", ""
}

// IsReady reports Ready=True for the object's current generation.
func IsReady(u *unstructured.Unstructured) bool {
	s, _, _ := Condition(u, "Ready")
	og, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	return s == "True" && og == u.GetGeneration()
}

// WaitReady waits for a namespaced Knative object to be Ready and returns
// it. The timeout error carries the last Ready condition seen.
func (c *Clients) WaitReady(ctx context.Context, gvr schema.GroupVersionResource, ns, name string, timeout time.Duration) (*unstructured.Unstructured, error) {
	var last *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		u, err := c.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = u
		return IsReady(u), nil
	})
	if err != nil {
		s, r, m := "", "", ""
		if last != nil {
			s, r, m = Condition(last, "Ready")
		}
		return last, fmt.Errorf("waiting %s for %s %s/%s to be Ready (last Ready=%q reason=%q message=%q): %w", timeout, gvr.Resource, ns, name, s, r, m, err)
	}
	return last, nil
}

// Get sends one request to a gateway on 127.0.0.1 with a Host header.
func Get(ctx context.Context, gatewayURL, host, path string) (int, string, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, gatewayURL+path, nil)
	if err != nil {
		return 0, "", nil, err
	}
	req.Host = host
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

// Apply server-side applies u (namespaced) as fieldManager, taking over
// fields another manager set: suites own what they apply.
func (c *Clients) Apply(ctx context.Context, gvr schema.GroupVersionResource, u *unstructured.Unstructured, fieldManager string) error {
	body, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	force := true
	_, err = c.Dynamic.Resource(gvr).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: fieldManager, Force: &force})
	if err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", gvr.Resource, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// FreshNamespace deletes ns if it exists, waits until it is gone (up to
// timeout), and creates it empty.
func (c *Clients) FreshNamespace(ctx context.Context, ns string, timeout time.Duration) error {
	if err := c.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err == nil {
		err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
			_, err := c.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			return fmt.Errorf("namespace %s still terminating after %s: %w", ns, timeout, err)
		}
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting namespace %s: %w", ns, err)
	}
	_, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	return err
}
