package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/install/apply"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/manifest"
	"lampyr.dev/serving/impl/progress"
)

// prepareCluster sets what the suites need and the installation does not
// have: config-lampyr settings for the run (managed Lampyr clusters),
// upstream's test namespaces and resources, and upstream's test value of
// config-deployment progress-deadline (managed clusters; a third-party
// cluster is told).
func (r *runner) prepareCluster(ctx context.Context) error {
	o, rep, c, log := r.o, r.rep, r.c, r.log
	if o.cluster != "" && r.profile == "lampyr" && o.lampyrConfig != "" {
		data := map[string]string{}
		for _, kv := range strings.Split(o.lampyrConfig, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || k == "" {
				return usageError(fmt.Errorf("--lampyr-config %q: want key=value,... (e.g. default-memory-per-fiber=64Mi)", kv))
			}
			data[k] = v
		}
		patch, _ := json.Marshal(map[string]any{"data": data})
		if _, err := c.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Patch(ctx, contract.ConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "knative-conformance"}); err != nil {
			return fmt.Errorf("setting config-lampyr %s: %w", o.lampyrConfig, err)
		}
		rep.TestConfig = append(rep.TestConfig, "lampyr-system/config-lampyr "+o.lampyrConfig+" (the suites keep many Revisions alive at once and send 200 concurrent requests to one; the test images need far less than 256Mi per fiber)")
		log.Printf(" ✓ config-lampyr %s for the run", o.lampyrConfig)
	}

	// The namespaces, ConfigMap and Secret the suites expect (upstream's
	// test/config, read from the pinned module).
	if err := applyTestResources(ctx, c, log); err != nil {
		return err
	}
	// Upstream's own test installation (test/config/ytt/core) shortens
	// config-deployment's progress-deadline to 120s: with the 600s default
	// a crashing Revision is not failed before the suites' 10-minute poll
	// ends (TestContainerExitingMsg). Managed clusters get the same; a
	// third-party cluster is told.
	if o.cluster != "" {
		patch := []byte(`{"data":{"progress-deadline":"120s"}}`)
		if _, err := c.Kube.CoreV1().ConfigMaps("knative-serving").Patch(ctx, "config-deployment", types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "knative-conformance"}); err != nil {
			return fmt.Errorf("setting config-deployment progress-deadline to upstream's test value: %w", err)
		}
		rep.TestConfig = append(rep.TestConfig, "knative-serving/config-deployment progress-deadline: 120s (upstream test/config/ytt/core/overlay-config-deployment.yaml)")
		log.Printf(" ✓ config-deployment progress-deadline: 120s, as upstream's test installation sets it")
	} else {
		log.Printf(" • upstream's test installation sets config-deployment progress-deadline: 120s; with the 600s default TestContainerExitingMsg times out")
	}
	return nil
}

// applyTestResources applies upstream's test/config/{cluster,test}-resources.yaml.
func applyTestResources(ctx context.Context, c *e2eutil.Clients, log *progress.Log) error {
	serving, err := gobuild.Download(ctx, knative.ServingModule, knative.ServingVersion)
	if err != nil {
		return err
	}
	var objs []*unstructured.Unstructured
	for _, f := range []string{"cluster-resources.yaml", "test-resources.yaml"} {
		b, err := os.ReadFile(filepath.Join(serving.Dir, "test", "config", f))
		if err != nil {
			return err
		}
		o, err := manifest.Parse(b)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		objs = append(objs, o...)
	}
	a, err := apply.New(c.Config, log)
	if err != nil {
		return err
	}
	return log.Step(fmt.Sprintf("Applying upstream test resources (%d objects)", len(objs)), func() error { return a.Apply(ctx, objs) })
}
