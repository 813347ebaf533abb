package resources

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/util/validation"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

func grant(mode v1alpha1.ExecutionMode, max int32) *v1alpha1.CapacityGrant {
	return &v1alpha1.CapacityGrant{
		ObjectMeta: metav1.ObjectMeta{Name: "hello-00001", Namespace: "demo", UID: "u1"},
		Spec: v1alpha1.CapacityGrantSpec{
			RevisionName: "hello-00001", Template: "t@sha256:" + strings.Repeat("a", 64), SnapshotArtifact: "s@sha256:" + strings.Repeat("b", 64),
			MemoryPerFiber: resource.MustParse("64Mi"), MaxFibers: max, MaxRequestSeconds: 30,
			Execution: v1alpha1.ExecutionPolicy{Mode: mode, IdleTimeoutSeconds: 7, IdleAction: "release"},
			Env:       map[string]string{"K_REVISION": "hello-00001"},
		},
	}
}

func TestMakeClaims(t *testing.T) {
	cfg := config.Defaults()
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	for _, tc := range []struct {
		name     string
		g        *v1alpha1.CapacityGrant
		wantMax  int32
		wantMode string
		wantIdle int64
	}{
		{"fresh ignores idle timeout", grant(v1alpha1.ExecutionFresh, 3), 3, "fresh", 0},
		{"empty mode is fresh", grant("", 3), 3, "fresh", 0},
		{"reuse keeps idle timeout", grant(v1alpha1.ExecutionReuse, 3), 3, "reuse", 7},
		{"maxFibers 0 takes the default", grant(v1alpha1.ExecutionFresh, 0), cfg.DefaultMaxFibers, "fresh", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := MakeClaims(tc.g, cfg, signedgrant.Helper{Port: 8080}, strings.Repeat("f", 64), "id", now)
			if c.Home != HomeName(tc.g) || c.HomeKeySHA256 != strings.Repeat("f", 64) || c.Helper.Port != 8080 || c.MaxFibers != tc.wantMax || c.Execution.Mode != tc.wantMode || c.Execution.IdleTimeoutSeconds != tc.wantIdle {
				t.Fatalf("claims %+v", c)
			}
			if c.MemoryPerFiberBytes != 64<<20 || !c.ExpiresAt.Equal(now.Add(cfg.GrantTTL)) || c.Env["K_REVISION"] != "hello-00001" || c.Namespace != "demo" {
				t.Fatalf("claims %+v", c)
			}
		})
	}
}

func TestMakeHomePod(t *testing.T) {
	cfg := config.Defaults()
	cfg.HomeImage = "kind.local/fiberd@sha256:" + strings.Repeat("c", 64)
	g := grant(v1alpha1.ExecutionFresh, 4)
	p := MakeHomePod(g, cfg, "lampyr-homes", 0)
	c := p.Spec.Containers[0]
	if p.Name != HomeName(g) || p.Namespace != "lampyr-homes" || len(p.OwnerReferences) != 0 || !IsHomeOf(p, g) {
		t.Fatalf("identity %s/%s owners %v labels %v", p.Namespace, p.Name, p.OwnerReferences, p.Labels)
	}
	if *p.Spec.AutomountServiceAccountToken || *p.Spec.EnableServiceLinks {
		t.Error("no service-account token and no service links may reach a Home")
	}
	if !*c.SecurityContext.Privileged {
		t.Error("the process backend needs a privileged Home")
	}
	if got := c.Resources.Limits.Memory().String(); got != "512Mi" { // 4×64Mi + 256Mi
		t.Errorf("memory limit %s, want 512Mi", got)
	}
	// fiberd's port speaks TLS only: plain-HTTP probes would fail every Home.
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.HTTPGet.Port.IntVal != APIPort || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("readiness probe %+v", c.ReadinessProbe.HTTPGet)
	}
	if c.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("liveness probe %+v", c.LivenessProbe.HTTPGet)
	}
	if !strings.Contains(strings.Join(c.Args, " "), "--tls-key-file="+SecretMountPath+"/"+SecretKeyHomeKey) {
		t.Errorf("fiberd is not given the Home key: %v", c.Args)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--grant-file=" + SecretMountPath + "/grant", "--router-keys-file=" + SecretMountPath + "/router-keys.pub", "--helper=/lampyr-helper", "--listen=:9090"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	if len(p.Spec.InitContainers) != 0 {
		t.Error("no helper image configured, yet an init container")
	}

	if got := c.Resources.Limits.Cpu().String(); got != "1" {
		t.Errorf("CPU limit %s, want 1 (a Home must not take every core of its node)", got)
	}
	for _, want := range []string{"--fiber-cpu=1000", "--id-lock-dir=" + IDLockDir, "--max-unpacked-bytes=1073741824"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}

	cfg.HelperImage = "kind.local/helper:1"
	p = MakeHomePod(g, cfg, "lampyr-homes", 0)
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != cfg.HelperImage ||
		!strings.Contains(strings.Join(p.Spec.Containers[0].Args, " "), "--helper="+HelperMountPath+"/lampyr-helper") {
		t.Fatalf("helper image not wired: %+v", p.Spec.InitContainers)
	}
	// Every emptyDir is bounded; the id lock directory is the node's.
	hostPaths := 0
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.SizeLimit == nil {
			t.Errorf("emptyDir %s has no sizeLimit: whoever writes it can fill the node's disk", v.Name)
		}
		if v.HostPath != nil {
			hostPaths++
			if v.HostPath.Path != IDLockDir {
				t.Errorf("hostPath %s: only %s belongs in a Home", v.HostPath.Path, IDLockDir)
			}
		}
	}
	if hostPaths != 1 {
		t.Errorf("%d hostPath volumes, want the id lock directory only", hostPaths)
	}
}

