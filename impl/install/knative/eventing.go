package knative

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/build/gobuild"
)

// EventingModule and EventingVersion pin Knative Eventing 1.23, the release
// that goes with ServingVersion: its go.mod requires exactly the
// knative.dev/pkg serving pins (checked by EventingPinsServingPkg).
const (
	EventingModule  = "knative.dev/eventing"
	EventingVersion = "v0.50.0"
	// EventingNamespace is where Knative Eventing's components run.
	EventingNamespace = "knative-eventing"
)

// EventingTrees are the config/ trees of Knative Eventing's release
// eventing.yaml, in its order (hack/generate-yamls.sh: eventing-core,
// mt-channel-broker, in-memory-channel): core (CRDs, controller, webhook,
// PingSource adapter, job sink, request-reply), the multi-tenant
// channel-based Broker and the InMemoryChannel, Seed 000's development
// backend. TLS variants and post-install jobs (storage version migration,
// for upgrades) are not part of it.
var EventingTrees = []string{"config/core", "config/brokers/mt-channel-broker", "config/channels/in-memory-channel"}

// EventingCommands are the knative.dev/eventing main packages the three
// trees name as ko:// images (a test checks the list against them), with
// what each is for.
var EventingCommands = map[string]string{
	"cmd/controller":                   "eventing controller",
	"cmd/webhook":                      "eventing webhook",
	"cmd/mtping":                       "PingSource adapter (scaled up by the controller when a PingSource exists)",
	"cmd/apiserver_receive_adapter":    "ApiServerSource adapter image (controller env)",
	"cmd/jobsink":                      "JobSink",
	"cmd/requestreply":                 "RequestReply",
	"cmd/auth_proxy":                   "OIDC auth proxy image (config-features)",
	"cmd/mtchannel_broker":             "MT channel-based Broker controller",
	"cmd/broker/ingress":               "Broker ingress (events in)",
	"cmd/broker/filter":                "Broker filter (Trigger delivery, retries, dead letters)",
	"cmd/in_memory/channel_controller": "InMemoryChannel controller",
	"cmd/in_memory/channel_dispatcher": "InMemoryChannel dispatcher",
}

// EventingPackages lists EventingCommands as import paths, sorted.
func EventingPackages() []string {
	out := make([]string, 0, len(EventingCommands))
	for c := range EventingCommands {
		out = append(out, EventingModule+"/"+c)
	}
	sort.Strings(out)
	return out
}

// eventingSymlinks are files that are symlinks in upstream's config/core and
// therefore missing from the module zip (which has no symlinks); their
// targets are in the module. Without them the eventing controller never
// starts (its env reads both ConfigMaps). Two stray merge leftovers in
// mt-channel-broker (symlinks to roles/, not .yaml) are not part of ko's
// input either.
var eventingSymlinks = []struct{ path, target string }{
	{"config/core/configmaps/eventing-integrations-images.yaml", "third_party/eventing-integrations-latest/eventing-integrations-images.yaml"},
	{"config/core/configmaps/eventing-transformations-images.yaml", "third_party/eventing-integrations-latest/eventing-transformations-images.yaml"},
}

// EventingSources lists the YAML files of EventingTrees of the pinned
// eventing module plus its symlinked files, each tree sorted by path (ko's
// order), trees in release order.
func EventingSources(ctx context.Context) ([]Source, error) {
	ev, err := gobuild.Download(ctx, EventingModule, EventingVersion)
	if err != nil {
		return nil, err
	}
	var out []Source
	for _, tree := range EventingTrees {
		files, err := yamlTree(ev.Dir, EventingModule+"@"+EventingVersion, tree)
		if err != nil {
			return nil, fmt.Errorf("%s@%s %s: %w", EventingModule, EventingVersion, tree, err)
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s@%s has no YAML under %s", EventingModule, EventingVersion, tree)
		}
		for _, l := range eventingSymlinks {
			if !strings.HasPrefix(l.path, tree+"/") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(ev.Dir, filepath.FromSlash(l.target)))
			if err != nil {
				return nil, fmt.Errorf("%s (upstream symlink to %s): %w", l.path, l.target, err)
			}
			files = append(files, Source{Path: l.path, Origin: EventingModule + "@" + EventingVersion + "/" + l.target, Data: b})
		}
		sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
		out = append(out, files...)
	}
	return out, nil
}

// EventingPinsServingPkg fails unless the pinned eventing module requires
// the same knative.dev/pkg as the pinned serving module: both run in one
// cluster, share CRD conventions (duck types, Addressable) and this repository
// builds against serving's.
func EventingPinsServingPkg(ctx context.Context) error {
	ev, err := gobuild.Download(ctx, EventingModule, EventingVersion)
	if err != nil {
		return err
	}
	gomod, err := os.ReadFile(ev.GoMod)
	if err != nil {
		return err
	}
	evVersions, err := requiredVersions(gomod)
	if err != nil {
		return err
	}
	servingVersions, err := PinnedVersions(ctx)
	if err != nil {
		return err
	}
	const pkg = "knative.dev/pkg"
	if evVersions[pkg] != servingVersions[pkg] {
		return fmt.Errorf("%s@%s requires %s %s, %s@%s requires %s: pick the eventing release that goes with serving's", EventingModule, EventingVersion, pkg, evVersions[pkg], ServingModule, ServingVersion, servingVersions[pkg])
	}
	return nil
}

// EventingCPURequest caps the CPU request of every Eventing container on the
// test clusters: a Kind node on these 2-core machines already has ~1.9 CPUs
// requested by Serving (or Lampyr), networking and the NetworkPolicy
// enforcer, and upstream's requests (100-125m each) leave the Broker's Pods
// Pending ("Insufficient cpu"). Limits and everything else stay upstream's.
const EventingCPURequest = "25m"

// CapCPURequests lowers every container's CPU request in the Deployments
// and StatefulSets of objs to at most max, and returns how many it lowered.
func CapCPURequests(objs []Object, max string) (int, error) {
	limit, err := resource.ParseQuantity(max)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "StatefulSet" {
			continue
		}
		containers, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		if err != nil {
			return n, fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
		for _, c := range containers {
			m, _ := c.(map[string]any)
			req, _, _ := unstructured.NestedString(m, "resources", "requests", "cpu")
			if req == "" {
				continue
			}
			q, err := resource.ParseQuantity(req)
			if err != nil {
				return n, fmt.Errorf("%s %s: cpu request %q: %w", o.GetKind(), o.GetName(), req, err)
			}
			if q.Cmp(limit) > 0 {
				if err := unstructured.SetNestedField(m, max, "resources", "requests", "cpu"); err != nil {
					return n, err
				}
				n++
			}
		}
		if err := unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			return n, err
		}
	}
	return n, nil
}
