// Package install puts an install profile on a cluster: Knative Serving
// rendered from the pinned module (impl/install/knative), a networking
// provider (impl/install/networking) and, for the lampyr profile, Lampyr's
// own components. Images are built (impl/build) and pulled by digest from
// the local registry. Installer (installer.go) holds the install policy:
// the registry and its in-cluster mirror, the Revision backend strategy per
// provider (BackendStrategyFor) and the sealer identity a new installation
// trusts. `ly cluster install` uses it directly, and the cluster framework
// through clusters.Env; it takes its own Clients and reads no environment
// variable: the commands fill Installer at their edge (installenv and
// LampyrSourcesFrom in ly, clusters/environ in the framework). Nothing here
// imports the framework under clusters/ (imports_test.go).
package install

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/image"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/install/apply"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/progress"
)

// ServingCommands are the knative.dev/serving commands a release builds.
var ServingCommands = []string{"controller", "webhook", "activator", "autoscaler", "queue"}

// ServingImages builds Knative Serving's images from the pinned module, as
// its release does (ko: static binary, non-root, /ko-app/<name>), and
// returns ko import path -> digest reference.
func ServingImages(ctx context.Context, p *publish.Publisher) (map[string]string, error) {
	return ServingImagesAt(ctx, p, knative.ServingVersion)
}

// ServingImagesAt is ServingImages for another version of the serving
// module (Options.ServingVersion).
func ServingImagesAt(ctx context.Context, p *publish.Publisher, version string) (map[string]string, error) {
	subst, err := knative.Substitutes(ctx, version)
	if err != nil {
		return nil, err
	}
	spec := ServingSpecAt(version, subst)
	var imgs []publish.Image
	for _, pkg := range spec.Packages {
		imgs = append(imgs, publish.Image{Package: pkg, Repo: "knative-serving/" + path.Base(pkg), Options: image.Options{}})
	}
	return p.Publish(ctx, spec, imgs)
}

// ServingSpec is the one build of Knative Serving's commands.
func ServingSpec() gobuild.Spec { return ServingSpecAt(knative.ServingVersion, nil) }

// ServingSpecAt is ServingSpec for another version of the serving module,
// with the modules the proxy does not serve replaced (knative.Substitutes).
func ServingSpecAt(version string, replace map[string]string) gobuild.Spec {
	spec := gobuild.Spec{Name: "knative-serving", Module: knative.ServingModule, Version: version, LDFlags: "-s -w", Replace: replace}
	for _, c := range ServingCommands {
		spec.Packages = append(spec.Packages, knative.ServingModule+"/cmd/"+c)
	}
	return spec
}

// Options for an install.
type Options struct {
	Profile  knative.Profile
	Provider networking.Provider
	// NodePort is the gateway's public NodePort.
	NodePort int
	// Domain for config-domain; empty keeps Knative's example.com.
	Domain string
	// Extra are more objects to apply after Knative (Lampyr's components).
	Extra []*unstructured.Unstructured
	// Timeout bounds the wait for Deployments.
	Timeout time.Duration
	// Online says upstream registries are reachable, so providers that pull
	// images (kourier's Envoy) may be installed; offline is the default.
	// The callers set it from LAMPYR_ONLINE=1 (EnvOnline).
	Online bool
	// ServingVersion installs another version of the knative.dev/serving
	// module than the pinned knative.ServingVersion (empty: the pinned one).
	// Stock profile only: Lampyr is built against the pinned API. The
	// operations suite's upgrade scenario uses it for stock's reference
	// upgrade, one minor version back and forth.
	ServingVersion string
}

func (o Options) servingVersion() string {
	if o.ServingVersion != "" {
		return o.ServingVersion
	}
	return knative.ServingVersion
}

// EnvOnline (LAMPYR_ONLINE=1) is where the commands and the suites take
// Options.Online from: the operator says upstream registries are reachable.
const EnvOnline = "LAMPYR_ONLINE"

