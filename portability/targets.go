package portability

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/install/networking"
)

// TargetsVar names a targets file: the proof runs over the targets it
// lists instead of the managed stock/lampyr pair (docs/environment.md).
const TargetsVar = "LAMPYR_PORTABILITY_TARGETS"

// DefaultNamespace is where the proof deploys on every target.
const DefaultNamespace = "portability"

// Targets is a targets file: the installations the proof compares, one
// of them the reference the others are compared with.
//
//	reference: stock
//	namespace: portability        # optional; the same on every target
//	targets:
//	- name: stock                 # an existing cluster: kubeconfig (and context), gateway, registry
//	  profile: stock
//	  kubeconfig: ~/.kube/config
//	  context: kind-stock
//	  gateway: http://127.0.0.1:31080
//	  registry: localhost:5002    # or {pull: registry.internal:5000, push: localhost:5002}
//	- name: lampyr-gw             # no kubeconfig: a Kind cluster this run creates (or reuses)
//	  profile: lampyr
//	  provider: gateway-api
type Targets struct {
	// Reference names the target every other is compared with.
	Reference string `json:"reference"`
	// Namespace the proof deploys into on every target (default
	// portability): the same on all, since hostnames carry it.
	Namespace string   `json:"namespace,omitempty"`
	Targets   []Target `json:"targets"`
	// Known are differences written down (docs/networking.md): reported
	// as "known" instead of failing the check, and failing it as stale
	// once the target answers like the reference again.
	//
	//	known:
	//	- target: stock-tk
	//	  check: domain mapping
	//	  reason: traefik-knative has no host rewrite
	Known []Known `json:"known,omitempty"`
}

// Known is one declared difference: a target's result in one check.
type Known struct {
	Target string `json:"target"`
	Check  string `json:"check"`
	Reason string `json:"reason"`
}

// ApplyKnown marks the results of check that f declares known: a
// difference or error becomes ResultKnown (passing, with the reason), and
// a declared target that answered like the reference becomes ResultStale
// (failing: remove the declaration).
func (f *Targets) ApplyKnown(check string, results []TargetResult) []TargetResult {
	if f == nil {
		return results
	}
	for _, k := range f.Known {
		if k.Check != check {
			continue
		}
		for i, r := range results {
			if r.Target != k.Target || r.Result == ResultReference {
				continue
			}
			if r.OK() {
				results[i] = TargetResult{Target: r.Target, Result: ResultStale, Detail: fmt.Sprintf(
					"%s: the targets file declares %q a known difference (%s), but %s answered like the reference: remove the declaration (and its line in docs/networking.md)", r.Target, check, k.Reason, r.Target)}
				continue
			}
			detail := k.Reason
			if r.Detail != "" {
				detail += "; this run: " + r.Detail
			}
			results[i] = TargetResult{Target: r.Target, Result: ResultKnown, Detail: detail}
		}
	}
	return results
}

// Target is one installation of a targets file.
type Target struct {
	// Name names the target in the report and in file names.
	Name string `json:"name"`
	// Profile is stock (the proof runs the runnable image) or lampyr (it
	// also builds the snapshot artifact and seals a template with ly).
	Profile string `json:"profile"`
	// Provider is the networking provider: on a managed target the one
	// installed; on an existing cluster what it runs, for the report
	// (empty: read from its config-network).
	Provider string `json:"provider,omitempty"`
	// Kubeconfig and Context address an existing cluster; without a
	// kubeconfig the target is a Kind cluster this run creates (or reuses)
	// under Name, and Gateway and Registry are the harness's.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	Context    string `json:"context,omitempty"`
	// Gateway is the Knative gateway's http://host:port.
	Gateway string `json:"gateway,omitempty"`
	// Registry is what the cluster pulls from (and where this host
	// pushes, unless it says otherwise).
	Registry *Registry `json:"registry,omitempty"`
	// Implementation and Version are reported as they are given (default:
	// knative-serving or lampyr, and the version the cluster shows).
	Implementation string `json:"implementation,omitempty"`
	Version        string `json:"version,omitempty"`
}

// Registry is a registry as the cluster pulls from it and as this host
// pushes to it (the same digests): a plain string sets both.
type Registry struct {
	Pull string `json:"pull"`
	Push string `json:"push,omitempty"`
}

// UnmarshalJSON takes "host:port" or {pull, push}.
func (r *Registry) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		r.Pull = s
		return nil
	}
	type plain Registry
	var p plain
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("registry: want host[:port] or {pull: ..., push: ...}: %w", err)
	}
	*r = Registry(p)
	return nil
}

// External reports whether the target is an existing cluster.
func (t Target) External() bool { return t.Kubeconfig != "" }

var targetName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// LoadTargets reads and checks a targets file; relative kubeconfig paths
// are relative to the file, and ~ is the home directory.
func LoadTargets(path string) (*Targets, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", TargetsVar, err)
	}
	var f Targets
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("targets %s: %w", path, err)
	}
	for i := range f.Targets {
		if kc := f.Targets[i].Kubeconfig; kc != "" {
			f.Targets[i].Kubeconfig = resolvePath(kc, filepath.Dir(path))
		}
	}
	return &f, f.Validate(path)
}

