// Package apply server-side-applies rendered manifests to a cluster in the
// order a release install needs (CRDs first, established before anything
// that uses them), and waits for Deployments to become Available with
// progress lines and timeouts that name what was awaited.
package apply

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"lampyr.dev/serving/impl/progress"
)

// FieldManager owns every field the installer applies. The name is older
// than the installer's move into impl and stays: installations made with
// it keep owning their fields.
const FieldManager = "lampyr-framework"

// Applier applies objects to one cluster.
type Applier struct {
	kube   kubernetes.Interface
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	log    *progress.Log
}

// New returns an Applier for cfg.
func New(cfg *rest.Config, log *progress.Log) (*Applier, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Applier{kube: kube, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)), log: log}, nil
}

// Apply applies objs: CustomResourceDefinitions and Namespaces first (and
// waits for the CRDs to be Established), then everything else in order.
func (a *Applier) Apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	var first, rest []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "CustomResourceDefinition", "Namespace":
			first = append(first, o)
		default:
			rest = append(rest, o)
		}
	}
	for _, o := range first {
		if err := a.applyOne(ctx, o); err != nil {
			return err
		}
	}
	for _, o := range first {
		if o.GetKind() == "CustomResourceDefinition" {
			if err := a.waitEstablished(ctx, o.GetName()); err != nil {
				return err
			}
		}
	}
	a.mapper.Reset()
	for _, o := range rest {
		if err := a.applyOne(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

func (a *Applier) applyOne(ctx context.Context, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		a.mapper.Reset()
		if m, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return fmt.Errorf("%s %s: no such resource on this cluster: %w", gvk, o.GetName(), err)
		}
	}
	body, err := json.Marshal(o.Object)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		ns := o.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		ri = a.dyn.Resource(m.Resource).Namespace(ns)
	}
	force := true
	// Webhooks may answer a moment after their Deployment becomes
	// Available; retry such transient refusals briefly.
	return wait.PollUntilContextTimeout(ctx, time.Second, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
		if err == nil {
			return true, nil
		}
		if isTransient(err) {
			a.log.Printf("   retrying apply of %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			return false, nil
		}
		return false, fmt.Errorf("apply %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
	})
}

func isTransient(err error) bool {
	msg := err.Error()
	for _, s := range []string{"failed calling webhook", "connection refused", "no endpoints available", "the server is currently unable", "i/o timeout"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func (a *Applier) waitEstablished(ctx context.Context, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := a.dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &crd); err != nil {
			return false, err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be Established: %w", name, err)
	}
	return nil
}

// WaitDeployments waits until every Deployment in namespace is Available
// with all replicas updated, printing which ones are still pending.
func (a *Applier) WaitDeployments(ctx context.Context, namespace string, timeout time.Duration) error {
	var pending []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := a.kube.AppsV1().Deployments(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		pending = pending[:0]
		for _, d := range list.Items {
			if !available(d) {
				pending = append(pending, d.Name)
			}
		}
		return len(list.Items) > 0 && len(pending) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting %s for Deployments in %s to be Available (still pending: %v): %w", timeout, namespace, pending, err)
	}
	return nil
}

func available(d appsv1.Deployment) bool {
	if d.Status.ObservedGeneration < d.Generation || d.Spec.Replicas == nil || d.Status.UpdatedReplicas < *d.Spec.Replicas || d.Status.AvailableReplicas < *d.Spec.Replicas {
		return false
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == "True"
		}
	}
	return false
}

// Delete deletes objs (background propagation); objects or kinds the
// cluster does not have are skipped. It returns how many it deleted.
func (a *Applier) Delete(ctx context.Context, objs []*unstructured.Unstructured) (int, error) {
	deleted := 0
	a.mapper.Reset()
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			continue // the kind is not served here: nothing of it to delete
		}
		var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = a.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		policy := metav1.DeletePropagationBackground
		err = ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &policy})
		switch {
		case err == nil:
			deleted++
		case apierrors.IsNotFound(err):
		default:
			return deleted, fmt.Errorf("delete %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	return deleted, nil
}
