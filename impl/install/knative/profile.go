package knative

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Profile is an install profile.
type Profile string

const (
	// Stock is upstream Knative Serving as its release installs it.
	Stock Profile = "stock"
	// Lampyr is upstream's public API surface without the Pod-based
	// Revision machinery; Lampyr's own components are added by the caller.
	Lampyr Profile = "lampyr"
)

// Namespace is where Knative Serving's system components run.
const Namespace = "knative-serving"

// objectKey names an object as kind/namespace/name.
func objectKey(o *unstructured.Unstructured) string {
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}

// lampyrExcluded are the stock controller, activator, autoscaler and their
// support resources: Lampyr never installs them (seed 000, "Controller
// distribution": filtered before apply, never installed then disabled). The
// webhook, which runs as the "controller" ServiceAccount, stays.
var lampyrExcluded = map[string]string{
	"Deployment/knative-serving/controller":                 "the stock controller runs the Pod-based Revision and SKS reconcilers; Lampyr runs its own controller",
	"Service/knative-serving/controller":                    "metrics Service of the stock controller",
	"Deployment/knative-serving/activator":                  "no activator: fiber-router is the data plane",
	"Service/knative-serving/activator-service":             "activator's Service",
	"HorizontalPodAutoscaler/knative-serving/activator":     "activator's HPA",
	"PodDisruptionBudget/knative-serving/activator-pdb":     "activator's PDB",
	"ServiceAccount/knative-serving/activator":              "activator's identity",
	"Role/knative-serving/knative-serving-activator":        "activator's RBAC",
	"RoleBinding/knative-serving/knative-serving-activator": "activator's RBAC",
	"ClusterRole//knative-serving-activator-cluster":        "activator's RBAC",
	"ClusterRoleBinding//knative-serving-activator-cluster": "activator's RBAC",
	"Deployment/knative-serving/autoscaler":                 "no KPA: max-scale is enforced per fiber by fiber-router and fiberd",
	"Service/knative-serving/autoscaler":                    "autoscaler's Service",
	"Image/knative-serving/queue-proxy":                     "no queue-proxy sidecar to pre-cache",
}

// Filter returns the objects of a profile, and (for lampyr) the excluded
// ones with the reason each is excluded.
func Filter(objs []Object, p Profile) (kept []Object, excluded map[string]string, err error) {
	switch p {
	case Stock:
		return objs, nil, nil
	case Lampyr:
	default:
		return nil, nil, fmt.Errorf("unknown profile %q: want %q or %q", p, Stock, Lampyr)
	}
	excluded = map[string]string{}
	for _, o := range objs {
		k := objectKey(o.Unstructured)
		if why, ok := lampyrExcluded[k]; ok {
			excluded[k] = why
			continue
		}
		kept = append(kept, o)
	}
	// Every exclusion must have matched: a renamed upstream object must not
	// slip into the lampyr profile unnoticed.
	for k := range lampyrExcluded {
		if _, ok := excluded[k]; !ok {
			return nil, nil, fmt.Errorf("lampyr profile: %s is no longer in %s@%s; update the exclusion list", k, ServingModule, ServingVersion)
		}
	}
	return kept, excluded, nil
}

// Settings are the documented, code-level patches applied to upstream's
// configuration: nothing else is changed.
type Settings struct {
	// IngressClass goes to config-network's ingress-class.
	IngressClass string
	// Domain replaces config-domain's example domain (empty keeps it).
	Domain string
	// ContainerConcurrency, when set, is config-defaults'
	// container-concurrency: the value the webhook writes into a Revision
	// that does not say. The lampyr profile sets "1", the only value Lampyr
	// runs (one request per fiber): a Service that leaves it unset is then
	// defaulted to what Lampyr runs instead of refused
	// (UnsupportedContainerConcurrency), as Knative's own conformance suites
	// leave it. A Service that says 0 is still refused.
	ContainerConcurrency string
}

// ProfileSettings adds a profile's own settings to s.
func ProfileSettings(p Profile, s Settings) Settings {
	if p == Lampyr {
		s.ContainerConcurrency = "1"
	}
	return s
}

// ApplySettings patches config-network, config-domain and config-defaults.
func ApplySettings(objs []Object, s Settings) error {
	patched := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetNamespace() != Namespace {
			continue
		}
		switch o.GetName() {
		case "config-network":
			if s.IngressClass != "" {
				if err := unstructured.SetNestedField(o.Object, s.IngressClass, "data", "ingress-class"); err != nil {
					return err
				}
			}
			patched["config-network"] = true
		case "config-domain":
			if s.Domain != "" {
				if err := unstructured.SetNestedStringMap(o.Object, map[string]string{s.Domain: ""}, "data"); err != nil {
					return err
				}
			}
			patched["config-domain"] = true
		case "config-defaults":
			if s.ContainerConcurrency != "" {
				if err := unstructured.SetNestedField(o.Object, s.ContainerConcurrency, "data", "container-concurrency"); err != nil {
					return err
				}
			}
			patched["config-defaults"] = true
		}
	}
	for _, want := range []string{"config-network", "config-domain", "config-defaults"} {
		if !patched[want] {
			return fmt.Errorf("rendered manifests have no %s/%s ConfigMap to patch", Namespace, want)
		}
	}
	return nil
}

// Kinds counts objects by kind, for progress lines and tests.
func Kinds(objs []Object) string {
	count := map[string]int{}
	var order []string
	for _, o := range objs {
		if count[o.GetKind()] == 0 {
			order = append(order, o.GetKind())
		}
		count[o.GetKind()]++
	}
	parts := make([]string, len(order))
	for i, k := range order {
		parts[i] = fmt.Sprintf("%d %s", count[k], k)
	}
	return strings.Join(parts, ", ")
}
