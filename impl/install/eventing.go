package install

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/image"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/install/apply"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/progress"
)

// EventingImages builds Knative Eventing's images from the pinned module the
// way ServingImages builds Serving's (one scratch-module build of every
// command, cached by version; ko's layout), and returns ko import path ->
// digest reference.
func EventingImages(ctx context.Context, p *publish.Publisher) (map[string]string, error) {
	spec := EventingBuildSpec()
	var imgs []publish.Image
	for _, pkg := range spec.Packages {
		imgs = append(imgs, publish.Image{Package: pkg, Repo: "knative-eventing/" + pkg[len(knative.EventingModule)+len("/cmd/"):], Options: image.Options{}})
	}
	return p.Publish(ctx, spec, imgs)
}

// EventingBuildSpec is the one build of every command the eventing release
// names: a scratch module at the pinned version, so eventing's own go.mod
// decides its dependencies and this repository's go.mod is untouched.
func EventingBuildSpec() gobuild.Spec {
	return gobuild.Spec{Name: "knative-eventing", Module: knative.EventingModule, Version: knative.EventingVersion, LDFlags: "-s -w", Packages: knative.EventingPackages()}
}

// EventingObjects renders Knative Eventing (core, MT channel-based Broker,
// InMemoryChannel) from the pinned module with images resolved and CPU
// requests capped to knative.EventingCPURequest (the one change). Both
// profiles get the same objects: Eventing is unchanged on Lampyr, it only
// delivers to Addressables, which Lampyr Services are.
func EventingObjects(ctx context.Context, images map[string]string) ([]*unstructured.Unstructured, error) {
	if err := knative.EventingPinsServingPkg(ctx); err != nil {
		return nil, err
	}
	src, err := knative.EventingSources(ctx)
	if err != nil {
		return nil, err
	}
	objs, err := knative.Parse(src)
	if err != nil {
		return nil, err
	}
	if err := knative.ResolveImages(objs, images); err != nil {
		return nil, err
	}
	if _, err := knative.CapCPURequests(objs, knative.EventingCPURequest); err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o.Unstructured
	}
	return out, nil
}

// InstallEventing adds Knative Eventing to a cluster that has a profile
// installed (stock or lampyr) and waits for its Deployments. It is optional
// and touches nothing of Serving's. Idempotent (server-side apply).
func InstallEventing(ctx context.Context, c *Clients, p *publish.Publisher, log *progress.Log, timeout time.Duration) error {
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	images, err := EventingImages(ctx, p)
	if err != nil {
		return err
	}
	var objs []*unstructured.Unstructured
	err = log.Step(fmt.Sprintf("Rendering Knative Eventing %s (core, MT channel-based Broker, InMemoryChannel)", knative.EventingVersion), func() error {
		objs, err = EventingObjects(ctx, images)
		if err == nil {
			var ko []knative.Object
			for _, o := range objs {
				ko = append(ko, knative.Object{Unstructured: o})
			}
			log.Printf("   %s", knative.Kinds(ko))
		}
		return err
	})
	if err != nil {
		return err
	}
	a, err := apply.New(c.Config, log)
	if err != nil {
		return err
	}
	if err := log.Step(fmt.Sprintf("Applying %d Eventing objects (server-side)", len(objs)), func() error { return a.Apply(ctx, objs) }); err != nil {
		return err
	}
	return log.Step("Waiting for Deployments in "+knative.EventingNamespace, func() error {
		return a.WaitDeployments(ctx, knative.EventingNamespace, timeout)
	})
}
