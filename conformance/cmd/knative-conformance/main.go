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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/apply"
	"lampyr.dev/serving/clusters/build/gobuild"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/install"
	"lampyr.dev/serving/clusters/knative"
	"lampyr.dev/serving/clusters/manifest"
	"lampyr.dev/serving/clusters/networking"
	"lampyr.dev/serving/clusters/progress"
	"lampyr.dev/serving/clusters/publish"
	"lampyr.dev/serving/conformance/upstream"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/ly"
)

// testImages are the knative.dev/serving/test/test_images packages the
// conformance suites deploy (test/conformance.go names them; the image name
// is the package's last element, as ko names them).
var testImages = []string{
	"autoscale", "configmimic", "failing", "grpc-ping", "hellohttp2", "hellovolume", "helloworld", "httpproxy",
	"multicontainer/servingcontainer", "multicontainer/sidecarcontainer", "pizzaplanetv1", "pizzaplanetv2",
	"readiness", "runtime", "singlethreaded", "slowstart", "timeout", "volumes", "wsserver",
}

// networkingTestImages are the knative.dev/networking/test/test_images
// packages the ingress suite deploys (as plain Pods and Services).
var networkingTestImages = []string{"grpc-ping", "httpproxy", "retry", "runtime", "timeout", "wsserver"}

// networkingModule's version is the one serving pins (go.mod): the ingress
// suite and its test images come from it.
const networkingModule = "knative.dev/networking"

// suites are the upstream conformance packages, by short name.
var suites = map[string]upstream.Suite{
	"api":     {Name: "api", Package: knative.ServingModule + "/test/conformance/api/v1", Module: knative.ServingModule, Version: knative.ServingVersion, Tags: "e2e"},
	"runtime": {Name: "runtime", Package: knative.ServingModule + "/test/conformance/runtime", Module: knative.ServingModule, Version: knative.ServingVersion, Tags: "e2e"},
	// Knative's KIngress conformance (the networking layer both profiles
	// install): one Go test running the stable tests as subtests, named
	// as in its run.go.
	"ingress": {Name: "ingress", Package: networkingModule + "/test/conformance/ingress", Module: networkingModule, Tags: "e2e",
		Root: "TestIngressConformance", Tests: []string{"basics", "basics/http2", "dispatch/path", "dispatch/path_and_percentage",
			"dispatch/percentage", "dispatch/rule", "grpc", "grpc/split", "headers/post-split", "headers/pre-split", "headers/probe",
			"hosts/multiple", "ingressclass", "retry", "timeout", "tls", "update", "visibility", "visibility/path", "visibility/split",
			"websocket", "websocket/split"}},
}

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

type options struct {
	cluster, kubeconfig, gatewayService, ingressEndpoint, ingressClass, provider string
	registry, implementation, version, expectations, out, suites, reference      string
	parallel                                                                     int
	timeout                                                                      time.Duration
	extraArgs, run                                                               string
	// imageSnapshots: "auto" (on for Lampyr), "true" or "false".
	imageSnapshots string
	// lampyrConfig: config-lampyr settings for the run on a managed Lampyr
	// cluster (key=value,...).
	lampyrConfig string
}