func resolvePath(p, dir string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

// Validate names the first mistake and its fix.
func (f *Targets) Validate(path string) error {
	if f.Namespace == "" {
		f.Namespace = DefaultNamespace
	}
	if len(f.Targets) < 2 {
		return fmt.Errorf("targets %s: list at least two targets (a reference and one to compare with it)", path)
	}
	seen := map[string]bool{}
	for i, t := range f.Targets {
		at := fmt.Sprintf("targets %s: targets[%d] (%s)", path, i, t.Name)
		switch {
		case !targetName.MatchString(t.Name):
			return fmt.Errorf("targets %s: targets[%d].name %q: use lowercase letters, digits and '-' (it names files and, managed, a Kind cluster)", path, i, t.Name)
		case seen[t.Name]:
			return fmt.Errorf("targets %s: targets[%d]: %s is listed twice", path, i, t.Name)
		case t.Profile != clusters.ProfileStock && t.Profile != clusters.ProfileLampyr:
			return fmt.Errorf("%s.profile %q: want stock (runs the runnable image) or lampyr (also the snapshot artifact, sealed with ly)", at, t.Profile)
		}
		seen[t.Name] = true
		if t.Provider != "" {
			if _, err := networking.Get(t.Provider); err != nil {
				return fmt.Errorf("%s.provider: %w", at, err)
			}
		}
		if !t.External() {
			if t.Context != "" || t.Gateway != "" || t.Registry != nil {
				return fmt.Errorf("%s: context, gateway and registry address an existing cluster: give its kubeconfig too, or leave them out for a Kind cluster this run manages", at)
			}
			continue
		}
		if u, err := url.Parse(t.Gateway); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%s.gateway %q: the Knative gateway's http://host:port", at, t.Gateway)
		}
		switch {
		case t.Registry == nil && t.Profile == clusters.ProfileStock:
			return fmt.Errorf("%s: registry: name the registry the cluster pulls the runnable image from (and push: where this host pushes it, if another address)", at)
		case t.Registry != nil && t.Registry.Pull == "":
			return fmt.Errorf("%s.registry.pull: empty", at)
		case t.Registry != nil && t.Profile == clusters.ProfileLampyr && t.Registry.Push != "" && t.Registry.Push != t.Registry.Pull:
			return fmt.Errorf("%s.registry: on a lampyr target ly pushes the snapshot and seals its reference under one name: leave push out (map that name for the Homes with config-lampyr home-registry-mirrors, as `ly cluster install` does for localhost:5002)", at)
		}
	}
	if !seen[f.Reference] {
		return fmt.Errorf("targets %s: reference %q: name one of the targets (the one the others are compared with)", path, f.Reference)
	}
	for i, k := range f.Known {
		at := fmt.Sprintf("targets %s: known[%d]", path, i)
		switch {
		case !seen[k.Target]:
			return fmt.Errorf("%s.target %q: name one of the targets", at, k.Target)
		case k.Target == f.Reference:
			return fmt.Errorf("%s.target %q is the reference: a known difference is another target's", at, k.Target)
		case strings.TrimSpace(k.Check) == "":
			return fmt.Errorf("%s.check: name the check as the report does (e.g. \"domain mapping\")", at)
		case strings.TrimSpace(k.Reason) == "":
			return fmt.Errorf("%s.reason: say why %s differs there (and write it down in docs/networking.md)", at, k.Target)
		}
	}
	return nil
}

// Clusters are the harness clusters of the targets, in file order.
func (f *Targets) Clusters() []harness.Cluster {
	out := make([]harness.Cluster, len(f.Targets))
	for i, t := range f.Targets {
		c := harness.Cluster{Name: t.Name, Profile: t.Profile, Provider: t.Provider}
		if t.External() {
			c.Provider = ""
			ext := &harness.External{Kubeconfig: t.Kubeconfig, Context: t.Context, Gateway: t.Gateway, Provider: t.Provider}
			if t.Registry != nil {
				ext.Registry, ext.Push = t.Registry.Pull, t.Registry.Push
			}
			c.External = ext
		}
		out[i] = c
	}
	return out
}

// ByName is the target named name.
func (f *Targets) ByName(name string) (Target, bool) {
	for _, t := range f.Targets {
		if t.Name == name {
			return t, true
		}
	}
	return Target{}, false
}

// PairedTargets are the managed stock/lampyr pair as a targets list, stock
// the reference: the proof's default.
func PairedTargets() *Targets {
	return &Targets{Reference: "stock", Namespace: DefaultNamespace, Targets: []Target{
		{Name: "stock", Profile: clusters.ProfileStock},
		{Name: "lampyr", Profile: clusters.ProfileLampyr},
	}}
}

// ChooseTargets is the targets file named by the knob, else the pair.
func ChooseTargets(path string) (*Targets, error) {
	if path == "" {
		return PairedTargets(), nil
	}
	return LoadTargets(path)
}