func TestMakeHomeServiceAndSecret(t *testing.T) {
	g := grant(v1alpha1.ExecutionFresh, 4)
	s := MakeHomeService(g, "lampyr-homes")
	if s.Spec.Selector[contract.GrantUIDLabel] != string(g.UID) || s.Spec.Ports[0].Port != APIPort || HomeEndpoint(g, "lampyr-homes") != HomeName(g)+".lampyr-homes.svc:9090" {
		t.Fatalf("service %+v endpoint %s", s.Spec, HomeEndpoint(g, "lampyr-homes"))
	}
	pod := MakeHomePod(g, config.Defaults(), "lampyr-homes", 0)
	for k, v := range s.Spec.Selector {
		if pod.Labels[k] != v {
			t.Fatalf("Service selector %s=%s does not select the Home Pod (labels %v)", k, v, pod.Labels)
		}
	}
	key, err := NewHomeKey()
	if err != nil {
		t.Fatal(err)
	}
	sec := MakeHomeSecret(g, "lampyr-homes", []byte("g"), []byte("p"), []byte("r"), key)
	if sec.Type != corev1.SecretTypeOpaque || string(sec.Data[SecretKeyRouterPubKeys]) != "r" || len(sec.Data) != 4 || !IsHomeOf(sec, g) || sec.Namespace != "lampyr-homes" {
		t.Fatalf("secret %+v", sec)
	}
	if got, ok := HomeKeyOf(sec); !ok || got.SHA256 != key.SHA256 {
		t.Fatalf("the Secret's Home key reads back as %+v %v, want fingerprint %s", got, ok, key.SHA256)
	}
	if other, _ := NewHomeKey(); other.SHA256 == key.SHA256 {
		t.Fatal("two Homes got the same key")
	}
	delete(sec.Data, SecretKeyHomeKey)
	if _, ok := HomeKeyOf(sec); ok {
		t.Fatal("a Secret without home-key.pem has a Home key")
	}
}

// TestHomeNames: Revisions of one name in two namespaces get two Homes; a
// long name still makes a DNS label; labels lead back to the grant.
func TestHomeNames(t *testing.T) {
	a := grant(v1alpha1.ExecutionFresh, 1)
	b := a.DeepCopy()
	b.Namespace = "other"
	if HomeName(a) == HomeName(b) {
		t.Fatal("same Home name for two namespaces")
	}
	long := a.DeepCopy()
	long.Name = strings.Repeat("x", 63)
	if n := HomeName(long); len(n) > 63 || len(validation.IsDNS1035Label(n)) > 0 {
		t.Fatalf("Home name %q is not a DNS-1035 label", n)
	}
	p := MakeHomePod(a, config.Defaults(), "lampyr-homes", 0)
	if ns, name, ok := GrantKeyOf(p); !ok || ns != "demo" || name != "hello-00001" {
		t.Fatalf("GrantKeyOf = %s %s %v", ns, name, ok)
	}
	if IsHomeOf(p, b) {
		t.Fatal("another namespace's grant claims the Home")
	}
}

func TestMakeHomePodRegistryMirrors(t *testing.T) {
	cfg, err := config.FromConfigMap(&corev1.ConfigMap{Data: map[string]string{lampyrconfig.KeyHomeRegistryMirrors: "localhost:5002=kind-registry:5000"}})
	if err != nil {
		t.Fatal(err)
	}
	p := MakeHomePod(grant(v1alpha1.ExecutionFresh, 1), cfg, "lampyr-homes", 0)
	if !strings.Contains(strings.Join(p.Spec.Containers[0].Args, " "), "--registry-mirror=localhost:5002=kind-registry:5000") {
		t.Fatalf("args %v", p.Spec.Containers[0].Args)
	}
	if _, err := config.FromConfigMap(&corev1.ConfigMap{Data: map[string]string{lampyrconfig.KeyHomeRegistryMirrors: "nope"}}); err == nil || !strings.Contains(err.Error(), lampyrconfig.KeyHomeRegistryMirrors) {
		t.Fatalf("bad mirror: %v", err)
	}
}

func TestHomeEndpointOfPrefersTheReadyPod(t *testing.T) {
	g := &v1alpha1.CapacityGrant{ObjectMeta: metav1.ObjectMeta{Name: "hello-00001", Namespace: "demo"}}
	svc := HomeName(g) + ".lampyr-homes.svc:9090"
	ready := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"no Pod yet", nil, svc},
		{"Pod without an IP", &corev1.Pod{Status: corev1.PodStatus{Conditions: ready}}, svc},
		{"Pod not Ready", &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.244.0.7"}}, svc},
		// reconcilePod passes a Pod being deleted only while it hands over
		// (Ready, its replacement not yet): it serves until then.
		{"Pod being deleted, handing over", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{PodIP: "10.244.0.7", Conditions: ready}}, "10.244.0.7:9090"},
		{"Pod being deleted, draining", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{PodIP: "10.244.0.7"}}, svc},
		{"Ready Pod", &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.244.0.7", Conditions: ready}}, "10.244.0.7:9090"},
		{"Ready IPv6 Pod", &corev1.Pod{Status: corev1.PodStatus{PodIP: "fd00::7", Conditions: ready}}, "[fd00::7]:9090"},
	} {
		if got := HomeEndpointOf(g, "lampyr-homes", tc.pod); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
