// Package ly is the library behind the `ly` CLI: the service project
// (lampyr.yaml and the enclosing lampyr.workspace.yaml), building and pushing
// snapshot artifacts, sealing templates, the Knative Service `ly deploy`
// applies, and the progress display.
package ly

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/trust/seal"
)

// ProjectFile is the service's own manifest; WorkspaceFile is found in the
// service directory or any parent.
const (
	ProjectFile   = "lampyr.yaml"
	WorkspaceFile = "lampyr.workspace.yaml"
)

// Project is lampyr.yaml. Every field but name has a default.
type Project struct {
	// Name of the Knative Service (a DNS-1035 label).
	Name string `json:"name"`
	// Runtime of the handler; the built-in adapter knows "go".
	Runtime string `json:"runtime,omitempty"`
	// Main is the Go package to build, relative to the service directory.
	Main string `json:"main,omitempty"`
	// Files are extra user-owned files or directories (relative paths)
	// copied into the snapshot at the same relative path under /.
	Files []string `json:"files,omitempty"`
	// Port the handler listens on ($PORT); default 8080.
	Port int32 `json:"port,omitempty"`
	// Protocol: http1 (default) or h2c (gRPC).
	Protocol string `json:"protocol,omitempty"`
	// ReadinessPath, if set, must answer 2xx before a fiber takes requests.
	ReadinessPath string `json:"readinessPath,omitempty"`
	// StartupTimeout bounds a fiber's start (Go duration; default 10s).
	StartupTimeout string `json:"startupTimeout,omitempty"`
	// Memory of each fiber (a Kubernetes quantity); default: the
	// installation's default-memory-per-fiber.
	Memory string `json:"memory,omitempty"`
	// MaxScale is the most concurrent fibers (autoscaling.knative.dev/max-scale).
	MaxScale *int32 `json:"maxScale,omitempty"`
	// TimeoutSeconds is the longest request, stream or WebSocket.
	TimeoutSeconds *int64 `json:"timeoutSeconds,omitempty"`
	// Execution is the immutable execution policy of each Revision.
	Execution Execution `json:"execution,omitempty"`
}

// Execution is lampyr.yaml's execution block (seed 002, "Execution policy").
type Execution struct {
	Mode        string `json:"mode,omitempty"`
	IdleTimeout string `json:"idleTimeout,omitempty"`
	IdleAction  string `json:"idleAction,omitempty"`
}

// Workspace is lampyr.workspace.yaml: which services are exposed outside
// the cluster.
type Workspace struct {
	Ingress struct {
		Services []string `json:"services,omitempty"`
	} `json:"ingress,omitempty"`
}

