package inputs

import (
	"context"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"lampyr.dev/serving/impl/build/gobuild"
)

const kubeadmList = `registry.k8s.io/kube-apiserver:v1.35.4
registry.k8s.io/kube-controller-manager:v1.35.4
registry.k8s.io/kube-scheduler:v1.35.4
registry.k8s.io/kube-proxy:v1.35.4
registry.k8s.io/coredns/coredns:v1.13.1
registry.k8s.io/pause:3.10.1
registry.k8s.io/etcd:3.6.6-0
`

func TestParseImageListAndPins(t *testing.T) {
	m, err := ParseImageList(kubeadmList)
	if err != nil {
		t.Fatal(err)
	}
	if m["coredns"] != "registry.k8s.io/coredns/coredns:v1.13.1" || m["pause"] != "registry.k8s.io/pause:3.10.1" {
		t.Fatalf("parsed %v", m)
	}
	if err := CheckPins(m); err != nil {
		t.Fatalf("pins must match kubeadm %s: %v", KubernetesVersion, err)
	}
	m["etcd"] = "registry.k8s.io/etcd:3.7.0-0"
	if err := CheckPins(m); err == nil || !strings.Contains(err.Error(), "EtcdModuleVersion") {
		t.Fatalf("want an error naming EtcdModuleVersion, got %v", err)
	}
	if _, err := ParseImageList("registry.k8s.io/pause:3.10.1\n"); err == nil {
		t.Fatal("a list missing components must be an error")
	}
}

func TestKubernetesLDFlags(t *testing.T) {
	f := KubernetesLDFlags("v1.35.4")
	for _, want := range []string{
		"k8s.io/component-base/version.gitVersion=v1.35.4",
		"k8s.io/component-base/version.gitMajor=1",
		"k8s.io/component-base/version.gitMinor=35",
		"k8s.io/client-go/pkg/version.gitVersion=v1.35.4",
	} {
		if !strings.Contains(f, want) {
			t.Errorf("ldflags lack %s: %s", want, f)
		}
	}
	if stagingVersion("v1.35.4") != "v0.35.4" {
		t.Errorf("stagingVersion = %s", stagingVersion("v1.35.4"))
	}
}

func TestMissingRefs(t *testing.T) {
	got := missingRefs([]string{"a:1", "b:2", "c:3"}, []string{"b:2", "sha256:x", "a:1"})
	if len(got) != 1 || got[0] != "c:3" {
		t.Errorf("missingRefs = %v, want [c:3]", got)
	}
}