// h2cImages are the test images that serve HTTP/2 cleartext only; their
// snapshots say so (fiberd speaks the snapshot's protocol to a fiber).
var h2cImages = map[string]bool{"grpc-ping": true, "hellohttp2": true}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("knative-conformance", flag.ContinueOnError)
	fs.StringVar(&o.cluster, "cluster", "", "managed mode: a cluster created by `just cluster-up` (stock, lampyr)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "third-party mode: the cluster's kubeconfig")
	fs.StringVar(&o.gatewayService, "gateway-service", "", "third-party mode: namespace/name of the Service in front of the KIngress implementation (its port 80 NodePort is dialled)")
	fs.StringVar(&o.ingressEndpoint, "ingress-endpoint", "127.0.0.1", "address that reaches the gateway Service's node ports")
	fs.StringVar(&o.ingressClass, "ingress-class", "", "the KIngress class (default: the --provider's)")
	fs.StringVar(&o.provider, "provider", "", "networking provider installed on the cluster ("+strings.Join(networking.Names(), ", ")+"; default: on a managed cluster the one installed there, else from "+clusters.EnvNetworking+", else "+networking.Default+")")
	fs.StringVar(&o.registry, "registry", "", "where the test images are pushed, as registry/path (default: localhost:5002, the local registry)")
	fs.StringVar(&o.implementation, "implementation", "", "name of the implementation under test (default: from the cluster's profile)")
	fs.StringVar(&o.version, "version", "", "its version (default: Knative Serving's pinned version, or this checkout's for Lampyr)")
	fs.StringVar(&o.expectations, "expectations", "", "declared expectations (default: conformance/expectations/<profile>-<provider>.yaml)")
	fs.StringVar(&o.out, "out", "", "report directory (default: $LAMPYR_ARTIFACTS/conformance/<cluster>)")
	fs.StringVar(&o.suites, "suites", "api,runtime,ingress", "comma-separated suites: api, runtime (Knative Serving's), ingress (Knative networking's KIngress suite)")
	fs.StringVar(&o.reference, "reference", "", "a reference report.yaml (stock) to compare with, written as side-by-side.md")
	fs.IntVar(&o.parallel, "parallel", 4, "parallel tests within a suite (go test -parallel)")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Minute, "per-suite go test timeout")
	fs.StringVar(&o.run, "run", "", "only the tests matching this go test -run pattern (the report is then partial; the ingress suite's tests are TestIngressConformance/<name>)")
	fs.StringVar(&o.extraArgs, "suite-args", "", "extra space-separated flags for the api and runtime suites (e.g. -disable-optional-api)")
	fs.StringVar(&o.imageSnapshots, "image-snapshots", "auto", "snapshot each test image and register it in config-lampyr image-snapshots, so the suites' image-only Services run on Lampyr (auto: when the implementation is lampyr)")
	fs.StringVar(&o.lampyrConfig, "lampyr-config", "default-memory-per-fiber=64Mi,fiber-memory-capacity=16Gi", "managed Lampyr clusters: config-lampyr settings for the run, key=value,... (the suites keep many Revisions alive at once, and send 200 concurrent requests to one; the test images need far less than the default 256Mi per fiber)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch o.imageSnapshots {
	case "auto", "true", "false":
	default:
		return nil, fmt.Errorf("--image-snapshots %q: want auto, true or false", o.imageSnapshots)
	}
	switch {
	case o.cluster == "" && o.kubeconfig == "":
		return nil, errors.New("say which cluster: --cluster NAME (created by `just cluster-up`) or --kubeconfig PATH with --gateway-service NS/NAME (third-party mode)")
	case o.cluster != "" && o.kubeconfig != "":
		return nil, errors.New("--cluster and --kubeconfig are two modes: give one")
	case o.kubeconfig != "" && !strings.Contains(o.gatewayService, "/"):
		return nil, fmt.Errorf("--gateway-service %q: third-party mode needs the gateway Service as namespace/name (e.g. traefik/traefik, kourier-system/kourier)", o.gatewayService)
	}
	for _, s := range strings.Split(o.suites, ",") {
		if _, ok := suites[s]; !ok {
			return nil, fmt.Errorf("--suites: unknown suite %q (known: api, runtime, ingress)", s)
		}
	}
	return o, nil
}