// LoadProject reads and validates dir/lampyr.yaml, filling defaults.
func LoadProject(dir string) (*Project, error) {
	path := filepath.Join(dir, ProjectFile)
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s not found: run ly in a service directory, or `ly scaffold service NAME` to create one", path)
	}
	if err != nil {
		return nil, err
	}
	p, err := ParseProject(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParseProject parses lampyr.yaml strictly (unknown fields are errors) and
// validates it.
func ParseProject(raw []byte) (*Project, error) {
	var p Project
	if err := yaml.UnmarshalStrict(raw, &p); err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	p.defaults()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

func (p *Project) defaults() {
	if p.Runtime == "" {
		p.Runtime = "go"
	}
	if p.Main == "" {
		p.Main = "."
	}
	if p.Port == 0 {
		p.Port = 8080
	}
	if p.Protocol == "" {
		p.Protocol = "http1"
	}
	if p.Execution.Mode == "" {
		p.Execution.Mode = "fresh"
	}
}

// Validate checks every field; the error lists each offending field with
// what would be accepted.
func (p *Project) Validate() error {
	var errs []string
	bad := func(field, format string, a ...any) {
		errs = append(errs, field+": "+fmt.Sprintf(format, a...))
	}
	if p.Name == "" {
		bad("name", "required (the Knative Service name, e.g. hello-edge)")
	} else if msgs := validation.IsDNS1035Label(p.Name); len(msgs) > 0 {
		bad("name", "%q is not a valid Service name: %s", p.Name, strings.Join(msgs, "; "))
	}
	if p.Runtime != "go" {
		bad("runtime", "%q: the built-in adapter builds go handlers only", p.Runtime)
	}
	if filepath.IsAbs(p.Main) {
		bad("main", "%q: want a Go package path relative to the service directory, e.g. ./cmd/server", p.Main)
	}
	for i, f := range p.Files {
		if filepath.IsAbs(f) || strings.HasPrefix(filepath.Clean(f), "..") || filepath.Clean(f) == "." {
			bad(fmt.Sprintf("files[%d]", i), "%q: want a path inside the service directory", f)
		}
	}
	if p.Port < 1 || p.Port > 65535 {
		bad("port", "%d: want 1-65535", p.Port)
	}
	if p.Protocol != "http1" && p.Protocol != "h2c" {
		bad("protocol", "%q: want http1 or h2c", p.Protocol)
	}
	if p.ReadinessPath != "" && !strings.HasPrefix(p.ReadinessPath, "/") {
		bad("readinessPath", "%q: want an absolute path such as /healthz", p.ReadinessPath)
	}
	if p.StartupTimeout != "" {
		if d, err := time.ParseDuration(p.StartupTimeout); err != nil || d <= 0 || d > 10*time.Minute {
			bad("startupTimeout", "%q: want a Go duration between 1s and 10m, e.g. 10s", p.StartupTimeout)
		}
	}
	if p.Memory != "" {
		if q, err := resource.ParseQuantity(p.Memory); err != nil || q.Sign() <= 0 {
			bad("memory", "%q: want a positive quantity such as 128Mi", p.Memory)
		}
	}
	if p.MaxScale != nil && (*p.MaxScale < 0 || *p.MaxScale > 10000) {
		bad("maxScale", "%d: want 0-10000 (0: the installation's default)", *p.MaxScale)
	}
	if p.TimeoutSeconds != nil && (*p.TimeoutSeconds < 1 || *p.TimeoutSeconds > 86400) {
		bad("timeoutSeconds", "%d: want 1-86400", *p.TimeoutSeconds)
	}
	e := p.Execution
	switch e.Mode {
	case "fresh":
		if e.IdleTimeout != "" || e.IdleAction != "" {
			bad("execution", "idleTimeout and idleAction apply only to mode: reuse")
		}
	case "reuse":
		if e.IdleTimeout == "" {
			bad("execution.idleTimeout", "required with mode: reuse, e.g. 30s")
		} else if d, err := time.ParseDuration(e.IdleTimeout); err != nil || d <= 0 || d > 24*time.Hour {
			bad("execution.idleTimeout", "%q: want a Go duration up to 24h, e.g. 30s", e.IdleTimeout)
		}
		switch e.IdleAction {
		case "", "release":
		case "park", "resume":
			bad("execution.idleAction", "%q: park/resume is not supported; use release (idle fibers are released and the next request starts from the snapshot)", e.IdleAction)
		default:
			bad("execution.idleAction", "%q: want release", e.IdleAction)
		}
	default:
		bad("execution.mode", "%q: want fresh (a new fiber per request) or reuse", e.Mode)
	}
	if len(errs) > 0 {
		return errors.New("invalid lampyr.yaml: " + strings.Join(errs, "; "))
	}
	return nil
}

// Policy is the execution policy as sealed into the template and written
// into the Revision's annotations.
func (p *Project) Policy() seal.ExecutionPolicy {
	ep := seal.ExecutionPolicy{Mode: p.Execution.Mode}
	if p.Execution.Mode == "reuse" {
		d, _ := time.ParseDuration(p.Execution.IdleTimeout)
		ep.IdleTimeoutSeconds = int64((d + time.Second - 1) / time.Second)
		ep.IdleAction = p.Execution.IdleAction
	}
	return ep
}

// FindWorkspace looks for lampyr.workspace.yaml in dir and its parents; it
// returns nil (no workspace) when there is none.
func FindWorkspace(dir string) (*Workspace, string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, "", err
	}
	for d := abs; ; d = filepath.Dir(d) {
		path := filepath.Join(d, WorkspaceFile)
		raw, err := os.ReadFile(path)
		if err == nil {
			var w Workspace
			if err := yaml.UnmarshalStrict(raw, &w); err != nil {
				return nil, path, fmt.Errorf("%s: %w", path, err)
			}
			return &w, path, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, path, err
		}
		if filepath.Dir(d) == d {
			return nil, "", nil
		}
	}
}

// Public reports whether the workspace exposes service outside the cluster
// (listed in ingress.services). No workspace: cluster-local.
func (w *Workspace) Public(service string) bool {
	if w == nil {
		return false
	}
	for _, s := range w.Ingress.Services {
		if s == service {
			return true
		}
	}
	return false
}