// The node memo must change when any input file changes (its size, since
// paths hold cache keys) or the set of kubeadm images does, and only then.
func TestNodeMemoKey(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "kubelet")
	if err := os.WriteFile(bin, []byte("one"), 0o755); err != nil {
		t.Fatal(err)
	}
	enforcer := filepath.Join(dir, "kube-router-netpol")
	if err := os.WriteFile(enforcer, []byte("one"), 0o755); err != nil {
		t.Fatal(err)
	}
	key := func(required map[string]string) string {
		m, err := newNodeMemo(dir, "root", required, map[string]string{"etcd": bin}, map[string]string{"/usr/bin/kubelet": bin}, map[string]string{"kube-router-netpol": enforcer})
		if err != nil {
			t.Fatal(err)
		}
		return m.file
	}
	req := map[string]string{"etcd": "registry.k8s.io/etcd:3.6.6-0", "pause": "registry.k8s.io/pause:3.10.1"}
	a := key(req)
	if b := key(map[string]string{"pause": "registry.k8s.io/pause:3.10.1", "etcd": "registry.k8s.io/etcd:3.6.6-0"}); a != b {
		t.Errorf("map order changed the key: %s vs %s", a, b)
	}
	if b := key(map[string]string{"etcd": "registry.k8s.io/etcd:3.6.7-0", "pause": "registry.k8s.io/pause:3.10.1"}); a == b {
		t.Error("a different etcd image kept the key")
	}
	if err := os.WriteFile(bin, []byte("longer"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := key(req)
	if a == b {
		t.Error("a different binary kept the key")
	}
	if err := os.WriteFile(enforcer, []byte("longer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if c := key(req); c == b {
		t.Error("a different NetworkPolicy enforcer binary kept the key")
	}
	if _, ok := (&nodeMemo{file: filepath.Join(dir, "absent.json")}).load(context.Background()); ok {
		t.Error("an absent memo loaded")
	}
}

func TestCoreDNSMain(t *testing.T) {
	src := coreDNSMain([]string{"kubernetes", "forward"})
	if _, err := parser.ParseFile(token.NewFileSet(), "main.go", src, parser.ImportsOnly); err != nil {
		t.Fatalf("generated main does not parse: %v\n%s", err, src)
	}
	for _, want := range []string{`_ "github.com/coredns/coredns/plugin/kubernetes"`, `_ "github.com/coredns/coredns/plugin/forward"`, `"github.com/coredns/coredns/coremain"`, "coremain.Run()"} {
		if !strings.Contains(src, want) {
			t.Errorf("generated main lacks %s:\n%s", want, src)
		}
	}
	// kubeadm's Corefile (k8s.io/kubernetes cmd/kubeadm/app/phases/addons/dns/manifests.go),
	// by package: the prometheus directive is plugin/metrics.
	for _, p := range []string{"errors", "health", "ready", "kubernetes", "metrics", "forward", "cache", "loop", "reload", "loadbalance"} {
		if !slices.Contains(CoreDNSPlugins, p) {
			t.Errorf("CoreDNSPlugins lacks %s, which kubeadm's Corefile uses", p)
		}
	}
	if _, err := parser.ParseFile(token.NewFileSet(), "main.go", registryMain, parser.ImportsOnly); err != nil {
		t.Fatalf("registry main does not parse: %v", err)
	}
	s := CoreDNSSpec()
	if len(s.Packages) != 1 || s.Packages[0] != s.ScratchPath() || gobuild.BinaryName(s.Packages[0]) != "coredns" {
		t.Errorf("CoreDNS must build the scratch module's own main into a binary named coredns: %+v", s.Packages)
	}
}

// The enforcer's main is embedded as text (it imports kube-router, which
// this module does not require): it must parse, be gofmt-clean, and be the
// scratch module's program, stamped with the pinned version.
func TestNetworkPolicyMain(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", netpolMain, parser.ParseComments)
	if err != nil {
		t.Fatalf("enforcer main does not parse: %v", err)
	}
	if f.Name.Name != "main" {
		t.Errorf("enforcer main is package %s", f.Name.Name)
	}
	formatted, err := format.Source([]byte(netpolMain))
	if err != nil || string(formatted) != netpolMain {
		t.Errorf("netpol_main.go.txt is not gofmt-clean (err %v)", err)
	}
	var imports []string
	for _, i := range f.Imports {
		imports = append(imports, strings.Trim(i.Path.Value, `"`))
	}
	for _, want := range []string{KubeRouterModule + "/pkg/controllers/netpol", KubeRouterModule + "/pkg/healthcheck"} {
		if !slices.Contains(imports, want) {
			t.Errorf("enforcer main does not import %s", want)
		}
	}
	for _, i := range imports {
		if strings.HasPrefix(i, KubeRouterModule+"/pkg/controllers/") && !strings.HasSuffix(i, "/netpol") {
			t.Errorf("enforcer main links another kube-router controller: %s", i)
		}
	}
	s := NetworkPolicySpec()
	if len(s.Packages) != 1 || s.Packages[0] != s.ScratchPath() || gobuild.BinaryName(s.Packages[0]) != "kube-router-netpol" {
		t.Errorf("the enforcer must build the scratch module's main into kube-router-netpol: %+v", s.Packages)
	}
	if !strings.Contains(s.LDFlags, "main.kubeRouterVersion="+KubeRouterVersion) {
		t.Errorf("ldflags do not stamp the version: %s", s.LDFlags)
	}
	if s.Require["golang.org/x/net"] == "" || s.Require["k8s.io/client-go"] == "" {
		t.Errorf("the build must raise kube-router's pinned x/net and client-go: %v", s.Require)
	}
	if ref := NetworkPolicyImageRef("0123456789abcdef0123"); ref != NetworkPolicyImageRepo+":"+strings.TrimPrefix(KubeRouterVersion, "v")+"-0123456789ab" {
		t.Errorf("NetworkPolicyImageRef = %s", ref)
	}
}
