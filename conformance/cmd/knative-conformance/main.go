// Command knative-conformance runs Knative's own conformance suites
// (knative.dev/serving/test/conformance/api/v1 and .../runtime, and
// knative.dev/networking/test/conformance/ingress, compiled with -tags=e2e
// from the versions this repository pins) against a cluster, checks
// every result against the implementation's declared expectations, and
// writes a ConformanceReport (report.yaml), JUnit and a Markdown summary.
//
// Managed mode, on a cluster `just cluster-up` created:
//
//	knative-conformance --cluster stock --out _artifacts/conformance/stock
//
// Third-party mode, on any cluster running Knative Serving:
//
//	knative-conformance --kubeconfig ~/.kube/config --gateway-service traefik/traefik \
//	    --ingress-endpoint 127.0.0.1 --ingress-class traefik.ingress.networking.knative.dev \
//	    --registry registry.example.com/knative-test --implementation my-knative --version 1.2.3 \
//	    --expectations my-expectations.yaml --out report/
//
// The suites' test images are built from knative.dev/serving/test/test_images
// and knative.dev/networking/test/test_images and pushed to --registry
// (networking's under .../networking/), which the cluster must be able to
// pull from.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/conformance/upstream"
	"lampyr.dev/serving/impl/progress"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// run is a conformance run: the flags, then a short list of named steps,
// each printed with its duration (impl/progress), in the order they
// depend on each other. It returns the process exit code: 2 for a mistake
// the user fixes (flags, a cluster that is not set up), 130 when
// interrupted, 1 for any other failure and for a failed conformance result.
func run(ctx context.Context, args []string) (int, error) {
	o, err := parseFlags(args)
	if err != nil {
		return 2, err
	}
	log := progress.New(os.Stderr)
	r := &runner{o: o, args: args, log: log, env: clusters.NewEnv(log, environ.Clusters()), root: e2eutil.RepoRoot(),
		rep: &upstream.Report{Date: time.Now().UTC(), Mode: "managed"}}
	for _, s := range r.steps() {
		if err := log.Step(s.name, func() error { return s.run(ctx) }); err != nil {
			var ce exitError
			if errors.As(err, &ce) {
				return ce.code, ce.err
			}
			return 1, err
		}
	}
	if r.rep.Result == "failure" {
		return 1, fmt.Errorf("conformance %s: see %s", r.rep.Result, filepath.Join(o.out, "report.md"))
	}
	return 0, nil
}

// A step is one named part of a run (kind's create actions: small, named,
// timed).
type step struct {
	name string
	run  func(context.Context) error
}

func (r *runner) steps() []step {
	return []step{
		{"Resolving the implementation, cluster and expectations", r.resolveTarget}, // target.go
		{"Checking that the cluster answers", r.checkCluster},                       // target.go
		{"Publishing the suites' test images", r.publishImages},                     // images.go
		{"Preparing the cluster for the suites", r.prepareCluster},                  // prepare.go
		{"Running the suites", r.runSuites},                                         // suites.go
		{"Writing the report", r.writeReport},                                       // report.go
	}
}

// runner is the state the steps hand on to each other.
type runner struct {
	o    *options
	args []string
	log  *progress.Log
	env  *clusters.Env
	root string
	rep  *upstream.Report

	// Set by resolveTarget.
	profile      string // the managed cluster's profile (stock, lampyr); "" in third-party mode
	gwNS, gwName string
	exp          *upstream.Expectations
	// Set by checkCluster.
	c *e2eutil.Clients
	// Set by publishImages: the suites' -dockerrepo, -tag and
	// -imagetemplate, for serving's suites and networking's.
	repo, tag, imageTemplate         string
	netVersion, netRepo, netTemplate string
}

// exitError is an error with its exit code (2: the user fixes it; 130:
// interrupted).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// usageError is a mistake in the flags or the cluster's setup (exit code 2).
func usageError(err error) error { return exitError{code: 2, err: err} }

// shellJoin quotes what a POSIX shell would split or expand, so the
// report's Reproduce lines can be pasted.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"$`\\|&;<>(){}[]*?!#~") {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

func orName(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func mkdir(d string) string {
	_ = os.MkdirAll(d, 0o755)
	return d
}
