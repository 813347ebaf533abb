package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"lampyr.dev/serving/conformance/upstream"
	"lampyr.dev/serving/impl/install/knative"
)

// suites are the upstream conformance packages, by short name.
var suites = map[string]upstream.Suite{
	"api":     {Name: "api", Package: knative.ServingModule + "/test/conformance/api/v1", Module: knative.ServingModule, Version: knative.ServingVersion, Tags: "e2e"},
	"runtime": {Name: "runtime", Package: knative.ServingModule + "/test/conformance/runtime", Module: knative.ServingModule, Version: knative.ServingVersion, Tags: "e2e"},
	// Knative's KIngress conformance (the networking layer both profiles
	// install): one Go test running the stable tests and, with
	// -enable-beta, the beta ones (host-rewrite: what a DomainMapping's
	// KIngress asks of the gateway; headers/tags) as subtests, named as in
	// its run.go.
	"ingress": {Name: "ingress", Package: networkingModule + "/test/conformance/ingress", Module: networkingModule, Tags: "e2e",
		Root: "TestIngressConformance", Tests: []string{"basics", "basics/http2", "dispatch/path", "dispatch/path_and_percentage",
			"dispatch/percentage", "dispatch/rule", "grpc", "grpc/split", "headers/post-split", "headers/pre-split", "headers/probe",
			"hosts/multiple", "ingressclass", "retry", "timeout", "tls", "update", "visibility", "visibility/path", "visibility/split",
			"websocket", "websocket/split",
			// beta
			"host-rewrite", "headers/tags"}},
}

// runSuites runs each chosen suite with its own flags (serving's suites and
// networking's define different sets, and a test binary refuses a flag it
// does not define) and checks its results against the declarations. A
// suite that cannot run is reported as a failure and the next one runs.
func (r *runner) runSuites(ctx context.Context) error {
	o, rep, log := r.o, r.rep, r.log
	servingArgs := []string{
		"-kubeconfig=" + o.kubeconfig,
		"-dockerrepo=" + r.repo,
		"-tag=" + r.tag,
		"-imagetemplate=" + r.imageTemplate,
		"-ingressendpoint=" + o.ingressEndpoint,
		"-ingress-class=" + o.ingressClass,
		"-resolvabledomain=false",
		"-disable-logstream",
	}
	if o.extraArgs != "" {
		servingArgs = append(servingArgs, strings.Fields(o.extraArgs)...)
	}
	suiteArgs := map[string][]string{"api": servingArgs, "runtime": servingArgs, "ingress": {
		"-kubeconfig=" + o.kubeconfig,
		"-dockerrepo=" + r.netRepo,
		"-tag=" + strings.ReplaceAll(r.netVersion, "+", "_"),
		"-imagetemplate=" + r.netTemplate,
		"-ingressendpoint=" + o.ingressEndpoint,
		"-ingressClass=" + o.ingressClass,
		"-enable-beta",
	}}
	suiteEnv := []string{"GATEWAY_OVERRIDE=" + r.gwName, "GATEWAY_NAMESPACE_OVERRIDE=" + r.gwNS}
	rep.Reproduce = []string{
		fmt.Sprintf("git clone <this repository> && cd serving && git checkout %s", upstream.GitVersion(r.root)),
		"just cluster-up " + orName(o.cluster, "<cluster>") + "   # or bring your own cluster: third-party mode",
		"go run ./conformance/cmd/knative-conformance " + shellJoin(r.args),
	}
	for _, name := range strings.Split(o.suites, ",") {
		s := suites[name]
		raw, err := os.Create(filepath.Join(mkdir(o.out), name+"-go-test.json"))
		if err != nil {
			return err
		}
		inv := upstream.Invocation{Suite: s, Dir: r.root, Args: suiteArgs[name], Env: suiteEnv, Skip: r.exp.Skips(name), Run: o.run,
			Parallel: o.parallel, Timeout: o.timeout, Raw: raw, Log: log}
		rep.Reproduce = append(rep.Reproduce, "# "+name+": "+shellJoin(suiteEnv)+" "+shellJoin(inv.Command()))
		var results []upstream.Result
		start := time.Now()
		err = log.Step(fmt.Sprintf("Running %s conformance (%s) against %s", name, s.Package, orName(o.cluster, o.kubeconfig)), func() error {
			var err error
			results, err = upstream.Run(ctx, inv)
			return err
		})
		raw.Close()
		if err != nil {
			if ctx.Err() != nil {
				return exitError{code: 130, err: ctx.Err()}
			}
			rep.Suites = append(rep.Suites, upstream.SuiteReport{Suite: s, Seconds: time.Since(start).Seconds(), Result: "failure", Error: err.Error(), Command: inv.Command()})
			continue
		}
		decl := r.exp.For(name)
		if o.run != "" {
			// A selected run reports only what it ran; declarations of tests
			// it did not select are not "missing".
			for n := range decl {
				if !slices.ContainsFunc(results, func(r upstream.Result) bool { return r.Name == n }) {
					delete(decl, n)
				}
			}
		}
		results, v := upstream.Apply(name, results, decl)
		sr := upstream.NewSuiteReport(s, time.Since(start).Seconds(), results, v, inv.Command())
		if o.run != "" && sr.Result == "success" {
			sr.Result = "partial"
		}
		rep.Suites = append(rep.Suites, sr)
	}
	return nil
}
