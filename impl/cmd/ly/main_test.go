package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/impl/trust/seal"
)

func TestFlagHandling(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	keyFile := filepath.Join(t.TempDir(), "sealer.pem")
	t.Setenv("LAMPYR_SEALER_KEY", keyFile)
	key, err := seal.GenerateSealerKey()
	if err != nil {
		t.Fatal(err)
	}
	pub := base64.StdEncoding.EncodeToString(key.Public())
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
		{args: []string{"cluster"}, want: "usage: ly cluster install|describe|authorize-sealer", usage: true},
		{args: []string{"cluster", "frob"}, want: `unknown cluster command "frob"`, usage: true},
		{args: []string{"cluster", "install"}, want: "kubeconfig"},
		{args: []string{"cluster", "describe", "extra"}, want: "usage: ly cluster", usage: true},
		{args: []string{"cluster", "describe"}, want: "no kube context"},
		{args: []string{"cluster", "authorize-sealer"}, want: "exactly one identity NAME", usage: true},
		{args: []string{"cluster", "authorize-sealer", "alice"}, want: "needs --public-key KEY", usage: true},
		{args: []string{"cluster", "authorize-sealer", "alice", "--public-key", "nope"}, want: "--public-key: ", usage: true},
		{args: []string{"cluster", "authorize-sealer", "alice", "--public-key", pub, "--self"}, want: "give one", usage: true},
		{args: []string{"cluster", "authorize-sealer", "alice", "--public-key", pub}, want: "--namespaces is required", usage: true},
		{args: []string{"cluster", "authorize-sealer", "alice", "--public-key", pub, "--namespaces", "Team_A"}, want: `"Team_A" is not a namespace name`, usage: true},
		{args: []string{"cluster", "authorize-sealer", "alice", "--revoke", "--namespaces", "a"}, want: "--revoke removes the identity by NAME alone", usage: true},
		{args: []string{"cluster", "authorize-sealer", "alice", "--public-key", pub, "--namespaces", "a,b"}, want: "no kube context"},
		{args: []string{"cluster", "authorize-sealer", "alice", "--revoke"}, want: "no kube context"},
		{args: []string{"cluster", "rotate-fleet-key", "now"}, want: "usage: ly cluster rotate-fleet-key", usage: true},
		{args: []string{"cluster", "rotate-fleet-key"}, want: "no kube context"},
		{args: []string{"sealer"}, want: "usage: ly sealer show", usage: true},
		{args: []string{"sealer", "rotate"}, want: "usage: ly sealer show", usage: true},
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
	// None of these needed the sealer identity, so none created it.
	if _, err := os.Stat(keyFile); !os.IsNotExist(err) {
		t.Errorf("a sealer key was created by commands that do not seal: %v", err)
	}
}

// TestSealerShow: the first use creates the identity (saying so once, on
// stderr), the key id, public key and the administrator's command are
// printed, and --output json carries the same.
func TestSealerShow(t *testing.T) {
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	t.Setenv("LAMPYR_SEALER_KEY", "")
	path := filepath.Join(cfg, "lampyr", "sealer.pem")
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"sealer", "show", "-n", "team-a"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	s, err := ly.LoadSealer(path, false)
	if err != nil {
		t.Fatalf("the identity was not created at %s: %v", path, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	if lines := strings.Split(strings.TrimSpace(errb.String()), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "created sealer identity "+path) || !strings.Contains(lines[0], s.KeyID()[:12]) {
		t.Errorf("stderr %q, want one line saying the identity was created, with its key id", errb.String())
	}
	for _, want := range []string{"key id:          " + s.KeyID(), "public key:      " + s.PublicKey(), "ly cluster authorize-sealer " + ly.DefaultSealerName() + " --public-key " + s.PublicKey() + " --namespaces team-a"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	errb.Reset()
	if err := run(context.Background(), []string{"sealer", "show", "--output", "json"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if errb.Len() != 0 {
		t.Errorf("second use printed %q", errb.String())
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["keyID"] != s.KeyID() || got["publicKey"] != s.PublicKey() || got["path"] != path || !strings.Contains(got["publicKeyPEM"], "LAMPYR SEALER PUBLIC KEY") {
		t.Errorf("json %v", got)
	}
	if k, err := seal.ParseSealerPublicKey(got["publicKeyPEM"]); err != nil || !k.Equal(s.Key.Public()) {
		t.Errorf("publicKeyPEM does not parse back: %v", err)
	}
}

func TestPrintSealers(t *testing.T) {
	mine, err := ly.LoadSealer(filepath.Join(t.TempDir(), "k.pem"), true)
	if err != nil {
		t.Fatal(err)
	}
	id := mine.KeyID()
	other := strings.Repeat("e", 64)
	for _, tc := range []struct {
		name string
		mine *ly.Sealer
		rep  ly.SealersReport
		want []string
	}{
		{name: "authorized", mine: mine, rep: ly.SealersReport{Readable: true, MyKeyID: id, Sealers: []ly.ClusterSealer{{Name: "me", KeyID: id, Namespaces: []string{"team-a"}, Mine: true}, {Name: "ci", KeyID: other, Namespaces: []string{"*"}}}},
			want: []string{"me  " + id[:16] + "  namespaces team-a  (this ly)", "ci  " + other[:16] + "  every namespace", "this ly: key " + id + ", authorized for namespace team-a"}},
		{name: "listed elsewhere", mine: mine, rep: ly.SealersReport{Readable: true, MyKeyID: id, Sealers: []ly.ClusterSealer{{Name: "me", KeyID: id, Namespaces: []string{"team-b"}, Mine: true}}},
			want: []string{"not authorized for namespace team-a", "extends its entry"}},
		{name: "not listed", mine: mine, rep: ly.SealersReport{Readable: true, MyKeyID: id},
			want: []string{"not authorized: an administrator runs `ly cluster authorize-sealer", "--public-key " + mine.PublicKey()}},
		{name: "tenant", mine: mine, rep: ly.SealersReport{MyKeyID: id, Note: "readable only by administrators"},
			want: []string{"readable only by administrators", "this ly: key " + id}},
		{name: "no identity", rep: ly.SealersReport{Readable: true}, want: []string{"no sealer identity yet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printSealers(&out, "lampyr-system", "team-a", tc.mine, &tc.rep)
			for _, w := range append(tc.want, "sealer identities (ConfigMap lampyr-system/lampyr-template-sealers)") {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
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
