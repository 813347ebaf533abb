package runcwrap

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var drop = map[string]bool{"CAP_SYS_RESOURCE": true}

func TestFilterSpec(t *testing.T) {
	in := []byte(`{"ociVersion":"1.0.2","process":{"args":["/sbin/init"],"capabilities":{
		"bounding":["CAP_CHOWN","CAP_SYS_RESOURCE"],"effective":["CAP_SYS_RESOURCE"],
		"permitted":["CAP_SYS_RESOURCE","CAP_NET_ADMIN"]}}}`)
	out, changed, err := FilterSpec(in, drop)
	if err != nil || !changed {
		t.Fatalf("FilterSpec: changed=%v err=%v", changed, err)
	}
	var doc struct {
		Process struct {
			Args []string
			Caps map[string][]string `json:"capabilities"`
		}
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"bounding": {"CAP_CHOWN"}, "effective": {}, "permitted": {"CAP_NET_ADMIN"}}
	if !reflect.DeepEqual(doc.Process.Caps, want) {
		t.Fatalf("caps = %v, want %v", doc.Process.Caps, want)
	}
	if !reflect.DeepEqual(doc.Process.Args, []string{"/sbin/init"}) {
		t.Fatalf("unrelated fields changed: %v", doc.Process.Args)
	}
}

func TestFilterSpecUnchangedKeepsBytes(t *testing.T) {
	in := []byte(`{"process":{"capabilities":{"bounding":["CAP_CHOWN"]}}}`)
	out, changed, err := FilterSpec(in, drop)
	if err != nil || changed || string(out) != string(in) {
		t.Fatalf("want untouched input, got changed=%v err=%v out=%s", changed, err, out)
	}
}

func TestFilterProcessTopLevel(t *testing.T) {
	in := []byte(`{"args":["sh"],"capabilities":{"effective":["CAP_SYS_RESOURCE","CAP_KILL"]}}`)
	out, changed, err := FilterProcess(in, drop)
	if err != nil || !changed {
		t.Fatalf("FilterProcess: changed=%v err=%v", changed, err)
	}
	if string(out) != `{"args":["sh"],"capabilities":{"effective":["CAP_KILL"]}}` {
		t.Fatalf("got %s", out)
	}
}

func TestFilterRejectsGarbage(t *testing.T) {
	if _, _, err := FilterSpec([]byte("{"), drop); err == nil {
		t.Fatal("want a parse error")
	}
}

func TestFilesToFilter(t *testing.T) {
	cases := []struct {
		args            []string
		specs, processs []string
	}{
		{[]string{"--root", "/run/runc", "create", "--bundle", "/b", "id"}, []string{"/b/config.json"}, nil},
		{[]string{"run", "--bundle=/x", "id"}, []string{"/x/config.json"}, nil},
		{[]string{"run", "id"}, []string{"config.json"}, nil},
		{[]string{"--log", "/l", "exec", "--process", "/tmp/p.json", "--detach", "id"}, nil, []string{"/tmp/p.json"}},
		{[]string{"start", "id"}, nil, nil},
		{[]string{"delete", "--force", "id"}, nil, nil},
	}
	for _, c := range cases {
		specs, procs := FilesToFilter(c.args)
		if !reflect.DeepEqual(specs, c.specs) || !reflect.DeepEqual(procs, c.processs) {
			t.Errorf("FilesToFilter(%v) = %v, %v; want %v, %v", c.args, specs, procs, c.specs, c.processs)
		}
	}
}

func TestRewriteFileKeepsMode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(`{"process":{"capabilities":{"bounding":["CAP_SYS_RESOURCE"]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := RewriteFile(p, FilterSpec, drop); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	info, _ := os.Stat(p)
	if string(b) != `{"process":{"capabilities":{"bounding":[]}}}` || info.Mode().Perm() != 0o600 {
		t.Fatalf("got %s mode %v", b, info.Mode())
	}
}