// Install renders and applies a profile, then waits for every Deployment of
// Knative and the provider to be Available.
func Install(ctx context.Context, c *Clients, p *publish.Publisher, log *progress.Log, o Options) error {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if why := o.Provider.NeedsRegistry(); why != "" && !o.Online {
		return fmt.Errorf("networking provider %s cannot be installed here: %s (set %s=1 where upstream registries are reachable)", o.Provider.Name(), why, EnvOnline)
	}
	version := o.servingVersion()
	if version != knative.ServingVersion && o.Profile != knative.Stock {
		return fmt.Errorf("Knative Serving %s: only the stock profile installs another version than the pinned %s (the %s profile is built against the pinned API)", version, knative.ServingVersion, o.Profile)
	}
	images, err := ServingImagesAt(ctx, p, version)
	if err != nil {
		return err
	}
	provImages, err := o.Provider.Publish(ctx, p)
	if err != nil {
		return err
	}
	var objs []knative.Object
	err = log.Step(fmt.Sprintf("Rendering Knative Serving %s (%s profile)", version, o.Profile), func() error {
		src, err := knative.SourcesAt(ctx, version)
		if err != nil {
			return err
		}
		all, err := knative.Parse(src)
		if err != nil {
			return err
		}
		if err := knative.ResolveImages(all, images); err != nil {
			return err
		}
		if err := knative.ApplySettings(all, knative.ProfileSettings(o.Profile, knative.Settings{IngressClass: o.Provider.IngressClass(), Domain: o.Domain})); err != nil {
			return err
		}
		kept, excluded, err := knative.Filter(all, o.Profile)
		if err != nil {
			return err
		}
		objs = kept
		log.Printf("   %s", knative.Kinds(kept))
		if len(excluded) > 0 {
			log.Printf("   filtered out before apply: %d objects (stock controller, activator, autoscaler and their support)", len(excluded))
		}
		return nil
	})
	if err != nil {
		return err
	}
	prov, err := o.Provider.Manifests(provImages, o.Provider.Gateway(o.NodePort))
	if err != nil {
		return err
	}
	if err := labelGatewayNamespace(prov, o.Provider.Gateway(o.NodePort).Namespace); err != nil {
		return err
	}
	a, err := apply.New(c.Config, log)
	if err != nil {
		return err
	}
	sw, err := switchProvider(ctx, c, a, log, o.Provider, o.NodePort)
	if err != nil {
		return err
	}
	var all []*unstructured.Unstructured
	for _, k := range objs {
		all = append(all, k.Unstructured)
	}
	all = append(all, prov...)
	all = append(all, o.Extra...)
	if err := log.Step(fmt.Sprintf("Applying %d objects (server-side)", len(all)), func() error { return a.Apply(ctx, all) }); err != nil {
		return err
	}
	namespaces := []string{knative.Namespace, o.Provider.Gateway(o.NodePort).Namespace}
	for _, x := range o.Extra {
		if x.GetKind() == "Deployment" {
			namespaces = append(namespaces, x.GetNamespace())
		}
	}
	seen := map[string]bool{}
	for _, ns := range namespaces {
		if seen[ns] {
			continue
		}
		seen[ns] = true
		if err := log.Step("Waiting for Deployments in "+ns, func() error { return a.WaitDeployments(ctx, ns, o.Timeout) }); err != nil {
			return err
		}
	}
	return sw.releaseIngresses(ctx, c, log)
}

// InstalledProvider returns the networking provider a cluster's Knative
// installation uses, from config-network's ingress-class; nil (and no
// error) when Knative is not installed or the class is not one of ours.
func InstalledProvider(ctx context.Context, c *Clients) (networking.Provider, error) {
	cm, err := c.Kube.CoreV1().ConfigMaps(knative.Namespace).Get(ctx, "config-network", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s/config-network: %w", knative.Namespace, err)
	}
	p, _ := networking.ForIngressClass(cm.Data["ingress-class"])
	return p, nil
}

// providerSwitch is a switch from one networking provider to another, in
// progress; nil when there is none.
type providerSwitch struct {
	from, to networking.Provider
	deleted  []*unstructured.Unstructured
}

