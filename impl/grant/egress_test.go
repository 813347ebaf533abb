package grant

import (
	"context"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
)

func TestEgressDefaultsFromTheCluster(t *testing.T) {
	kube := fake.NewSimpleClientset(
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"}}},
	)
	cfg, err := config.FromConfigMap(&corev1.ConfigMap{Data: map[string]string{lampyrconfig.KeyFiberEgressDenyCIDRs: "10.96.7.7"}})
	if err != nil {
		t.Fatal(err)
	}
	var logged []string
	(&clusterRanges{kube: kube}).withEgressDefaults(context.Background(), cfg, func(f string, a ...any) { logged = append(logged, f) })
	if want := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}; !reflect.DeepEqual(cfg.EgressAllow, want) {
		t.Errorf("allow %v, want %v", cfg.EgressAllow, want)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.96.7.7/32"), netip.MustParsePrefix("10.96.0.1/32")}; !reflect.DeepEqual(cfg.EgressDeny, want) {
		t.Errorf("deny %v, want %v", cfg.EgressDeny, want)
	}
	if len(logged) != 0 {
		t.Errorf("logged %v", logged)
	}
	g := &v1alpha1.CapacityGrant{ObjectMeta: metav1.ObjectMeta{Name: "hello-00001", Namespace: "team-a"}}
	pod := resources.MakeHomePod(g, cfg, contract.HomesNamespace, 0)
	args := map[string]bool{}
	for _, a := range pod.Spec.Containers[0].Args {
		args[a] = true
	}
	for _, want := range []string{"--egress=cluster", "--egress-allow=10.96.0.0/16", "--egress-deny=10.96.7.7/32,10.96.0.1/32", "--egress-namespace=team-a", "--egress-domains=svc.cluster.local"} {
		if !args[want] {
			t.Errorf("Home args lack %s: %v", want, pod.Spec.Containers[0].Args)
		}
	}
	if len(pod.Spec.Containers[0].Env) != 2 {
		t.Errorf("Home env %v, want POD_IP and HOST_IP", pod.Spec.Containers[0].Env)
	}
}

func TestEgressOffWithoutServiceCIDRs(t *testing.T) {
	cfg, _ := config.FromConfigMap(nil)
	var logged []string
	r := &clusterRanges{kube: fake.NewSimpleClientset()}
	for i := 0; i < 3; i++ {
		c := *cfg
		r.withEgressDefaults(context.Background(), &c, func(f string, a ...any) { logged = append(logged, f) })
		if len(c.EgressAllow) != 0 {
			t.Fatalf("allow %v without ServiceCIDRs", c.EgressAllow)
		}
		pod := resources.MakeHomePod(&v1alpha1.CapacityGrant{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "y"}}, &c, contract.HomesNamespace, 0)
		for _, a := range pod.Spec.Containers[0].Args {
			if a == "--egress=cluster" {
				t.Fatal("Home runs egress without allowed ranges")
			}
		}
	}
	if len(logged) != 1 {
		t.Errorf("logged %d times, want once a minute: %v", len(logged), logged)
	}
	if _, err := config.FromConfigMap(&corev1.ConfigMap{Data: map[string]string{lampyrconfig.KeyFiberEgress: "on"}}); err == nil {
		t.Error("fiber-egress: on accepted")
	}
	if _, err := config.FromConfigMap(&corev1.ConfigMap{Data: map[string]string{lampyrconfig.KeyFiberEgressAllowCIDRs: "10.96.0.0/33"}}); err == nil {
		t.Error("a bad CIDR accepted")
	}
}
