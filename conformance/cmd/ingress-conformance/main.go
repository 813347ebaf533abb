// Command ingress-conformance runs Knative's KIngress conformance suite
// against a cluster created by `just cluster-up` and writes a per-subtest
// report (JSON and Markdown) with the reason for every failure and skip.
//
//	ingress-conformance --cluster stock --provider traefik --out _artifacts/ingress-conformance
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/build/gobuild"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/networking"
	"lampyr.dev/serving/clusters/progress"
	"lampyr.dev/serving/clusters/publish"
	"lampyr.dev/serving/conformance/upstream"
)

// testImages are the images the suite deploys (networking test/test_images).
var testImages = []string{"runtime", "httpproxy", "timeout", "wsserver", "grpc-ping", "retry"}

// Result is one subtest's outcome.
type Result struct {
	Name    string  `json:"name"`
	Outcome string  `json:"outcome"` // pass, fail, skip
	Seconds float64 `json:"seconds"`
	// Reason is the skip message or the tail of a failure's output.
	Reason string `json:"reason,omitempty"`
}

// Report is what the run writes.
type Report struct {
	Suite             string    `json:"suite"`
	NetworkingVersion string    `json:"networkingVersion"`
	Cluster           string    `json:"cluster"`
	Provider          string    `json:"provider"`
	IngressClass      string    `json:"ingressClass"`
	Started           time.Time `json:"started"`
	Seconds           float64   `json:"seconds"`
	Results           []Result  `json:"results"`
	Passed            int       `json:"passed"`
	Failed            int       `json:"failed"`
	Skipped           int       `json:"skipped"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// networkingVersion is the knative.dev/networking version this repository
// pins (the one knative.dev/serving v0.50.0 requires): the suite and its
// test images must come from the same version.
func networkingVersion() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "knative.dev/networking")
	cmd.Dir = e2eutil.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m knative.dev/networking: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func run(ctx context.Context) error {
	cluster := flag.String("cluster", "stock", "cluster created by `just cluster-up`")
	provider := flag.String("provider", "traefik", "networking provider installed on the cluster")
	out := flag.String("out", filepath.Join(e2eutil.ArtifactsDir(), "ingress-conformance"), "report directory")
	skip := flag.String("skip", "", "comma-separated subtests to skip (recorded in the report as skipped by request)")
	flag.Parse()

	log := progress.New(os.Stderr)
	env := clusters.NewEnv(log)
	info, err := env.Manager().ReadInfo(*cluster)
	if err != nil {
		return err
	}
	prov, err := networking.Get(*provider)
	if err != nil {
		return err
	}
	version, err := networkingVersion()
	if err != nil {
		return err
	}
	c, err := e2eutil.NewClients(info.Kubeconfig)
	if err != nil {
		return err
	}
	spec := gobuild.Spec{Name: "knative-networking-test-images", Module: "knative.dev/networking", Version: version, LDFlags: "-s -w"}
	var imgs []publish.Image
	for _, n := range testImages {
		pkg := "knative.dev/networking/test/test_images/" + n
		spec.Packages = append(spec.Packages, pkg)
		imgs = append(imgs, publish.Image{Package: pkg, Repo: "knative-networking-test/" + n})
	}
	pub := env.Publisher()
	if _, err := pub.Publish(ctx, spec, imgs); err != nil {
		return err
	}
	_, err = c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "serving-tests"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	rep := Report{Suite: "knative.dev/networking/test/conformance/ingress", NetworkingVersion: version, Cluster: *cluster,
		Provider: *provider, IngressClass: prov.IngressClass(), Started: time.Now()}
	args := []string{"test", "-json", "-count=1", "-timeout=60m", "./conformance/ingress/", "-run", "^TestIngressConformance$", "-args",
		"-kubeconfig=" + info.Kubeconfig, "-ingressClass=" + prov.IngressClass(), "-ingressendpoint=127.0.0.1",
		"-dockerrepo=" + pub.Registry + "/knative-networking-test", "-tag=" + strings.ReplaceAll(version, "+", "_")}
	if *skip != "" {
		args = append(args, "-skip-tests="+*skip)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = e2eutil.RepoRoot()
	cmd.Env = append(os.Environ(), "LAMPYR_E2E=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	raw, err := os.Create(filepath.Join(*out, "go-test.json"))
	if err != nil {
		return err
	}
	defer raw.Close()
	log.Printf(" • running %d stable ingress conformance subtests against %s (%s)", 22, *cluster, prov.IngressClass())
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	results := parse(io.TeeReader(stdout, raw), log, *skip)
	waitErr := cmd.Wait()
	rep.Seconds = time.Since(start).Seconds()
	rep.Results = results
	for _, r := range results {
		switch r.Outcome {
		case "pass":
			rep.Passed++
		case "fail":
			rep.Failed++
		case "skip":
			rep.Skipped++
		}
	}
	if len(results) == 0 {
		return fmt.Errorf("the suite reported no subtest (go test: %v); see %s", waitErr, raw.Name())
	}
	if err := write(*out, rep); err != nil {
		return err
	}
	fmt.Printf("ingress conformance on %s (%s): %d passed, %d failed, %d skipped\n", *cluster, *provider, rep.Passed, rep.Failed, rep.Skipped)
	fmt.Printf("report: %s\n", filepath.Join(*out, "report.md"))
	return nil
}

type event struct {
	Action, Test, Output string
	Elapsed              float64
}

// parse reads `go test -json` and returns one Result per subtest of
// TestIngressConformance, keeping each subtest's output for its reason.
func parse(r io.Reader, log *progress.Log, requested string) []Result {
	outputs := map[string]*strings.Builder{}
	var results []Result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		name, ok := strings.CutPrefix(e.Test, "TestIngressConformance/")
		if !ok {
			continue
		}
		top := strings.SplitN(name, "/", 2)[0]
		if strings.Contains(name, "/") && !isStable(name) {
			// a nested subtest: its output belongs to its parent
			if b := outputs[top]; b != nil && e.Action == "output" {
				b.WriteString(e.Output)
			}
			continue
		}
		switch e.Action {
		case "run":
			outputs[name] = &strings.Builder{}
		case "output":
			if b := outputs[name]; b != nil {
				b.WriteString(e.Output)
			}
		case "pass", "fail", "skip":
			res := Result{Name: name, Outcome: e.Action, Seconds: e.Elapsed}
			if e.Action != "pass" {
				res.Reason = upstream.Reason(outputs[name].String(), e.Action)
				if e.Action == "skip" && strings.Contains(","+requested+",", ","+name+",") {
					res.Reason = "skipped by request (--skip): " + res.Reason
				}
			}
			log.Printf("   %-4s %-30s %5.1fs %s", e.Action, name, e.Elapsed, upstream.Cause(res.Reason))
			results = append(results, res)
		}
	}
	sort.Slice(results, func(i, j int) bool { return results[i].Name < results[j].Name })
	return results
}

// isStable tells the suite's own subtest names ("dispatch/path") from
// subtests they start.
func isStable(name string) bool {
	switch name {
	case "basics/http2", "grpc/split", "headers/pre-split", "headers/post-split", "headers/probe", "headers/tags",
		"hosts/multiple", "dispatch/path", "dispatch/percentage", "dispatch/path_and_percentage", "dispatch/rule",
		"visibility/split", "visibility/path", "websocket/split":
		return true
	}
	return false
}

func write(dir string, rep Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644); err != nil {
		return err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# Knative ingress conformance: %s (%s)\n\n", rep.Cluster, rep.IngressClass)
	fmt.Fprintf(&md, "Suite `%s` at knative.dev/networking %s, %s, %.0fs.\n\n", rep.Suite, rep.NetworkingVersion, rep.Started.UTC().Format(time.RFC3339), rep.Seconds)
	fmt.Fprintf(&md, "**%d passed, %d failed, %d skipped**\n\n| subtest | outcome | seconds | reason |\n|---|---|---|---|\n", rep.Passed, rep.Failed, rep.Skipped)
	for _, r := range rep.Results {
		fmt.Fprintf(&md, "| %s | %s | %.1f | %s |\n", r.Name, r.Outcome, r.Seconds, strings.ReplaceAll(upstream.Cause(r.Reason), "|", "\\|"))
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(md.String()), 0o644)
}