// switchProvider removes what another networking provider installed on
// this cluster renders and the new one does not (a reused cluster
// installed with another provider, or the feasibility gate moving to the
// next provider); objects both render are replaced by the apply.
func switchProvider(ctx context.Context, c *Clients, a *apply.Applier, log *progress.Log, to networking.Provider, nodePort int) (*providerSwitch, error) {
	from, err := InstalledProvider(ctx, c)
	if err != nil || from == nil || from.Name() == to.Name() {
		return nil, err
	}
	sw := &providerSwitch{from: from, to: to}
	return sw, log.Step(fmt.Sprintf("Switching networking from %s to %s: deleting what only %s installed", from.Name(), to.Name(), from.Name()), func() error {
		left, err := networking.Leftovers(from, to, from.Gateway(nodePort))
		if err != nil {
			return err
		}
		n, err := a.Delete(ctx, left)
		log.Printf("   deleted %d of %d objects", n, len(left))
		sw.deleted = left
		return err
	})
}

// ingressClassAnnotation is where a KIngress names its class.
const ingressClassAnnotation = "networking.knative.dev/ingress.class"

// releaseIngresses removes the finalizer the previous provider's
// controller put on KIngresses, once that controller is gone: nothing else
// removes it, and such a KIngress, and with it its namespace, could never
// be deleted (measured: a namespace switched from gateway-api to
// traefik-knative stayed Terminating on its KIngresses). A KIngress of the
// new provider's class keeps it if the new provider uses the same one.
func (sw *providerSwitch) releaseIngresses(ctx context.Context, c *Clients, log *progress.Log) error {
	if sw == nil {
		return nil
	}
	fin := networking.IngressFinalizer(sw.from)
	if fin == "" {
		return nil
	}
	return log.Step(fmt.Sprintf("Releasing KIngresses from %s's finalizer %s", sw.from.Name(), fin), func() error {
		// The old controller must be gone first, or it could put the
		// finalizer back.
		for _, d := range sw.deleted {
			if d.GetKind() != "Deployment" {
				continue
			}
			sel, _, _ := unstructured.NestedStringMap(d.Object, "spec", "selector", "matchLabels")
			err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
				pods, err := c.Kube.CoreV1().Pods(d.GetNamespace()).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(sel).String()})
				return err == nil && len(pods.Items) == 0, nil
			})
			if err != nil {
				return fmt.Errorf("waiting 2m for the Pods of %s's Deployment %s/%s to be gone: %w", sw.from.Name(), d.GetNamespace(), d.GetName(), err)
			}
		}
		list, err := c.Dynamic.Resource(kingresses).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		released := 0
		for _, ing := range list.Items {
			if !slices.Contains(ing.GetFinalizers(), fin) {
				continue
			}
			if ing.GetAnnotations()[ingressClassAnnotation] == sw.to.IngressClass() && networking.IngressFinalizer(sw.to) == fin {
				continue // the new provider finalizes it itself
			}
			kept := slices.DeleteFunc(slices.Clone(ing.GetFinalizers()), func(f string) bool { return f == fin })
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": kept, "resourceVersion": ing.GetResourceVersion()}})
			if _, err := c.Dynamic.Resource(kingresses).Namespace(ing.GetNamespace()).Patch(ctx, ing.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("removing finalizer %s from KIngress %s/%s: %w", fin, ing.GetNamespace(), ing.GetName(), err)
			}
			released++
		}
		log.Printf("   %d of %d KIngresses released", released, len(list.Items))
		return nil
	})
}

// GatewayNamespaceLabel marks the namespace of the gateway's data plane:
// Lampyr's NetworkPolicies admit requests to fiber-router from it only
// (impl/config/networkpolicy). Tenants cannot label namespaces.
const GatewayNamespaceLabel = "lampyr.dev/gateway"

// labelGatewayNamespace labels the provider's gateway namespace (among its
// manifests) with GatewayNamespaceLabel; on stock clusters the label is
// harmless, on Lampyr ones it is what lets the gateway reach fiber-router.
func labelGatewayNamespace(objs []*unstructured.Unstructured, ns string) error {
	for _, o := range objs {
		if o.GetKind() == "Namespace" && o.GetName() == ns {
			l := o.GetLabels()
			if l == nil {
				l = map[string]string{}
			}
			l[GatewayNamespaceLabel] = "true"
			o.SetLabels(l)
			return nil
		}
	}
	return fmt.Errorf("the networking provider's manifests have no Namespace %s to label %s=true (fiber-router's NetworkPolicy admits the gateway by that label)", ns, GatewayNamespaceLabel)
}
