package resources

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/config"
)

const homeImage = "registry.example/lampyr/home@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func egressOwners() []*v1alpha1.CapacityGrant {
	b := grant(v1alpha1.ExecutionFresh, 1)
	b.Name, b.UID = "zeta-00001", "u2"
	return []*v1alpha1.CapacityGrant{b, grant(v1alpha1.ExecutionFresh, 1)}
}

// The egress Pod passes Pod Security `restricted` as the API server's
// admission evaluates it, so tenant namespaces can enforce that level.
func TestMakeEgressPodRestricted(t *testing.T) {
	cfg := config.Defaults()
	cfg.HomeImage = homeImage
	p := MakeEgressPod("demo", egressOwners(), cfg, []byte("-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----\n"))
	ev, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	restricted := func(p *corev1.Pod) (refusals []string) {
		for _, r := range ev.EvaluatePod(api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}, &p.ObjectMeta, &p.Spec) {
			if !r.Allowed {
				refusals = append(refusals, r.ForbiddenReason+": "+r.ForbiddenDetail)
			}
		}
		return refusals
	}
	if r := restricted(p); len(r) > 0 {
		t.Errorf("Pod Security restricted refuses the egress Pod: %v", r)
	}
	// The evaluator does refuse each setting's absence.
	for name, undo := range map[string]func(*corev1.Pod){
		"seccomp":    func(p *corev1.Pod) { p.Spec.SecurityContext.SeccompProfile = nil },
		"escalation": func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil },
		"drop ALL":   func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.Capabilities = nil },
		"non-root": func(p *corev1.Pod) {
			p.Spec.SecurityContext.RunAsNonRoot, p.Spec.Containers[0].SecurityContext.RunAsNonRoot = nil, nil
		},
	} {
		q := p.DeepCopy()
		undo(q)
		if len(restricted(q)) == 0 {
			t.Errorf("without %s the egress Pod still passes restricted: the check is blind", name)
		}
	}
	c := p.Spec.Containers[0]
	if p.Name != contract.EgressName || p.Namespace != "demo" || c.Image != homeImage || !slices.Equal(c.Command, []string{"/fiberd", "egress-proxy"}) {
		t.Errorf("pod %s/%s image %s command %v", p.Namespace, p.Name, c.Image, c.Command)
	}
	if *p.Spec.SecurityContext.RunAsUser != 65532 || *p.Spec.AutomountServiceAccountToken || len(p.Spec.Volumes) != 0 {
		t.Errorf("security: %+v token %v volumes %v", p.Spec.SecurityContext, *p.Spec.AutomountServiceAccountToken, p.Spec.Volumes)
	}
	if c.Resources.Limits.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().MilliValue() != 10 || c.Resources.Requests.Memory().String() != "32Mi" {
		t.Errorf("resources %+v (a quota on limits.cpu/limits.memory needs limits)", c.Resources)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if env[contract.EgressNamespaceEnv].ValueFrom.FieldRef.FieldPath != "metadata.namespace" || !strings.Contains(env[contract.EgressGrantKeyEnv].Value, "PUBLIC KEY") {
		t.Errorf("env %+v", c.Env)
	}
	// Every grant of the namespace owns it, in a stable order.
	if refs := p.OwnerReferences; len(refs) != 2 || refs[0].Name != "hello-00001" || refs[1].UID != "u2" || refs[0].Kind != "CapacityGrant" || refs[0].APIVersion != "fiberd.io/v1alpha1" {
		t.Errorf("owner references %+v", refs)
	}
	if !IsEgressObject(p) {
		t.Error("IsEgressObject(the egress Pod) = false")
	}
	if IsEgressObject(&metav1.ObjectMeta{Labels: map[string]string{ComponentKey: contract.EgressComponent}}) {
		t.Error("an object with the component label alone (a tenant's) counts as the grant controller's")
	}
}

// Only the namespace's own Homes reach the proxy port.
func TestMakeEgressNetworkPolicy(t *testing.T) {
	np := MakeEgressNetworkPolicy("demo", "lampyr-homes", egressOwners())
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || len(np.Spec.Ingress[0].Ports) != 1 {
		t.Fatalf("spec %+v", np.Spec)
	}
	from, port := np.Spec.Ingress[0].From[0], np.Spec.Ingress[0].Ports[0]
	if from.NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != "lampyr-homes" ||
		from.PodSelector.MatchLabels[contract.GrantNamespaceLabel] != "demo" || from.PodSelector.MatchLabels[ComponentKey] != Component {
		t.Errorf("from %+v", from)
	}
	if port.Port.IntValue() != contract.EgressProxyPort || *port.Protocol != corev1.ProtocolTCP {
		t.Errorf("port %+v", port)
	}
	if np.Spec.PodSelector.MatchLabels[ComponentKey] != contract.EgressComponent || np.Spec.PolicyTypes[0] != "Ingress" {
		t.Errorf("selects %+v types %v", np.Spec.PodSelector, np.Spec.PolicyTypes)
	}
	svc := MakeEgressService("demo", egressOwners())
	if svc.Spec.Selector[ComponentKey] != contract.EgressComponent || svc.Spec.Ports[0].Port != contract.EgressProxyPort {
		t.Errorf("service %+v", svc.Spec)
	}
}

// MakeHomePod tells fiberd how its fibers' connections leave.
func TestMakeHomePodEgressDial(t *testing.T) {
	for mode, want := range map[string][]string{
		lampyrconfig.EgressCluster: {"--egress-dial=proxy", "--egress-api=http://lampyr-grant-controller.lampyr-system.svc:8092"},
		lampyrconfig.EgressDirect:  {"--egress-dial=direct"},
		lampyrconfig.EgressOff:     nil,
	} {
		cfg := config.Defaults()
		cfg.Egress = mode
		cfg.EgressAllow = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
		args := MakeHomePod(grant(v1alpha1.ExecutionFresh, 1), cfg, "lampyr-homes", 0).Spec.Containers[0].Args
		var got []string
		for _, a := range args {
			if strings.HasPrefix(a, "--egress-dial=") || strings.HasPrefix(a, "--egress-api=") {
				got = append(got, a)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("fiber-egress %s: %v, want %v", mode, got, want)
		}
	}
}

// MakeHomePod tells fiberd which backend runs its fibers (config-lampyr
// fiber-backend, fiber-gvisor-preinit); the process backend is fiberd's
// default and gets no flag.
func TestMakeHomePodFiberBackend(t *testing.T) {
	for _, c := range []struct {
		backend string
		preinit bool
		want    []string
	}{
		{lampyrconfig.BackendProcess, true, nil},
		{lampyrconfig.BackendGVisor, true, []string{"--backend=gvisor", "--runsc=/runsc", "--gvisor-preinit=true"}},
		{lampyrconfig.BackendGVisor, false, []string{"--backend=gvisor", "--runsc=/runsc", "--gvisor-preinit=false"}},
	} {
		cfg := config.Defaults()
		cfg.FiberBackend, cfg.FiberGVisorPreinit = c.backend, c.preinit
		var got []string
		for _, a := range MakeHomePod(grant(v1alpha1.ExecutionFresh, 1), cfg, "lampyr-homes", 0).Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--backend=") || strings.HasPrefix(a, "--runsc=") || strings.HasPrefix(a, "--gvisor-") {
				got = append(got, a)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("fiber-backend %s, preinit %v: %v, want %v", c.backend, c.preinit, got, c.want)
		}
	}
}
