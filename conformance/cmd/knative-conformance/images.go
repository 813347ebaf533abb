package main

import (
	"context"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/impl/progress"
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

// h2cImages are the test images that serve HTTP/2 cleartext only; their
// snapshots say so (fiberd speaks the snapshot's protocol to a fiber).
var h2cImages = map[string]bool{"grpc-ping": true, "hellohttp2": true}

// publishImages builds and pushes the test images the chosen suites deploy
// (serving's for api and runtime, networking's for ingress) and, for
// Lampyr, snapshots serving's and registers the snapshots.
func (r *runner) publishImages(ctx context.Context) error {
	o := r.o
	pub := r.env.Publisher()
	r.repo = pub.Registry + "/knative-serving-test"
	if o.registry != "" {
		reg, path, _ := strings.Cut(o.registry, "/")
		pub.Registry = reg
		r.repo = strings.TrimSuffix(o.registry, "/")
		if path == "" {
			r.repo = reg + "/knative-serving-test"
		}
	}
	prefix := strings.TrimPrefix(strings.TrimPrefix(r.repo, pub.Registry), "/")
	want := map[string]bool{}
	for _, n := range strings.Split(o.suites, ",") {
		want[n] = true
	}
	// Knative Serving's test images, for the api and runtime suites.
	pushed := map[string]string{}
	var err error
	if want["api"] || want["runtime"] {
		if pushed, err = publishTestImages(ctx, pub, knative.ServingModule, knative.ServingVersion, testImages, prefix); err != nil {
			return err
		}
	}
	r.tag = strings.ReplaceAll(knative.ServingVersion, "+", "_")
	r.imageTemplate = digestTemplate(pushed)
	// knative.dev/networking's test images, for the ingress suite, from the
	// version this repository pins.
	r.netRepo = r.repo + "/networking"
	if want["ingress"] {
		if r.netVersion, err = moduleVersion(r.root, networkingModule); err != nil {
			return err
		}
		netPushed, err := publishTestImages(ctx, pub, networkingModule, r.netVersion, networkingTestImages, prefix+"/networking")
		if err != nil {
			return err
		}
		r.netTemplate = digestTemplate(netPushed)
		s := suites["ingress"]
		s.Version = r.netVersion
		suites["ingress"] = s
	}
	if len(pushed) > 0 && (o.imageSnapshots == "true" || (o.imageSnapshots == "auto" && o.implementation == "lampyr")) {
		note, err := registerSnapshots(ctx, o, pushed, r.log)
		if err != nil {
			return err
		}
		r.rep.TestConfig = append(r.rep.TestConfig, note)
	}
	return nil
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
