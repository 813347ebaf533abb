package nodeimage

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseDepends(t *testing.T) {
	got := ParseDepends("libc6 (>= 2.34), libnftnl11 (>= 1.1.6) | libfoo, , netbase:any,")
	want := []string{"libc6", "libnftnl11", "netbase"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseDepends = %v, want %v", got, want)
	}
}

func TestCanonicalPath(t *testing.T) {
	merged := map[string]bool{"bin": true, "sbin": true, "lib": true, "lib64": true}
	cases := map[string]string{
		"/sbin/xtables-nft-multi":         "/usr/sbin/xtables-nft-multi",
		"/lib/x86_64-linux-gnu/libc.so.6": "/usr/lib/x86_64-linux-gnu/libc.so.6",
		"/lib64":                          "/usr/lib64",
		"/usr/sbin/conntrack":             "/usr/sbin/conntrack",
		"/libexec/x":                      "/libexec/x",
		"/etc/ethertypes":                 "/etc/ethertypes",
	}
	for in, want := range cases {
		if got := CanonicalPath(in, merged); got != want {
			t.Errorf("CanonicalPath(%s) = %s, want %s", in, got, want)
		}
	}
	if got := CanonicalPath("/bin/sh", nil); got != "/bin/sh" {
		t.Errorf("a non-merged root must keep /bin, got %s", got)
	}
}

func TestPatchContainerdConfig(t *testing.T) {
	in := "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.10\"\n  restrict_oom_score_adj = false\n"
	out, err := PatchContainerdConfig(in, "registry.k8s.io/pause:3.10.1", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`sandbox_image = "registry.k8s.io/pause:3.10.1"`, "restrict_oom_score_adj = true", `config_path = "/etc/containerd/certs.d"`} {
		if !strings.Contains(out, want) {
			t.Errorf("patched config lacks %q:\n%s", want, out)
		}
	}
	if _, err := PatchContainerdConfig("version = 2\n", "p", false); err == nil {
		t.Error("a config without sandbox_image must be refused, not silently left unpatched")
	}
	kept, err := PatchContainerdConfig(in, "p:1", false)
	if err != nil || !strings.Contains(kept, "restrict_oom_score_adj = false") {
		t.Errorf("restrictOOM=false must keep the setting: %v\n%s", err, kept)
	}
}
