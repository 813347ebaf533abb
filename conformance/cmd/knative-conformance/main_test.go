package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/template"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/conformance/upstream"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/progress"
)

func TestDigestTemplateNamesEachImageByDigest(t *testing.T) {
	tpl := template.Must(template.New("image").Parse(digestTemplate(map[string]string{
		"knative.dev/serving/test/test_images/helloworld":                      "localhost:5002/knative-serving-test/helloworld@sha256:aa",
		"knative.dev/serving/test/test_images/multicontainer/servingcontainer": "localhost:5002/knative-serving-test/servingcontainer@sha256:bb",
	})))
	for name, want := range map[string]string{
		"helloworld":        "localhost:5002/knative-serving-test/helloworld@sha256:aa",
		"servingcontainer":  "localhost:5002/knative-serving-test/servingcontainer@sha256:bb",
		"invalidhelloworld": "localhost:5002/knative-serving-test/invalidhelloworld:v0.50.0",
	} {
		var b bytes.Buffer
		// The fields knative.dev/pkg/test.ImagePath gives the template.
		if err := tpl.Execute(&b, struct{ Repository, Name, Tag string }{"localhost:5002/knative-serving-test", name, "v0.50.0"}); err != nil {
			t.Fatal(err)
		}
		if b.String() != want {
			t.Errorf("%s: %q, want %q", name, b.String(), want)
		}
	}
}

func TestFlagsNameTheFix(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "say which cluster"},
		{[]string{"--cluster", "stock", "--kubeconfig", "k"}, "two modes"},
		{[]string{"--kubeconfig", "k"}, "--gateway-service"},
		{[]string{"--cluster", "stock", "--suites", "api,nope"}, `unknown suite "nope"`},
	} {
		_, err := parseFlags(tc.args)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestShellJoinQuotesWhatAShellWouldSplit(t *testing.T) {
	got := shellJoin([]string{"go", "test", "-run=TestA|TestB", "-imagetemplate={{if eq .Name \"x\"}}a{{end}}", "it's"})
	want := `go test '-run=TestA|TestB' '-imagetemplate={{if eq .Name "x"}}a{{end}}' 'it'\''s'`
	if got != want {
		t.Errorf("shellJoin:\n got %s\nwant %s", got, want)
	}
}

// TestThirdPartyTarget: in third-party mode nothing is inferred from a
// cluster name; the gateway, class and report directory come from the flags
// (and the provider), and an unnamed implementation is the user's to fix.
func TestThirdPartyTarget(t *testing.T) {
	t.Setenv("LAMPYR_ARTIFACTS", t.TempDir())
	newRunner := func(args ...string) *runner {
		t.Helper()
		o, err := parseFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		log := progress.New(io.Discard)
		return &runner{o: o, args: args, log: log, env: clusters.NewEnv(log, environ.Clusters()), root: e2eutil.RepoRoot(), rep: &upstream.Report{Mode: "managed"}}
	}
	base := []string{"--kubeconfig", "/nonexistent", "--gateway-service", "traefik/traefik", "--provider", "traefik-knative"}
	err := newRunner(base...).resolveTarget(context.Background())
	var ce exitError
	if !errors.As(err, &ce) || ce.code != 2 || !strings.Contains(err.Error(), "--implementation") {
		t.Errorf("no --implementation in third-party mode: %v, want exit code 2 naming --implementation", err)
	}
	r := newRunner(append(base, "--implementation", "my-knative")...)
	if err := r.resolveTarget(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.rep.Mode != "third-party" || r.gwNS != "traefik" || r.gwName != "traefik" || r.profile != "" {
		t.Errorf("mode %q gateway %s/%s profile %q, want third-party traefik/traefik and no profile", r.rep.Mode, r.gwNS, r.gwName, r.profile)
	}
	if r.o.ingressClass != "traefik.ingress.networking.knative.dev" || r.o.version != knative.ServingVersion || r.exp != nil {
		t.Errorf("class %q version %q expectations %v: want the provider's class, Serving's version, none declared", r.o.ingressClass, r.o.version, r.exp)
	}
	if want := filepath.Join(os.Getenv("LAMPYR_ARTIFACTS"), "conformance", "my-knative"); r.o.out != want {
		t.Errorf("report directory %s, want %s", r.o.out, want)
	}
}