func run(ctx context.Context, args []string) (int, error) {
	o, err := parseFlags(args)
	if err != nil {
		return 2, err
	}
	log := progress.New(os.Stderr)
	env := clusters.NewEnv(log)
	root := e2eutil.RepoRoot()
	rep := &upstream.Report{Date: time.Now().UTC(), Mode: "managed"}
	profile := ""
	gwNS, gwName := "", ""
	if o.cluster != "" && o.provider == "" {
		// Managed mode: test what the cluster runs.
		info, err := env.Manager().ReadInfo(o.cluster)
		if err != nil {
			return 2, err
		}
		c, err := e2eutil.NewClients(info.Kubeconfig)
		if err != nil {
			return 2, err
		}
		installed, err := install.InstalledProvider(ctx, c)
		if err != nil {
			return 2, err
		}
		if installed != nil {
			o.provider = installed.Name()
		}
	}
	if o.provider == "" {
		o.provider = clusters.Networking()
	}
	prov, err := networking.Get(o.provider)
	if err != nil {
		return 2, err
	}
	o.provider = prov.Name()
	if o.ingressClass == "" {
		o.ingressClass = prov.IngressClass()
	}
	if o.cluster != "" {
		info, err := env.Manager().ReadInfo(o.cluster)
		if err != nil {
			return 2, err
		}
		o.kubeconfig = info.Kubeconfig
		profile = clusters.ProfileFor(o.cluster)
		gw := prov.Gateway(info.Gateway().NodePort)
		gwNS, gwName = gw.Namespace, gw.Service
		if info.Gateway().HostPort != info.Gateway().NodePort {
			return 2, fmt.Errorf("cluster %s publishes its gateway NodePort %d on host port %d: the suites dial the NodePort itself, so use a cluster whose ports match (stock, lampyr)", o.cluster, info.Gateway().NodePort, info.Gateway().HostPort)
		}
		rep.Cluster = upstream.Cluster{Name: o.cluster, Gateway: fmt.Sprintf("%s:%d (%s/%s)", o.ingressEndpoint, gw.NodePort, gwNS, gwName)}
	} else {
		rep.Mode = "third-party"
		gwNS, gwName, _ = strings.Cut(o.gatewayService, "/")
		rep.Cluster = upstream.Cluster{Kubeconfig: o.kubeconfig, Gateway: fmt.Sprintf("%s (%s/%s)", o.ingressEndpoint, gwNS, gwName)}
	}
	if o.implementation == "" {
		switch profile {
		case "lampyr":
			o.implementation = "lampyr"
		case "stock":
			o.implementation = "knative-serving"
		default:
			return 2, errors.New("--implementation: name the implementation under test (no cluster profile to infer it from)")
		}
	}
	if o.version == "" {
		o.version = knative.ServingVersion
		if profile == "lampyr" {
			o.version = gitVersion(root)
		}
	}
	if o.expectations == "" && profile != "" {
		o.expectations = filepath.Join(root, "conformance", "expectations", profile+"-"+o.provider+".yaml")
		if _, err := os.Stat(o.expectations); errors.Is(err, os.ErrNotExist) {
			// A provider's first run: nothing is declared, so every failure
			// is undeclared and the run fails, but its report is what the
			// declarations are written from.
			log.Printf("warning: no declared expectations for %s on %s (%s does not exist): every failure counts as undeclared; write that file from this run's report", profile, o.provider, o.expectations)
			o.expectations = ""
		}
	}
	var exp *upstream.Expectations
	if o.expectations != "" {
		if exp, err = upstream.LoadExpectations(o.expectations); err != nil {
			return 2, err
		}
		rep.Claimed, rep.Unsupported = exp.Claimed, exp.Unsupported
	}
	if o.out == "" {
		o.out = filepath.Join(e2eutil.ArtifactsDir(), "conformance", orName(o.cluster, o.implementation))
	}
	rep.Implementation = upstream.Implementation{Name: o.implementation, Version: o.version, Networking: fmt.Sprintf("%s: %s (class %s)", o.provider, prov.Describe(), o.ingressClass)}
	if rep.Implementation.Name == "lampyr" {
		rep.Implementation.URL = "https://lampyr.dev/serving"
	}

	c, err := e2eutil.NewClients(o.kubeconfig)
	if err != nil {
		return 2, err
	}
	if v, err := c.Kube.Discovery().ServerVersion(); err == nil {
		rep.Cluster.KubernetesVersion = v.GitVersion
	} else {
		return 1, fmt.Errorf("cluster at %s does not answer: %w", o.kubeconfig, err)
	}
	if nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		rep.Cluster.Nodes = len(nodes.Items)
	}
	if _, err := c.Kube.CoreV1().Services(gwNS).Get(ctx, gwName, metav1.GetOptions{}); err != nil {
		return 2, fmt.Errorf("gateway Service %s/%s: %w (is Knative Serving installed with %s?)", gwNS, gwName, err, o.provider)
	}
	host, _ := os.Hostname()
	rep.Cluster.Host = host

	// The suites' test images.
	pub := env.Publisher()
	repo := pub.Registry + "/knative-serving-test"
	if o.registry != "" {
		reg, path, _ := strings.Cut(o.registry, "/")
		pub.Registry = reg
		repo = strings.TrimSuffix(o.registry, "/")
		if path == "" {
			repo = reg + "/knative-serving-test"
		}
	}
	prefix := strings.TrimPrefix(strings.TrimPrefix(repo, pub.Registry), "/")
	want := map[string]bool{}
	for _, n := range strings.Split(o.suites, ",") {
		want[n] = true
	}
	// Knative Serving's test images, for the api and runtime suites.
	pushed := map[string]string{}
	if want["api"] || want["runtime"] {
		if pushed, err = publishTestImages(ctx, pub, knative.ServingModule, knative.ServingVersion, testImages, prefix); err != nil {
			return 1, err
		}
	}
	tag := strings.ReplaceAll(knative.ServingVersion, "+", "_")
	imageTemplate := digestTemplate(pushed)
	// knative.dev/networking's test images, for the ingress suite, from the
	// version this repository pins.
	netVersion, netRepo, netTemplate := "", repo+"/networking", ""
	if want["ingress"] {
		if netVersion, err = moduleVersion(root, networkingModule); err != nil {
			return 1, err
		}
		netPushed, err := publishTestImages(ctx, pub, networkingModule, netVersion, networkingTestImages, prefix+"/networking")
		if err != nil {
			return 1, err
		}
		netTemplate = digestTemplate(netPushed)
		s := suites["ingress"]
		s.Version = netVersion
		suites["ingress"] = s
	}
	if len(pushed) > 0 && (o.imageSnapshots == "true" || (o.imageSnapshots == "auto" && o.implementation == "lampyr")) {
		note, err := registerSnapshots(ctx, o, pushed, log)
		if err != nil {
			return 1, err
		}
		rep.TestConfig = append(rep.TestConfig, note)
	}
	if o.cluster != "" && profile == "lampyr" && o.lampyrConfig != "" {
		data := map[string]string{}
		for _, kv := range strings.Split(o.lampyrConfig, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || k == "" {
				return 2, fmt.Errorf("--lampyr-config %q: want key=value,... (e.g. default-memory-per-fiber=64Mi)", kv)
			}
			data[k] = v
		}
		patch, _ := json.Marshal(map[string]any{"data": data})
		if _, err := c.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Patch(ctx, contract.ConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "knative-conformance"}); err != nil {
			return 1, fmt.Errorf("setting config-lampyr %s: %w", o.lampyrConfig, err)
		}
		rep.TestConfig = append(rep.TestConfig, "lampyr-system/config-lampyr "+o.lampyrConfig+" (the suites keep many Revisions alive at once and send 200 concurrent requests to one; the test images need far less than 256Mi per fiber)")
		log.Printf(" ✓ config-lampyr %s for the run", o.lampyrConfig)
	}

	// The namespaces, ConfigMap and Secret the suites expect (upstream's
	// test/config, read from the pinned module).
	if err := applyTestResources(ctx, c, log); err != nil {
		return 1, err
	}
	// Upstream's own test installation (test/config/ytt/core) shortens
	// config-deployment's progress-deadline to 120s: with the 600s default
	// a crashing Revision is not failed before the suites' 10-minute poll
	// ends (TestContainerExitingMsg). Managed clusters get the same; a
	// third-party cluster is told.
	if o.cluster != "" {
		patch := []byte(`{"data":{"progress-deadline":"120s"}}`)
		if _, err := c.Kube.CoreV1().ConfigMaps("knative-serving").Patch(ctx, "config-deployment", types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "knative-conformance"}); err != nil {
			return 1, fmt.Errorf("setting config-deployment progress-deadline to upstream's test value: %w", err)
		}
		rep.TestConfig = append(rep.TestConfig, "knative-serving/config-deployment progress-deadline: 120s (upstream test/config/ytt/core/overlay-config-deployment.yaml)")
		log.Printf(" ✓ config-deployment progress-deadline: 120s, as upstream's test installation sets it")
	} else {
		log.Printf(" • upstream's test installation sets config-deployment progress-deadline: 120s; with the 600s default TestContainerExitingMsg times out")
	}

	// Each suite's flags: serving's suites and networking's define
	// different sets, and a test binary refuses a flag it does not define.
	servingArgs := []string{
		"-kubeconfig=" + o.kubeconfig,
		"-dockerrepo=" + repo,
		"-tag=" + tag,
		"-imagetemplate=" + imageTemplate,
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
		"-dockerrepo=" + netRepo,
		"-tag=" + strings.ReplaceAll(netVersion, "+", "_"),
		"-imagetemplate=" + netTemplate,
		"-ingressendpoint=" + o.ingressEndpoint,
		"-ingressClass=" + o.ingressClass,
	}}
	suiteEnv := []string{"GATEWAY_OVERRIDE=" + gwName, "GATEWAY_NAMESPACE_OVERRIDE=" + gwNS}
	rep.Reproduce = []string{
		fmt.Sprintf("git clone <this repository> && cd serving && git checkout %s", gitVersion(root)),
		"just cluster-up " + orName(o.cluster, "<cluster>") + "   # or bring your own cluster: third-party mode",
		"go run ./conformance/cmd/knative-conformance " + shellJoin(args),
	}
	for _, name := range strings.Split(o.suites, ",") {
		s := suites[name]
		raw, err := os.Create(filepath.Join(mkdir(o.out), name+"-go-test.json"))
		if err != nil {
			return 1, err
		}
		inv := upstream.Invocation{Suite: s, Dir: root, Args: suiteArgs[name], Env: suiteEnv, Skip: exp.Skips(name), Run: o.run,
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
				return 130, ctx.Err()
			}
			rep.Suites = append(rep.Suites, upstream.SuiteReport{Suite: s, Seconds: time.Since(start).Seconds(), Result: "failure", Error: err.Error(), Command: inv.Command()})
			continue
		}
		decl := exp.For(name)
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
	rep.Finish()
	if err := rep.Write(o.out); err != nil {
		return 1, err
	}
	for _, s := range rep.Suites {
		st := s.Statistics
		fmt.Printf("%s %s: %s: %d passed, %d failed, %d expected failures, %d skipped (%.0fs)\n", o.implementation, s.Suite.Name, s.Result, st.Passed, st.Failed, st.ExpectedFailures, st.Skipped, s.Seconds)
		for _, u := range s.Undeclared {
			fmt.Printf("  undeclared failure: %s\n", u)
		}
		for _, u := range s.UnexpectedPasses {
			fmt.Printf("  declared to fail, passed (remove the declaration): %s\n", u)
		}
		for _, u := range s.MissingDeclared {
			fmt.Printf("  declared, but the suite has no such test: %s\n", u)
		}
	}
	fmt.Printf("report: %s (%s)\n", filepath.Join(o.out, "report.yaml"), rep.Result)
	if o.reference != "" {
		ref, err := readReport(o.reference)
		if err != nil {
			return 1, err
		}
		side := upstream.SideBySide(ref, rep)
		if err := os.WriteFile(filepath.Join(o.out, "side-by-side.md"), []byte(side), 0o644); err != nil {
			return 1, err
		}
		fmt.Printf("side by side with %s: %s\n", o.reference, filepath.Join(o.out, "side-by-side.md"))
	}
	if rep.Result == "failure" {
		return 1, fmt.Errorf("conformance %s: see %s", rep.Result, filepath.Join(o.out, "report.md"))
	}
	return 0, nil
}

