package portability

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/onsi/ginkgo/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/ly"
)

// Fixture is a ly service directory of this repository, deployed as its
// own Knative Service on both sides of a Pair.
type Fixture struct {
	Name string
	Dir  string // relative to the repository root
	// Snapshot and Template are what Seal got from `ly deploy`.
	Snapshot, Template string
	// Sealed is what Fleet.Seal got from `ly deploy` on each lampyr
	// target, by target name (each target seals to its own fleet key).
	Sealed map[string]*ly.DeployResult
}

// Pair deploys fixtures identically on stock Knative and on Lampyr: the
// portability suites' one way to do it.
type Pair struct {
	Stock, Lampyr *harness.Target
	// Namespace the Services live in on both sides.
	Namespace string
	// Repo prefixes the snapshot images in Lampyr's registry.
	Repo string
	// FieldManager applies the Services.
	FieldManager string
	// Runnable is the fixture handler as a runnable image (stock runs it).
	Runnable string
	// Ly is the ly binary built from this tree.
	Ly string
	// Artifacts receives each applied manifest (service-<name>.yaml).
	Artifacts string
	// Work holds the ly build artifacts.
	Work string
	// Log receives ly's output and the waits' timings.
	Log io.Writer
}

// NewPair is the Pair of the harness's "stock" and "lampyr" targets in
// ctx, deploying into namespace ns under repo; the suite sets Runnable and
// Ly.
func NewPair(ctx context.Context, ns, repo string) (*Pair, error) {
	stock, err := harness.TargetFrom(ctx, "stock")
	if err != nil {
		return nil, err
	}
	lampyr, err := harness.TargetFrom(ctx, "lampyr")
	if err != nil {
		return nil, err
	}
	// Called from a setup step: Ginkgo removes the folder after the suite.
	work := ginkgo.GinkgoT().TempDir()
	return &Pair{Stock: stock, Lampyr: lampyr, Namespace: ns, Repo: repo, FieldManager: repo,
		Artifacts: harness.Artifacts(ctx), Work: work, Log: ginkgo.GinkgoWriter}, nil
}

// Sides are stock, then Lampyr.
func (p *Pair) Sides() []*harness.Target { return []*harness.Target{p.Stock, p.Lampyr} }

// Seal builds f as a Lampyr snapshot artifact and has `ly deploy` push it
// and seal its template for the Service's first Revision, then deletes that
// Service (and waits until it is gone), so that ApplyOnBoth creates it
// anew from the same manifest as on stock. It returns ly deploy's result.
func (p *Pair) Seal(ctx context.Context, f *Fixture) (*ly.DeployResult, error) {
	artifactDir, err := buildArtifact(ctx, p.Ly, p.Log, p.Work, f)
	if err != nil {
		return nil, err
	}
	res, err := sealOn(ctx, p.Ly, p.Log, p.Lampyr, p.Namespace, p.Repo, f, artifactDir)
	if err != nil {
		return nil, err
	}
	f.Snapshot, f.Template = res.Snapshot, res.Template
	return res, nil
}

// buildArtifact runs `ly build` for f into work/artifact-<name> and
// returns that folder.
func buildArtifact(ctx context.Context, lyBin string, log io.Writer, work string, f *Fixture) (string, error) {
	artifactDir := filepath.Join(work, "artifact-"+f.Name)
	svcDir := filepath.Join(e2eutil.RepoRoot(), f.Dir)
	if _, err := RunLy(ctx, lyBin, log, "build", svcDir, "--artifact", artifactDir); err != nil {
		return "", err
	}
	return artifactDir, nil
}

