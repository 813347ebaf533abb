package ly

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/contract"
)

// Annotations and labels ly writes (docs/contracts.md §7).
const (
	AnnotationMaxScale     = "autoscaling.knative.dev/max-scale"
	LabelVisibility        = "networking.knative.dev/visibility"
	VisibilityClusterLocal = "cluster-local"
)

// TrafficTarget is one --traffic entry.
type TrafficTarget struct {
	Revision string // "" with Latest
	Latest   bool
	Percent  int64
}

// ParseTraffic parses --traffic "rev=percent,...": revision names or
// @latest, whole percentages summing to 100.
func ParseTraffic(s string) ([]TrafficTarget, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []TrafficTarget
	var total int64
	seen := map[string]bool{}
	for _, e := range strings.Split(s, ",") {
		rev, pct, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok || rev == "" {
			return nil, fmt.Errorf("--traffic entry %q: want REVISION=PERCENT (or @latest=PERCENT), e.g. hello-00001=90,@latest=10", e)
		}
		n, err := strconv.ParseInt(pct, 10, 64)
		if err != nil || n < 0 || n > 100 {
			return nil, fmt.Errorf("--traffic entry %q: percent must be a whole number 0-100", e)
		}
		if seen[rev] {
			return nil, fmt.Errorf("--traffic names %s twice", rev)
		}
		seen[rev] = true
		total += n
		if rev == "@latest" {
			out = append(out, TrafficTarget{Latest: true, Percent: n})
		} else {
			out = append(out, TrafficTarget{Revision: rev, Percent: n})
		}
	}
	if total != 100 {
		return nil, fmt.Errorf("--traffic percentages add up to %d, want 100", total)
	}
	return out, nil
}

// ServiceInputs are what the Service manifest needs besides lampyr.yaml.
type ServiceInputs struct {
	Namespace string
	// Image is the container image, digest-pinned. `ly deploy` passes the
	// snapshot artifact (seed 002: its digest in both fields); the
	// portability proof passes a runnable image.
	Image string
	// Snapshot and Template are digest-pinned references.
	Snapshot string
	Template string
	// Public: listed in the workspace's ingress.services.
	Public  bool
	Traffic []TrafficTarget
}

// ServiceManifest is the Knative Service for a project: only fields the
// Lampyr template subset accepts (docs/contracts.md §7), so the same object
// is valid on stock Knative.
func ServiceManifest(p *Project, in ServiceInputs) *unstructured.Unstructured {
	ann := map[string]any{
		contract.SnapshotArtifactAnnotation: in.Snapshot,
		contract.FiberdTemplateAnnotation:   in.Template,
	}
	if p.Execution.Mode == "reuse" {
		ann[contract.ExecutionModeAnnotation] = "reuse"
		ann[contract.IdleTimeoutAnnotation] = p.Execution.IdleTimeout
		if p.Execution.IdleAction != "" {
			ann[contract.IdleActionAnnotation] = p.Execution.IdleAction
		}
	}
	if p.MaxScale != nil {
		ann[AnnotationMaxScale] = strconv.Itoa(int(*p.MaxScale))
	}
	port := map[string]any{"containerPort": int64(p.Port)}
	if p.Protocol == "h2c" {
		port["name"] = "h2c"
	}
	container := map[string]any{
		"image": in.Image,
		"ports": []any{port},
	}
	if p.Memory != "" {
		container["resources"] = map[string]any{"requests": map[string]any{"memory": p.Memory}}
	}
	tspec := map[string]any{
		"containerConcurrency": int64(1),
		"containers":           []any{container},
	}
	if p.TimeoutSeconds != nil {
		tspec["timeoutSeconds"] = *p.TimeoutSeconds
	}
	meta := map[string]any{"name": p.Name}
	if in.Namespace != "" {
		meta["namespace"] = in.Namespace
	}
	if !in.Public {
		meta["labels"] = map[string]any{LabelVisibility: VisibilityClusterLocal}
	}
	spec := map[string]any{
		"template": map[string]any{
			"metadata": map[string]any{"annotations": ann},
			"spec":     tspec,
		},
	}
	if len(in.Traffic) > 0 {
		var ts []any
		for _, t := range in.Traffic {
			e := map[string]any{"percent": t.Percent}
			if t.Latest {
				e["latestRevision"] = true
			} else {
				e["revisionName"] = t.Revision
				e["latestRevision"] = false
			}
			ts = append(ts, e)
		}
		spec["traffic"] = ts
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "serving.knative.dev/v1",
		"kind":       "Service",
		"metadata":   meta,
		"spec":       spec,
	}}
}