// registerSnapshots makes a Lampyr snapshot artifact of each test image just
// pushed (ly image-snapshot) and maps the image digests to them in
// config-lampyr image-snapshots: the suites create Services that carry only
// an image, and Lampyr runs such a Revision from its image's snapshot.
func registerSnapshots(ctx context.Context, o *options, pushed map[string]string, log *progress.Log) (string, error) {
	var snaps []*ly.ImageSnapshot
	err := log.Step(fmt.Sprintf("Snapshotting %d test images for Lampyr (ly image-snapshot --register)", len(pushed)), func() error {
		pkgs := make([]string, 0, len(pushed))
		for p := range pushed {
			pkgs = append(pkgs, p)
		}
		slices.Sort(pkgs)
		for _, p := range pkgs {
			proto := "http1"
			if h2cImages[path.Base(p)] {
				proto = "h2c"
			}
			s, err := ly.SnapshotImage(ctx, pushed[p], ly.ImageSnapshotOptions{Protocol: proto})
			if err != nil {
				return err
			}
			snaps = append(snaps, s)
		}
		cl, err := ly.Connect(o.kubeconfig, "")
		if err != nil {
			return err
		}
		return ly.RegisterImageSnapshots(ctx, cl, snaps)
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("lampyr-system/config-lampyr image-snapshots: the %d test images mapped to snapshot artifacts made from them (ly image-snapshot; port 8080, h2c for grpc-ping and hellohttp2)", len(snaps)), nil
}

// digestTemplate is the suites' -imagetemplate (a text/template over
// Repository, Name and Tag) naming each test image by the digest just
// pushed. Knative resolves a tag to a digest from inside the controller Pod,
// where the host's localhost:5002 is not the registry; by digest there is
// nothing to resolve, and the suites' own digest check (ImageDigest in the
// image's repository) still runs. Names the build does not know (the
// suites' deliberately missing "invalidhelloworld") keep the tag form.
func digestTemplate(pushed map[string]string) string {
	pkgs := make([]string, 0, len(pushed))
	for p := range pushed {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	var b strings.Builder
	for i, p := range pkgs {
		if i > 0 {
			b.WriteString("{{else ")
		} else {
			b.WriteString("{{")
		}
		fmt.Fprintf(&b, "if eq .Name %q}}%s", filepath.Base(p), pushed[p])
	}
	if len(pkgs) > 0 {
		b.WriteString("{{else}}")
	}
	b.WriteString("{{.Repository}}/{{.Name}}:{{.Tag}}")
	if len(pkgs) > 0 {
		b.WriteString("{{end}}")
	}
	return b.String()
}

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

// publishTestImages builds a Knative module's test/test_images packages at
// version and pushes each to <prefix>/<last path element>, returning the
// pushed digests by package.
func publishTestImages(ctx context.Context, pub *publish.Publisher, module, version string, names []string, prefix string) (map[string]string, error) {
	spec := gobuild.Spec{Name: "knative-" + path.Base(module) + "-test-images", Module: module, Version: version, LDFlags: "-s -w"}
	var imgs []publish.Image
	for _, n := range names {
		pkg := module + "/test/test_images/" + n
		spec.Packages = append(spec.Packages, pkg)
		imgs = append(imgs, publish.Image{Package: pkg, Repo: prefix + "/" + path.Base(n)})
	}
	return pub.Publish(ctx, spec, imgs)
}

// moduleVersion is the version of a module the repository's go.mod selects.
func moduleVersion(root, module string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", module)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func gitVersion(root string) string {
	cmd := exec.Command("git", "describe", "--always", "--dirty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
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

func readReport(path string) (*upstream.Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r upstream.Report
	if err := yaml.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}
