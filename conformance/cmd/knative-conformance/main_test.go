package main

import (
	"bytes"
	"testing"
	"text/template"
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
