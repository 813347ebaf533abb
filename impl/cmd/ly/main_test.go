package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFlagHandling(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	svc := t.TempDir()
	if err := os.WriteFile(filepath.Join(svc, "lampyr.yaml"), []byte("name: hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		want  string
		usage bool
	}{
		{args: nil, want: "no command", usage: true},
		{args: []string{"frobnicate"}, want: `unknown command "frobnicate"`, usage: true},
		{args: []string{"deploy", svc}, want: "--image is required", usage: true},
		{args: []string{"deploy", svc, "--image", "localhost:5002/demo"}, want: "explicit tag", usage: true},
		// Flags after the directory are parsed too.
		{args: []string{"deploy", svc, "--image", "localhost:5002/demo:v1", "--traffic", "a=10"}, want: "add up to 10", usage: true},
		{args: []string{"deploy", svc, "--image", "localhost:5002/demo:v1", "--output", "xml"}, want: `--output "xml"`, usage: true},
		{args: []string{"deploy", svc, "--image", "localhost:5002/demo:v1"}, want: "no kube context"},
		{args: []string{"build", t.TempDir()}, want: "lampyr.yaml not found"},
		{args: []string{"push", svc, "--image", "localhost:5002/demo:v1"}, want: "run `ly build` first"},
		{args: []string{"scale", "hello"}, want: "needs --max", usage: true},
		{args: []string{"logs"}, want: "exactly one Service NAME", usage: true},
		{args: []string{"cluster", "frob"}, want: "usage: ly cluster install|describe", usage: true},
		{args: []string{"cluster", "install"}, want: "kubeconfig"},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), tc.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ly %v: error %v, want one containing %q", tc.args, err, tc.want)
			continue
		}
		var ue usageError
		if got := errors.As(err, &ue); got != tc.usage {
			t.Errorf("ly %v: usage error = %v, want %v (%v)", tc.args, got, tc.usage, err)
		}
	}
}

func TestScaffoldCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "svc")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"scaffold", "service", "hello", dir}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "lampyr.yaml") {
		t.Errorf("scaffold output: %s", out.String())
	}
}
