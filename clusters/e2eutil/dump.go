// Package e2eutil holds what every cluster suite needs: clients from a
// cluster's kubeconfig, waits that name what they waited for, and failure
// dumps (conditions, events, pod logs) into an artifacts folder.
package e2eutil

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/contract"
)

// Clients bundles the clients of one cluster.
type Clients struct {
	Config  *rest.Config
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
}

// NewClients loads a kubeconfig file.
func NewClients(kubeconfig string) (*Clients, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return ClientsFor(cfg)
}

// ClientsFor makes the typed and dynamic clients for cfg.
func ClientsFor(cfg *rest.Config) (*Clients, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Clients{Config: cfg, Kube: kube, Dynamic: dyn}, nil
}

// DumpResources are the custom resources a dump lists with their status.
var DumpResources = []schema.GroupVersionResource{
	{Group: "serving.knative.dev", Version: "v1", Resource: "services"},
	{Group: "serving.knative.dev", Version: "v1", Resource: "configurations"},
	{Group: "serving.knative.dev", Version: "v1", Resource: "revisions"},
	{Group: "serving.knative.dev", Version: "v1", Resource: "routes"},
	{Group: "networking.internal.knative.dev", Version: "v1alpha1", Resource: "ingresses"},
	{Group: "networking.internal.knative.dev", Version: "v1alpha1", Resource: "serverlessservices"},
	contract.CapacityGrants,
	// The gateway-api networking provider's objects.
	{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"},
	{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"},
	{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gatewayclasses"},
}

// Dump writes, under dir, every namespace's events, pods (with status) and
// container logs (current and previous), Deployments, Services and the
// Knative/Lampyr resources above. It keeps going past errors and returns the
// first one.
func Dump(ctx context.Context, c *Clients, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	nss, err := c.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		nsDir := filepath.Join(dir, ns.Name)
		keep(os.MkdirAll(nsDir, 0o755))
		if ev, err := c.Kube.CoreV1().Events(ns.Name).List(ctx, metav1.ListOptions{}); err == nil {
			sort.Slice(ev.Items, func(i, j int) bool { return ev.Items[i].LastTimestamp.Before(&ev.Items[j].LastTimestamp) })
			var b strings.Builder
			for _, e := range ev.Items {
				fmt.Fprintf(&b, "%s %s %s/%s %s: %s\n", e.LastTimestamp.Format("15:04:05"), e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			}
			keep(os.WriteFile(filepath.Join(nsDir, "events.txt"), []byte(b.String()), 0o644))
		} else {
			keep(err)
		}
		pods, err := c.Kube.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{})
		if err != nil {
			keep(err)
			continue
		}
		keep(writeYAML(filepath.Join(nsDir, "pods.yaml"), pods))
		for _, p := range pods.Items {
			for _, ctr := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				for _, previous := range []bool{false, true} {
					name := fmt.Sprintf("%s_%s.log", p.Name, ctr.Name)
					if previous {
						name = fmt.Sprintf("%s_%s.previous.log", p.Name, ctr.Name)
					}
					keep(podLog(ctx, c, p, ctr.Name, previous, filepath.Join(nsDir, name)))
				}
			}
		}
		if d, err := c.Kube.AppsV1().Deployments(ns.Name).List(ctx, metav1.ListOptions{}); err == nil {
			keep(writeYAML(filepath.Join(nsDir, "deployments.yaml"), d))
		}
		if s, err := c.Kube.CoreV1().Services(ns.Name).List(ctx, metav1.ListOptions{}); err == nil {
			keep(writeYAML(filepath.Join(nsDir, "services.yaml"), s))
		}
	}
	for _, gvr := range DumpResources {
		list, err := c.Dynamic.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue // CRD not installed on this profile
		}
		var items []unstructured.Unstructured
		items = append(items, list.Items...)
		keep(writeYAML(filepath.Join(dir, gvr.Resource+"."+gvr.Group+".yaml"), items))
	}
	return first
}

func podLog(ctx context.Context, c *Clients, p corev1.Pod, container string, previous bool, file string) error {
	rc, err := c.Kube.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container, Previous: previous}).Stream(ctx)
	if err != nil {
		return nil // no such (previous) container: nothing to dump
	}
	defer rc.Close()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, rc)
	return err
}

func writeYAML(file string, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}