// sealOn has `ly deploy` push f's artifact to t's registry and seal its
// template on t for the Service's first Revision, then deletes that Service
// and waits until it is gone.
func sealOn(ctx context.Context, lyBin string, log io.Writer, t *harness.Target, ns, repo string, f *Fixture, artifactDir string) (*ly.DeployResult, error) {
	svcDir := filepath.Join(e2eutil.RepoRoot(), f.Dir)
	events, err := RunLy(ctx, lyBin, log, "deploy", svcDir, "--artifact", artifactDir,
		"--image", t.Registry+"/"+repo+"/"+f.Name+":snapshot",
		"--kubeconfig", t.Kubeconfig, "--namespace", ns, "--output", "json")
	if err != nil {
		return nil, err
	}
	var res ly.DeployResult
	for _, e := range events {
		if e.Event == "result" {
			raw, _ := json.Marshal(e.Fields)
			if err := json.Unmarshal(raw, &res); err != nil {
				return nil, fmt.Errorf("ly deploy's result event: %w", err)
			}
		}
	}
	if !strings.Contains(res.Template, "@sha256:") {
		return nil, fmt.Errorf("ly deploy %s on %s printed no digest-pinned template reference (result %+v)", f.Name, t.Name, res)
	}
	if _, err := RunLy(ctx, lyBin, log, "delete", f.Name, "--kubeconfig", t.Kubeconfig, "--namespace", ns); err != nil {
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := t.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, f.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return nil, fmt.Errorf("the Service %s that ly deploy made on %s is still there 2m after ly delete: %w", f.Name, t.Name, err)
	}
	return &res, nil
}

// Manifest is the one Service applied to both sides for f: the runnable
// image for stock, the sealed snapshot for Lampyr, visibility as the
// workspace says (as `ly deploy` decides it). It is written to the
// artifacts folder.
func (p *Pair) Manifest(f *Fixture) (*unstructured.Unstructured, error) {
	svc, raw, err := serviceManifest(f, p.Namespace, p.Runnable, f.Snapshot, f.Template)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(p.Artifacts, "service-"+f.Name+".yaml"), raw, 0o644); err != nil {
		return nil, err
	}
	fmt.Fprintf(p.Log, "the Service applied to both clusters:\n%s", raw)
	return svc, nil
}

// serviceManifest is f's Service as `ly deploy` makes it (visibility as
// the workspace says), and its YAML.
func serviceManifest(f *Fixture, ns, image, snapshot, template string) (*unstructured.Unstructured, []byte, error) {
	dir := filepath.Join(e2eutil.RepoRoot(), f.Dir)
	proj, err := ly.LoadProject(dir)
	if err != nil {
		return nil, nil, err
	}
	ws, _, err := ly.FindWorkspace(dir)
	if err != nil {
		return nil, nil, err
	}
	svc := ly.ServiceManifest(proj, ly.ServiceInputs{Namespace: ns, Image: image, Snapshot: snapshot, Template: template, Public: ws.Public(proj.Name)})
	raw, err := yaml.Marshal(svc.Object)
	if err != nil {
		return nil, nil, err
	}
	return svc, raw, nil
}

// ApplyOnBoth applies each fixture's Service identically to both sides,
// then waits (4 minutes each) until every one is Ready on each.
func (p *Pair) ApplyOnBoth(ctx context.Context, fs ...*Fixture) error {
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(fs))
	for _, f := range fs {
		svc, err := p.Manifest(f)
		if err != nil {
			return err
		}
		body, err := svc.MarshalJSON()
		if err != nil {
			return err
		}
		for _, s := range p.Sides() {
			force := true
			_, err := s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(p.Namespace).Patch(ctx, f.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: p.FieldManager, Force: &force})
			if err != nil {
				return fmt.Errorf("applying %s on %s: %w", f.Name, s.Name, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				_, err := s.Clients.WaitReady(ctx, e2eutil.KServices, p.Namespace, f.Name, 4*time.Minute)
				fmt.Fprintf(p.Log, "%s: Service %s Ready after %s\n", s.Name, f.Name, time.Since(t0).Round(100*time.Millisecond))
				if err != nil {
					errs <- fmt.Errorf("Service %s on %s: %w", f.Name, s.Name, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// RunLy runs the ly binary in the repository root, echoing its output to
// log, and returns its JSON events (with --output json).
func RunLy(ctx context.Context, bin string, log io.Writer, args ...string) ([]ly.Event, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = e2eutil.RepoRoot()
	cmd.Stderr = log
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var events []ly.Event
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintf(log, "ly: %s\n", line)
		var e ly.Event
		if json.Unmarshal([]byte(line), &e) == nil && e.Event != "" {
			events = append(events, e)
		}
	}
	if err := cmd.Wait(); err != nil {
		return events, fmt.Errorf("ly %s: %w", strings.Join(args, " "), err)
	}
	return events, nil
}
